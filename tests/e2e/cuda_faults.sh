#!/usr/bin/env bash
# Every failure during a dump leaves each CUDA process as it was found, running and with its data; a
# failure during a restore never leaves a process running without its GPU state. Faults are injected
# into the fake driver (an error code, a hang past the timeout, the target dying) and into CRIU itself.
source "$(dirname "$0")/lib.sh"
e2e_setup
start_fake_gpu

# dump_must_fail CASE EXPECTED_LOG_PATTERN [env assignments...]: dumps a fresh workload with the given
# environment for CRIU; the dump must fail, say why, and leave the workload running as it was.
dump_must_fail() {
	local name=$1 pattern=$2
	shift 2
	start_memcheck "$name" 16 --children 1
	local pid=$LAST_PID child_state=$STATE.0
	wait_for "child of $name" 10 test -f "$child_state"
	local t0=$SECONDS
	mkdir -p "$T/img-$name"
	if env "$@" "$CRIU" dump -t "$pid" -D "$T/img-$name" -L "$PLUGIN_DIR" -v4 -o dump.log 2>/dev/null; then
		fail "$name: dump succeeded despite the fault"
	fi
	cp "$T/img-$name/dump.log" "$T/dump.log"
	grep -qE "$pattern" "$T/dump.log" || fail "$name: no line matching '$pattern'"
	alive "$pid" || fail "$name: the workload died"
	local s
	for p in "$pid" $(ps -o pid= --ppid "$pid"); do
		s=$(cuda_state "$p" 2>/dev/null || true)
		[ -z "$s" ] || [ "$s" = running ] || fail "$name: pid $p left $s"
	done
	expect_healthy "$STATE"
	expect_healthy "$child_state"
	log "$name: dump failed as it should ($((SECONDS - t0)) s), processes running and intact"
	kill -9 -- "-$pid"; wait_gone "$pid"
}

# Errors from each driver call.
dump_must_fail fail-getstate "cuCheckpointProcessGetState failed: CUDA_ERROR_UNKNOWN" FAKEGPU_FAIL=getstate
dump_must_fail fail-lock "lock pid [0-9]+: cuCheckpointProcessLock failed" FAKEGPU_FAIL=lock
dump_must_fail fail-checkpoint "cuCheckpointProcessCheckpoint failed: CUDA_ERROR_UNKNOWN" FAKEGPU_FAIL=checkpoint
# A driver that does not know the process: it is dumped as a plain one, which CRIU then refuses
# (the GPU connection is external to the tree); nothing is left locked.
dump_must_fail fail-getrestoretid "External socket|has libcuda loaded but no CUDA state" FAKEGPU_FAIL=getrestoretid
# Hangs past the timeouts.
dump_must_fail hang-lock "lock pid [0-9]+: no answer from the driver" FAKEGPU_HANG=lock FAKEGPU_HANG_MS=600000 \
	CUDA_CRIU_LOCK_TIMEOUT=0.5
dump_must_fail hang-checkpoint "checkpoint pid [0-9]+: no answer from the driver after 1000 ms" FAKEGPU_HANG=checkpoint \
	FAKEGPU_HANG_MS=600000 CUDA_CRIU_CHECKPOINT_TIMEOUT=1
# CRIU failing after the GPU state was checkpointed (CRIU's own fault injection).
dump_must_fail criu-fails-on-pages "returning [0-9]+ CUDA process" CRIU_FAULT=3

# CRIU killed (SIGKILL) after the checkpoint: none of CRIU's rollback runs. The plugin's guard, a process
# that outlives CRIU, returns the process to running by itself.
start_memcheck criu-killed 16
pid=$LAST_PID
mkdir -p "$T/img-killed"
if CRIU_FAULT=1 "$CRIU" dump -t "$pid" -D "$T/img-killed" -L "$PLUGIN_DIR" -v4 -o dump.log 2>/dev/null; then
	fail "criu-killed: dump succeeded"
fi
alive "$pid" || fail "criu-killed: the workload died with CRIU"
wait_for "the guard to return pid $pid to running" 20 is_running "$pid"
expect_healthy "$STATE"
kill -9 "$pid"; wait_gone "$pid"
log "criu killed mid-dump: the guard returned the process to running, data intact"

# A post-dump script that fails makes CRIU let the tasks go after a successful dump (the plugin was told
# the dump succeeded and the tasks would be killed): the guard returns the process to running.
cat >"$T/post-dump-fails.sh" <<'EOS'
#!/bin/sh
[ "$CRTOOLS_SCRIPT_ACTION" = post-dump ] && exit 1
exit 0
EOS
chmod +x "$T/post-dump-fails.sh"
start_memcheck post-dump 16
pid=$LAST_PID
mkdir -p "$T/img-post-dump"
"$CRIU" dump -t "$pid" -D "$T/img-post-dump" -L "$PLUGIN_DIR" -v4 -o dump.log --action-script "$T/post-dump-fails.sh" \
	2>/dev/null && fail "post-dump: criu reported success despite the failing post-dump script"
alive "$pid" || fail "post-dump: the workload was killed"
wait_for "the guard to return pid $pid to running" 20 is_running "$pid"
expect_healthy "$STATE"
kill -9 "$pid"; wait_gone "$pid"
log "post-dump script failed, CRIU let the tasks go: the guard returned the process to running, data intact"

# Without the guard (e.g. it was killed too), cuda-criu resume is the way back from a stranded state.
start_memcheck stranded 16
pid=$LAST_PID
cuda_criu lock "$pid" >/dev/null && cuda_criu checkpoint "$pid" >/dev/null || fail "stranded: cuda-criu checkpoint failed"
[ "$(cuda_state "$pid")" = checkpointed ] || fail "stranded: not checkpointed"
cuda_criu resume "$pid" >/dev/null || fail "stranded: cuda-criu resume failed"
[ "$(cuda_state "$pid")" = running ] || fail "stranded: not running after cuda-criu resume"
expect_healthy "$STATE"
kill -9 "$pid"; wait_gone "$pid"
log "stranded process brought back by cuda-criu resume: ok"

# The target dies mid-dump: the dump fails naming it, the other process is returned to running.
start_memcheck crash 16 --children 1 --tolerate-child-exit
root=$LAST_PID
wait_for "child" 10 test -f "$STATE.0"
child=$(state_value "$STATE.0" pid)
mkdir -p "$T/img-crash"
if FAKEGPU_CRASH_TARGET=checkpoint:$child "$CRIU" dump -t "$root" -D "$T/img-crash" -L "$PLUGIN_DIR" -v4 \
	-o dump.log 2>/dev/null; then
	fail "crash: dump succeeded although a target died"
fi
cp "$T/img-crash/dump.log" "$T/dump.log"
expect_log "$T/dump.log" "checkpoint pid $child" "crash: the dead pid is not named"
[ "$(cuda_state "$root")" = running ] || fail "crash: root left $(cuda_state "$root")"
expect_healthy "$STATE"
kill -9 -- "-$root"; wait_gone "$root"
log "target killed mid-dump: reported, the other process running and intact"

# The target dies while being locked: the dump fails, the other process of the tree runs on intact.
start_memcheck crash-lock 16 --children 1 --tolerate-child-exit
root=$LAST_PID
wait_for "child" 10 test -f "$STATE.0"
child=$(state_value "$STATE.0" pid)
mkdir -p "$T/img-crash-lock"
if FAKEGPU_CRASH_TARGET=lock:$child "$CRIU" dump -t "$root" -D "$T/img-crash-lock" -L "$PLUGIN_DIR" -v4 \
	-o dump.log 2>/dev/null; then
	fail "crash-lock: dump succeeded although a target died"
fi
cp "$T/img-crash-lock/dump.log" "$T/dump.log"
expect_log "$T/dump.log" "Error \(cuda_plugin\): .*lock pid $child" "crash-lock: the dead pid is not named"
[ "$(cuda_state "$root")" = running ] || fail "crash-lock: root left $(cuda_state "$root")"
expect_healthy "$STATE"
kill -9 -- "-$root"; wait_gone "$root"
log "target killed while being locked: reported, the other process running and intact"

# The rollback itself fails (CRIU fails after the checkpoint, then the driver refuses the restore): the
# dump fails naming the process and the command that brings it back, which then works.
start_memcheck rollback-fails 16
pid=$LAST_PID
mkdir -p "$T/img-rollback"
if CRIU_FAULT=3 FAKEGPU_FAIL=restore "$CRIU" dump -t "$pid" -D "$T/img-rollback" -L "$PLUGIN_DIR" -v4 \
	-o dump.log 2>/dev/null; then
	fail "rollback-fails: dump succeeded"
fi
cp "$T/img-rollback/dump.log" "$T/dump.log"
expect_log "$T/dump.log" "Error \(cuda_plugin\): could not return pid $pid .*cuda-criu resume $pid" \
	"rollback-fails: no line naming the pid and the way back"
[ "$(cuda_state "$pid")" = checkpointed ] || fail "rollback-fails: expected checkpointed, got $(cuda_state "$pid")"
cuda_criu resume "$pid" >/dev/null || fail "rollback-fails: cuda-criu resume failed"
expect_healthy "$STATE"
kill -9 "$pid"; wait_gone "$pid"
log "rollback failure: named with the way back (cuda-criu resume), which restores the process intact"

# Restore failures, patched CRIU (ours): the restore fails and no restored process is left.
restore_must_fail() { # NAME CRIU_BINARY FAULT [EXPECTED_ERROR [ENV...]]: FAULT goes into FAKEGPU_FAIL
	local name=$1 criu=$2 fault=$3 expected=${4:-CUDA_ERROR_UNKNOWN}
	shift 3; [ $# -gt 0 ] && shift
	start_memcheck "$name" 16
	local pid=$LAST_PID
	CRIU=$criu dump "$pid" "$T/img-$name" || fail "$name: dump failed"
	wait_gone "$pid"
	local rc=0
	env FAKEGPU_FAIL="$fault" "$@" "$criu" restore -D "$T/img-$name" -d -L "$PLUGIN_DIR" -v4 -o restore.log \
		2>/dev/null || rc=$?
	cp "$T/img-$name/restore.log" "$T/restore.log"
	expect_log "$T/restore.log" "Error \(cuda_plugin\): .*pid $pid.*$expected" "$name: the failure is not logged with the pid"
	wait_for "$name: restored process to be gone" 10 sh -c "! [ -e /proc/$pid ] || grep -q '^State:.*Z' /proc/$pid/status"
	RESTORE_RC=$rc
}
restore_must_fail restore-fails "$CRIU" restore
[ "$RESTORE_RC" -ne 0 ] || fail "patched CRIU reported success for a failed GPU restore"
restore_must_fail unlock-fails "$CRIU" unlock
[ "$RESTORE_RC" -ne 0 ] || fail "patched CRIU reported success for a failed unlock"
# Hangs of the restore and of the unlock, past CUDA_CRIU_RESTORE_TIMEOUT.
restore_must_fail restore-hangs "$CRIU" none "no answer from the driver after 1000 ms" FAKEGPU_HANG=restore \
	FAKEGPU_HANG_MS=600000 CUDA_CRIU_RESTORE_TIMEOUT=1
[ "$RESTORE_RC" -ne 0 ] || fail "a hung GPU restore was reported as success"
restore_must_fail unlock-hangs "$CRIU" none "no answer from the driver after 1000 ms" FAKEGPU_HANG=unlock \
	FAKEGPU_HANG_MS=600000 CUDA_CRIU_RESTORE_TIMEOUT=1
[ "$RESTORE_RC" -ne 0 ] || fail "a hung unlock was reported as success"
log "restore failures with our CRIU (errors and hangs of restore and unlock): restore fails (exit $RESTORE_RC), nothing left running"

# Stock CRIU 4.1.1 ignores the hook's failure: the plugin kills the restored tree itself.
CRIU411=$BUILD_DIR/criu/4.1.1/install/sbin/criu
if [ -x "$CRIU411" ]; then
	restore_must_fail stock-restore-fails "$CRIU411" restore
	expect_log "$T/restore.log" "restored processes are killed now" "stock CRIU: no kill message"
	log "restore failure with stock CRIU 4.1.1: exit $RESTORE_RC, restored process killed, error logged"
fi
log PASS
