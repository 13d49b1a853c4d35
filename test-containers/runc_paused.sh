#!/usr/bin/env bash
# runc: checkpoints of a paused container (`runc pause`: its cgroup frozen). CRIU thaws the cgroup for
# plugins; our plugin locks and checkpoints the CUDA process while its other threads stay stopped.
#   1. --leave-running: the container is left paused as it was, and runs on intact after `runc resume`.
#   2. a checkpoint that fails in the driver: the dump fails, the container is left paused as it was,
#      and runs on intact after `runc resume`.
#   3. a plain checkpoint: the container is removed; the restore brings it back running, data intact.
source "$(dirname "$0")/lib.sh"
ct_setup runc
runc_setup

runc_start_memcheck ct-paused 32
host_pid=$(runc_pid ct-paused)

expect_paused_as_before() { # WHAT
	[ "$(runc_status ct-paused)" = paused ] || fail "$1: the container is $(runc_status ct-paused), not paused"
	expect_still "$T/state/one"
	runc_ resume ct-paused || fail "$1: runc resume failed"
	expect_healthy "$T/state/one"
	[ "$(runc_pid ct-paused)" = "$host_pid" ] || fail "$1: the container's process changed"
}

# 1. --leave-running on a paused container.
runc_ pause ct-paused || fail "runc pause failed"
[ "$(runc_status ct-paused)" = paused ] || fail "not paused after runc pause"
runc_checkpoint ct-paused "$T/img1" --leave-running || fail "checkpoint --leave-running of a paused container failed"
expect_summary "$T/dump.log" dump 1 "no dump summary"
[ -z "$(plugin_errors "$T/dump.log")" ] || fail "plugin errors in the dump log"
expect_paused_as_before "checkpoint --leave-running"
log "paused, checkpoint --leave-running: left paused, runs on intact after resume"

# 2. The driver fails the checkpoint: nothing is lost, the container stays paused.
runc_ pause ct-paused || fail "runc pause failed"
if FAKEGPU_FAIL=checkpoint runc_checkpoint ct-paused "$T/img2"; then
	fail "the checkpoint succeeded although the driver failed it"
fi
expect_log "$T/dump.log" "Error \(cuda_plugin\).*cuCheckpointProcessCheckpoint" "no plugin error naming the failed call"
expect_log "$T/dump.log" "all CUDA processes are back as they were found" "no rollback line"
expect_paused_as_before "failed checkpoint"
log "paused, failed checkpoint: clean failure, left paused, runs on intact after resume"

# 3. A plain checkpoint of the paused container, then a restore.
runc_ pause ct-paused || fail "runc pause failed"
runc_checkpoint ct-paused "$T/img3" || fail "checkpoint of a paused container failed"
[ -z "$(plugin_errors "$T/dump.log")" ] || fail "plugin errors in the dump log"
wait_for "pid $host_pid to exit" 10 test ! -e "/proc/$host_pid"
runc_ delete -f ct-paused 2>/dev/null || true
at_dump=$(state_value "$T/state/one" iterations)
runc_restore ct-paused "$T/bundle" "$T/img3" || fail "restore of the paused container's checkpoint failed"
expect_summary "$T/restore.log" restore 1 "no restore summary"
status=$(runc_status ct-paused)
[ "$status" = running ] || fail "restored container is $status"
expect_resumed "$T/state/one" "$at_dump" "paused, checkpoint: restored running"
runc_remove ct-paused
log PASS
