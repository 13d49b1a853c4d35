#!/usr/bin/env bash
# GPU pairs as NVIDIA's r580 driver wants them: once any GPU moves, every GPU of the machine is paired,
# also GPUs a process never opened (the fake daemon, started with --pairs-of all, refuses anything less).
# The plugin and cuda-criu complete a map with the GPUs it leaves out; where no partner is left, the
# driver's refusal is explained and nothing runs.
source "$(dirname "$0")/lib.sh"
e2e_setup
start_fake_gpu --gpus 2 --pairs-of all

# 1. criu restore with CUDA_CRIU_DEVICE_MAP=0=1 of a process that held GPU 0 only: 1 -> 0 is added.
dump_one map --device 0
CUDA_CRIU_DEVICE_MAP=0=1 restore "$img" || fail "map: restore failed"
expect_log "$T/restore.log" "restoring with GPU pairs: .*\(held by no process\)" "map: the GPU no process held is not paired"
expect_healthy "$STATE"
[ "$(gpus_of "$pid")" = dev/nvidia1 ] || fail "map: process is on '$(gpus_of "$pid")', not GPU 1"
kill -9 "$pid"; wait_gone "$pid"
log "criu restore, map 0=1 completed with 1=0: on GPU 1, data intact"

# 2. cuda-criu resume --device-map 0=1 of a live process: the same completion.
start_memcheck cli 16 --device 0
p=$LAST_PID
cuda_criu suspend "$p" >/dev/null || fail "cli: suspend failed"
cuda_criu resume --device-map 0=1 "$p" >"$T/out" 2>"$T/err" || fail "cli: resume --device-map 0=1: $(cat "$T/err")"
expect_healthy "$STATE"
[ "$(gpus_of "$p")" = dev/nvidia1 ] || fail "cli: process is on '$(gpus_of "$p")', not GPU 1"
kill -9 "$p"; wait_gone "$p"
log "cuda-criu resume --device-map 0=1 completed with 1=0: on GPU 1, data intact"

# 3. No partner left for the GPU no process held (CRIU sees only GPU 1, and the fake has no kernel GPU
#    list to add the hidden one from): the driver refuses; the restore fails, explained; nothing runs.
dump_one alone --device 0
if FAKEGPU_VISIBLE=1 "$CRIU" restore -D "$img" -d -L "$PLUGIN_DIR" -v4 -o restore.log 2>/dev/null; then
	fail "alone: restore succeeded with an incomplete pair list"
fi
cp "$img/restore.log" "$T/restore.log"
expect_log "$T/restore.log" "held by no process, left unpaired" "alone: the unpaired GPU is not reported"
expect_log "$T/restore.log" "Error \(cuda_plugin\): .*CUDA_ERROR_INVALID_VALUE.*the driver wants every GPU the process's driver knew paired.*\(2\) CUDA IPC memory the process imported.*r610" \
	"alone: the driver's refusal is not explained with its known causes"
wait_for "alone: no restored process" 10 sh -c "! [ -e /proc/$pid ] || grep -q '^State:.*Z' /proc/$pid/status"
log "no partner left: refused by the driver, explained, nothing running"
log PASS
