#!/usr/bin/env bash
# The cuda-checkpoint compatible mode (bin/cuda-checkpoint -> cuda-criu, and `cuda-criu compat`): its
# output and exit codes, then CRIU's own CUDA plugin (lib/criu-intree/cuda_plugin.so) dumping and
# restoring a fake-GPU workload through it: the in-tree baseline the benchmarks compare against.
source "$(dirname "$0")/lib.sh"
e2e_strict_setup
start_fake_gpu --gpus 2

CKPT=$BUILD_DIR/bin/cuda-checkpoint
[ -L "$CKPT" ] && [ "$(readlink "$CKPT")" = cuda-criu ] || fail "no bin/cuda-checkpoint link to cuda-criu"
ck() { LD_LIBRARY_PATH=$(dirname "$FAKE_LIB") "$CKPT" "$@"; }
# expect_state PID STATE: --get-state prints exactly STATE and a newline.
expect_state() {
	ck --get-state --pid "$1" >"$T/state" 2>"$T/state.err" || fail "--get-state --pid $1 failed: $(cat "$T/state.err")"
	[ "$(od -An -c "$T/state" | tr -s ' ')" = "$(printf '%s\n' "$2" | od -An -c | tr -s ' ')" ] ||
		fail "--get-state printed '$(cat "$T/state")', expected '$2\\n'"
}

start_memcheck w 32
pid=$LAST_PID

# 1. Help: exit 0 and "--action" in it (CRIU's plugin probes `cuda-checkpoint -h` for that).
for h in -h --help; do
	ck $h >"$T/help" || fail "cuda-checkpoint $h failed"
	grep -q -- "--action" "$T/help" || fail "cuda-checkpoint $h does not mention --action"
done
cuda_criu compat --help | grep -q -- "--get-restore-tid" || fail "cuda-criu compat --help"
log "help: ok"

# 2. Queries: the state, and the restore thread (the workload's "cuda-restore" thread).
expect_state "$pid" running
ck --get-restore-tid --pid "$pid" >"$T/tid" || fail "--get-restore-tid failed"
grep -qxE '[0-9]+' "$T/tid" || fail "--get-restore-tid printed '$(cat "$T/tid")'"
[ "$(cat "/proc/$pid/task/$(cat "$T/tid")/comm")" = cuda-restore ] || fail "--get-restore-tid: not the restore thread"
expect_state "$(cat "$T/tid")" running # CRIU's plugin asks by restore tid
log "--get-state, --get-restore-tid: ok"

# 3. --action, each step; silent on success.
for step in "lock locked" "checkpoint checkpointed" "restore locked" "unlock running"; do
	set -- $step
	expect_rc 0 ck --action "$1" --pid "$pid" --timeout 5000
	[ ! -s "$T/out" ] && [ ! -s "$T/err" ] || fail "--action $1 printed something: $(cat "$T/out" "$T/err")"
	expect_state "$pid" "$2"
done
expect_healthy "$STATE"
log "--action lock/checkpoint/restore/unlock: ok"

# 4. --toggle: running -> checkpointed -> running, the second time onto the other GPU.
cuda_criu check --json --criu "$CRIU" --libdir "$PLUGIN_DIR" >"$T/check.json"
set -- $(python3 -c "import json,sys; print(' '.join(g['uuid'] for g in json.load(sys.stdin)['gpus']))" <"$T/check.json")
expect_rc 0 ck --toggle --pid "$pid"
expect_state "$pid" checkpointed
expect_rc 0 ck --toggle --pid "$pid" --device-map "$1=$2"
expect_state "$pid" running
ls -l "/proc/$pid/fd" | grep -q "$FAKEGPU_DIR/dev/nvidia1\$" || fail "--toggle --device-map: not on GPU 1"
expect_healthy "$STATE"
log "--toggle both ways, with a device map: ok"

# 5. Failures: non-zero, a message on stderr, nothing on stdout.
expect_rc 1 ck --action checkpoint --pid "$pid"
[ ! -s "$T/out" ] && grep -q "CUDA_ERROR_ILLEGAL_STATE" "$T/err" || fail "checkpoint of a running process: $(cat "$T/err")"
expect_rc 1 ck --get-restore-tid --pid $$
grep -q "not a CUDA process" "$T/err" || fail "restore tid of a plain process: $(cat "$T/err")"
ck --action lock --pid "$pid" >/dev/null
expect_rc 1 ck --toggle --pid "$pid"
grep -q "the process is locked" "$T/err" || fail "toggle of a locked process: $(cat "$T/err")"
ck --action unlock --pid "$pid" >/dev/null
expect_rc 2 ck --action frobnicate --pid "$pid"
expect_rc 2 ck --action lock
expect_rc 2 ck --get-state --toggle --pid "$pid"
expect_rc 2 ck --action lock --pid "$pid" --timeout 1.5
expect_rc 2 ck --action lock --pid "$pid" --device-map "$1=$2"
expect_rc 2 ck
expect_state "$pid" running
log "failures and usage errors: ok"

# 6. CRIU's own CUDA plugin on top of cuda-checkpoint = cuda-criu: dump and restore.
# A plugin directory with only the in-tree plugin; our bin/ first in CRIU's PATH; the plugin forced on
# (CRIU_FAULT=138: no /proc/driver/nvidia on CI).
CRIU_ROOT=$(cd "$(dirname "$CRIU")/.." && pwd)
mkdir -p "$T/intree"
cp "$CRIU_ROOT/lib/criu-intree/cuda_plugin.so" "$T/intree/"
intree_criu() { PATH=$BUILD_DIR/bin:$PATH CRIU_FAULT=138 "$CRIU" "$@"; }
before=$(state_value "$STATE" iterations)
mkdir -p "$T/img"
intree_criu dump -t "$pid" -D "$T/img" -L "$T/intree" -v4 -o dump.log || { cp "$T/img/dump.log" "$T/"; fail "in-tree dump failed"; }
cp "$T/img/dump.log" "$T/dump.log"
wait_gone "$pid"
expect_log "$T/dump.log" "cuda_plugin: pausing devices on pid $pid" "the in-tree plugin did not lock the process"
expect_log "$T/dump.log" "cuda_plugin: Checkpointing CUDA devices on pid $pid restore_tid [0-9]+" \
	"the in-tree plugin did not checkpoint the process"
grep -q "Error.*cuda_plugin" "$T/dump.log" && fail "errors in the in-tree dump log: $(grep Error "$T/dump.log")"
[ ! -e "$T/img/cuda-plugin.img" ] || fail "the in-tree plugin wrote our image file"
intree_criu restore -D "$T/img" -d -L "$T/intree" -v4 -o restore.log || { cp "$T/img/restore.log" "$T/"; fail "in-tree restore failed"; }
cp "$T/img/restore.log" "$T/restore.log"
expect_log "$T/restore.log" "cuda_plugin: resuming devices on pid $pid" "the in-tree plugin did not restore the process"
alive "$pid" || fail "pid $pid not running after the in-tree restore"
expect_state "$pid" running
expect_healthy "$STATE"
[ "$(state_value "$STATE" iterations)" -gt "$before" ] || fail "no progress after the in-tree restore"
log "CRIU's in-tree plugin dumps and restores through our cuda-checkpoint: ok"

# 7. Images of the in-tree plugin restore with ours. Ours restore with the in-tree plugin when the GPU state
#    is in CRIU's pages images (gpu-image=criu); by default our plugin holds it (docs/gpu-image.md), and
#    the in-tree plugin is refused by name (CRIU's inventory lists the GPU image), never restoring zeros.
rm -rf "$T/img"; mkdir -p "$T/img"
intree_criu dump -t "$pid" -D "$T/img" -L "$T/intree" -v4 -o dump.log || fail "in-tree dump (for ours) failed"
wait_gone "$pid"
restore "$T/img" || fail "our plugin could not restore an image of the in-tree plugin"
expect_summary "$T/restore.log" restore 1 "our restore summary"
expect_healthy "$STATE"
rm -rf "$T/img"; mkdir -p "$T/img"
dump "$pid" "$T/img" || fail "our dump (for the in-tree plugin) failed"
wait_gone "$pid"
[ -e "$T/img/cuda-gpu.img" ] || fail "our dump holds no GPU image of the plugin"
if intree_criu restore -D "$T/img" -d -L "$T/intree" -v4 -o restore.log; then
	fail "the in-tree plugin restored an image whose GPU state our plugin holds"
fi
expect_log "$T/img/restore.log" "Missing required plugin: cuda-gpu-image" "the in-tree plugin's refusal does not name the GPU image"
wait_gone "$pid"
restore "$T/img" || fail "our plugin could not restore its image after the in-tree plugin refused it"
expect_healthy "$STATE"
rm -rf "$T/img"; mkdir -p "$T/img"
CUDA_CRIU_GPU_IMAGE=criu dump "$pid" "$T/img" || fail "our dump with gpu-image=criu failed"
wait_gone "$pid"
intree_criu restore -D "$T/img" -d -L "$T/intree" -v4 -o restore.log || { cp "$T/img/restore.log" "$T/"; fail "the in-tree plugin could not restore our gpu-image=criu image"; }
expect_state "$pid" running
expect_healthy "$STATE"
log "in-tree image restored by ours; ours refused by the in-tree plugin by name, and restored with gpu-image=criu: ok"
log PASS
