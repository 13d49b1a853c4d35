#!/usr/bin/env bash
# Restoring onto other GPUs and refusing clearly where the image cannot run: explicit device map,
# automatic remap onto the same model, a tree spread over two GPUs, and refusals (wrong model, no GPU,
# too little total or free memory) that leave no process running. The fake GPU has 2 GPUs; CRIU is shown "another
# machine" through the fake's FAKEGPU_VISIBLE / FAKEGPU_MODEL / FAKEGPU_MEM view.
source "$(dirname "$0")/lib.sh"
e2e_setup
start_fake_gpu --gpus 2

# 1. Explicit map by index: checkpointed on GPU 0, restored onto GPU 1.
dump_one map --device 0
cuda_criu inspect "$img" >"$T/inspect-map.txt" || fail "map: inspect failed"
grep -qE "^GPU 1: GPU-.* \(no process held it\)$" "$T/inspect-map.txt" ||
	fail "map: the image does not record the GPU no process held: $(cat "$T/inspect-map.txt")"
CUDA_CRIU_DEVICE_MAP=0=1 restore "$img" || fail "map: restore failed"
expect_log "$T/restore.log" "restoring with GPU pairs: .*device map" "map: no remap line"
# The driver wants every GPU it knew of paired: GPU 1, which no process held, goes onto GPU 0.
expect_log "$T/restore.log" "restoring with GPU pairs: .*\(device map\), GPU-[0-9a-f-]+ -> GPU-[0-9a-f-]+ \(held by no process\)" \
	"map: the GPU no process held is not paired"
expect_healthy "$STATE"
[ "$(gpus_of "$pid")" = dev/nvidia1 ] || fail "map: process is on '$(gpus_of "$pid")', not GPU 1"
kill -9 "$pid"; wait_gone "$pid"
log "device map 0=1: restored onto GPU 1, data intact"

# 2. Automatic: the image's GPU 0 is absent, a GPU of the same model is there.
dump_one auto --device 0
FAKEGPU_VISIBLE=1 restore "$img" || fail "auto: restore failed"
expect_log "$T/restore.log" "restoring with GPU pairs: .*automatic: same model" "auto: no automatic remap"
# CRIU sees only GPU 1, now taken: the GPU no process held has no partner, and the log says so.
expect_log "$T/restore.log" "held by no process, left unpaired" "auto: the unpaired GPU is not reported"
expect_healthy "$STATE"
[ "$(gpus_of "$pid")" = dev/nvidia1 ] || fail "auto: process is on '$(gpus_of "$pid")'"
kill -9 "$pid"; wait_gone "$pid"
log "automatic remap onto the same model: ok"

# 3. A tree over two GPUs, restored with the two GPUs swapped.
want_child=1 dump_one tree --device 0 --children 1 --child-device 1
child_state=$STATE.0
cuda_criu inspect "$img" | grep -q "^GPU 1:" || fail "tree: image does not list both GPUs"
CUDA_CRIU_DEVICE_MAP=0=1,1=0 restore "$img" || fail "tree: restore failed"
expect_healthy "$STATE"
expect_healthy "$child_state"
child=$(state_value "$child_state" pid)
[ "$(gpus_of "$pid")" = dev/nvidia1 ] && [ "$(gpus_of "$child")" = dev/nvidia0 ] ||
	fail "tree: GPUs after the swap: root '$(gpus_of "$pid")', child '$(gpus_of "$child")'"
kill -9 "$pid" "$child"; wait_gone "$pid" "$child"
log "tree on two GPUs, swapped on restore: ok"

# 4. Refusals: the restore fails before any process resumes, says why, and nothing is left running.
refuse() { # NAME PATTERN ENV...
	local name=$1 pattern=$2
	shift 2
	dump_one "$name" --device 0
	if env "$@" "$CRIU" restore -D "$img" -d -L "$PLUGIN_DIR" -v4 -o restore.log 2>/dev/null; then
		fail "$name: restore succeeded"
	fi
	cp "$img/restore.log" "$T/restore.log"
	expect_log "$T/restore.log" "Error \(cuda_plugin\): .*$pattern" "$name: refusal not explained"
	wait_for "$name: no restored process" 10 sh -c "! [ -e /proc/$pid ] || grep -q '^State:.*Z' /proc/$pid/status"
	log "$name: refused: $(grep -oE "Error \(cuda_plugin\): .*" "$T/restore.log" | head -n1 | cut -c1-160)"
}
refuse wrong-model "needs 1 x NVIDIA Fake H200" FAKEGPU_VISIBLE=1 FAKEGPU_MODEL="NVIDIA Fake A100"
refuse no-gpu "this machine has no free GPU of that model \(GPUs here: none\)" FAKEGPU_VISIBLE=
refuse small-gpu "has 1.0 MiB of memory; the processes restored onto it need" FAKEGPU_MEM=1048576
refuse bad-map "device map: GPU 7 is not on this machine" CUDA_CRIU_DEVICE_MAP=0=7
# Free memory through NVML (the fake one, found by CRIU through LD_LIBRARY_PATH, says 1 MiB is free).
refuse no-room "GPU 0 \(GPU-[0-9a-f-]+, NVIDIA Fake H200\) has 1.0 MiB free now \(of 16.0 GiB\); the processes restored onto it need" \
	LD_LIBRARY_PATH="$FAKE_NVML_DIR" FAKENVML_FREE=1048576
log PASS
