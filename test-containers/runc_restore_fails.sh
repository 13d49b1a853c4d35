#!/usr/bin/env bash
# runc: a restore that the plugin refuses late (after CRIU has seized the restored container's tasks)
# fails at once, leaves no process behind, and the image still restores afterwards. Without
# criu-patches/0003 CRIU waited forever for the container's init, whose traced threads it never reaped,
# and `runc restore` never returned.
source "$(dirname "$0")/lib.sh"
ct_setup runc
runc_setup

runc_start_memcheck ct-one 64
runc_checkpoint ct-one "$T/img" || fail "runc checkpoint failed"
runc_ delete -f ct-one 2>/dev/null || true
at_dump=$(state_value "$T/state/one" iterations)

# 1. A device map naming a GPU the image does not have: the plugin refuses in its RESUME_DEVICES_LATE hook.
# runc gets 60 s before it is killed (a hang fails the test instead of blocking it).
( exec >/dev/null 2>&1; sleep 60 && pkill -KILL -f "runc --root $RUNC_ROOT .* restore" ) &
watchdog=$!
t0=$(date +%s)
rc=0
CUDA_CRIU_DEVICE_MAP=GPU-00000000-0000-0000-0000-0000000000ff=0 runc_restore ct-one "$T/bundle" "$T/img" || rc=$?
secs=$(($(date +%s) - t0))
pkill -P "$watchdog" sleep 2>/dev/null || true
[ "$rc" -ne 0 ] || fail "runc restore with a device map naming no GPU of the image succeeded"
[ "$secs" -lt 60 ] || fail "runc restore took $secs s to fail (killed by the watchdog): CRIU hung after the failed restore"
expect_log "$T/restore.log" "Error \(cuda_plugin\): .*device map: GPU-[0-]+ff is not a GPU of the image" "no plugin error naming the map"
expect_log "$T/restore.log" "Restoring FAILED" "CRIU did not report the failed restore"
# This test's workloads: those of its fake GPU (other tests may run the same command).
ours() {
	local p
	for p in $(pgrep -f cuda_memcheck); do
		tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "FAKEGPU_DIR=$FAKEGPU_DIR" && echo "$p"
	done
	true
}
none_left() { [ -z "$(ours)" ]; }
wait_for "no workload of this test to be left" 10 none_left
[ -z "$(pgrep -f "runc --root $RUNC_ROOT")" ] || fail "a runc of this test is still running"
runc_ delete -f ct-one 2>/dev/null || true
log "refused restore: runc restore failed in $secs s with the plugin's error, nothing left running"

# 2. The image is intact: restored as it should be.
runc_restore ct-one "$T/bundle" "$T/img" || fail "runc restore after the refused one failed"
expect_summary "$T/restore.log" restore 1 "no restore summary"
expect_healthy "$T/state/one"
now=$(state_value "$T/state/one" iterations)
[ "$now" -ge "$at_dump" ] || fail "iterations went back from $at_dump to $now"
runc_remove ct-one
log "restored afterwards: data intact, iteration $at_dump -> $now"
log PASS
