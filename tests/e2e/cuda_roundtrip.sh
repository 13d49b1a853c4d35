#!/usr/bin/env bash
# CUDA processes (fake GPU) dumped and restored with real CRIU: one process, a tree of three CUDA
# processes and a plain one, an image without our file (as CRIU's own plugin writes), and CRIU 4.1.1.
source "$(dirname "$0")/lib.sh"
e2e_setup
start_fake_gpu

# 1. One process: its device memory comes back intact and it carries on.
start_memcheck single 64
pid=$LAST_PID
dump "$pid" "$T/img1" || fail "dump of one CUDA process failed"
wait_gone "$pid"
expect_summary "$T/dump.log" dump 1 "no dump summary"
[ -z "$(plugin_errors "$T/dump.log")" ] || fail "errors in the dump log"
# The fake driver maps its copy with MAP_POPULATE, as the real one: the plugin populated it instead.
expect_log "$T/dump.log" "pid $pid: the driver's checkpoint buffer \(64\.0 MiB\) on (huge|4 KiB) pages, populated in" \
	"the driver's buffer was not prepared"
[ -f "$T/img1/cuda-plugin.img" ] || fail "no cuda-plugin.img"
cuda_criu inspect "$T/img1" >"$T/inspect.out" || fail "cuda-criu inspect failed"
grep -qE "^$pid +[0-9]+ +running +6[0-9]\.[0-9] MiB" "$T/inspect.out" || fail "inspect: $(cat "$T/inspect.out")"
restore "$T/img1" || fail "restore failed"
expect_summary "$T/restore.log" restore 1 "no restore summary"
alive "$pid" || fail "pid $pid not running after restore"
[ "$(cuda_state "$pid")" = running ] || fail "CUDA state after restore: $(cuda_state "$pid")"
healthy_then_gone
log "one process: ok"

# 2. A tree: root and two children on the GPU, one plain child; all checkpointed at once.
start_memcheck tree 32 --children 2 --plain-children 1
root=$LAST_PID
wait_for "the children" 20 test -f "$STATE.1"
pids=$(ps -o pid= --ppid "$root" | xargs)
dump "$root" "$T/img2" || fail "dump of the tree failed"
wait_gone "$root" $pids
expect_log "$T/dump.log" "checkpointing 3 CUDA process\(es\) in parallel" "tree not checkpointed in one batch"
[ -z "$(plugin_errors "$T/dump.log")" ] || fail "errors in the tree's dump log"
restore "$T/img2" || fail "restore of the tree failed"
expect_summary "$T/restore.log" restore 3 "tree restore summary"
for f in "$STATE" "$STATE.0" "$STATE.1"; do expect_healthy "$f"; done
kill -9 "$root" $pids; wait_gone "$root" $pids
log "tree of 3 CUDA + 1 plain process: ok"

# 3. An image as CRIU's own CUDA plugin writes it (no cuda-plugin.img): found by detection.
CUDA_CRIU_GPU_IMAGE=criu dump_one intree # the GPU state in CRIU's pages, as that plugin leaves it
rm "$img/cuda-plugin.img"
restore "$img" || fail "restore of an image without cuda-plugin.img failed"
expect_log "$T/restore.log" "image of CRIU's own cuda plugin" "restore did not say it ran without our image"
healthy_then_gone
log "image without cuda-plugin.img: ok"

# 4. CRIU 4.1.1 (stock, plugin ABI with 12 hooks) dumps and restores with the same plugin.
if stock_criu; then
	CRIU=$CRIU411 dump_one criu411
	CRIU=$CRIU411 restore "$img" || fail "CRIU 4.1.1: restore failed"
	healthy_then_gone
	log "CRIU 4.1.1: ok"
else
	log "$STOCK_WHY: skipped that part"
fi
log PASS
