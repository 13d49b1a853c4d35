#!/usr/bin/env bash
# Every failure during a dump leaves each CUDA process as it was found, running and with its data; a
# failure during a restore never leaves a process running without its GPU state. Faults are injected
# into the fake driver (an error code, a hang past the timeout, the target dying) and into CRIU itself.
source "$(dirname "$0")/lib.sh"
e2e_setup
start_fake_gpu

# dump_must_fail CASE EXPECTED_LOG_PATTERN [env assignments...]: dumps a fresh workload with the given
# environment for CRIU (and $DUMP_ARGS on its command line); the dump must fail, say why, and leave the
# workload running as it was. CRIU itself must not crash (its seize alarm's BUG()).
dump_must_fail() {
	local name=$1 pattern=$2
	shift 2
	start_memcheck "$name" 16 --children 1
	local pid=$LAST_PID child_state=$STATE.0
	wait_for "child of $name" 10 test -f "$child_state"
	local t0=$SECONDS
	mkdir -p "$T/img-$name"
	# shellcheck disable=SC2086 # DUMP_ARGS: words for CRIU's command line
	if env "$@" "$CRIU" dump ${DUMP_ARGS:-} -t "$pid" -D "$T/img-$name" -L "$PLUGIN_DIR" -v4 -o dump.log 2>/dev/null; then
		fail "$name: dump succeeded despite the fault"
	fi
	cp "$T/img-$name/dump.log" "$T/dump.log"
	grep -qE "$pattern" "$T/dump.log" || fail "$name: no line matching '$pattern'"
	! grep -q "Unable to interrupt the current operation" "$T/dump.log" || fail "$name: CRIU's seize alarm crashed it"
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

# start_tree NAME: a CUDA process with one CUDA child; sets $root, $child and $STATE (the child's: $STATE.0).
start_tree() {
	start_memcheck "$1" 16 --children 1 --tolerate-child-exit
	root=$LAST_PID
	wait_for "child of $1" 10 test -f "$STATE.0"
	child=$(state_value "$STATE.0" pid)
}
# dump_fails NAME [env assignments...]: dumps $root with that environment for CRIU; the dump must fail.
# Sets $DUMP_RC; CRIU's log goes to $T/dump.log.
dump_fails() {
	local name=$1
	shift
	mkdir -p "$T/img-$name"
	DUMP_RC=0
	env "$@" "$CRIU" dump -t "$root" -D "$T/img-$name" -L "$PLUGIN_DIR" -v4 -o dump.log 2>/dev/null || DUMP_RC=$?
	[ "$DUMP_RC" -ne 0 ] || fail "$name: dump succeeded despite the fault"
	cp "$T/img-$name/dump.log" "$T/dump.log"
}
# No process runs with this image directory: neither CRIU nor a guard forked from it (same command line).
criu_gone() { ! pgrep -f -- "-D $1( |\$)" >/dev/null; }
ended() { ! alive "$1"; }
tree_ended() { ended "$root" && ended "$child"; }
# tree_healthy NAME: both processes of the tree run (CUDA state running) and count on with their data.
tree_healthy() {
	wait_for "$1: root $root to run" 20 is_running "$root"
	wait_for "$1: child $child to run" 20 is_running "$child"
	expect_healthy "$STATE"
	expect_healthy "$STATE.0"
}

# Errors from each driver call.
dump_must_fail fail-getstate "cuCheckpointProcessGetState failed: CUDA_ERROR_UNKNOWN" FAKEGPU_FAIL=getstate
dump_must_fail fail-lock "lock pid [0-9]+: cuCheckpointProcessLock failed" FAKEGPU_FAIL=lock
dump_must_fail fail-checkpoint "cuCheckpointProcessCheckpoint failed: CUDA_ERROR_UNKNOWN" FAKEGPU_FAIL=checkpoint
# A driver that cannot say whether the process holds CUDA state: it is not dumped as a plain one (its
# GPU state would be lost); the pause fails, naming it, and nothing is left locked.
dump_must_fail fail-getrestoretid "pid [0-9]+ has libcuda loaded, but the driver cannot say whether it holds CUDA state" \
	FAKEGPU_FAIL=getrestoretid
# Hangs past the timeouts.
dump_must_fail hang-lock "lock pid [0-9]+: no answer from the driver" FAKEGPU_HANG=lock FAKEGPU_HANG_MS=600000 \
	CUDA_CRIU_LOCK_TIMEOUT=0.5
dump_must_fail hang-checkpoint "checkpoint pid [0-9]+: no answer from the driver after 1000 ms" FAKEGPU_HANG=checkpoint \
	FAKEGPU_HANG_MS=600000 CUDA_CRIU_CHECKPOINT_TIMEOUT=1
# A lock hanging past CRIU's seize timeout (its alarm, --timeout 3, is shorter than the lock timeout of
# 10 s): the pause gives up before the alarm and says which timeout to raise.
DUMP_ARGS="--timeout 3" dump_must_fail hang-lock-past-criu-timeout "pause ran into CRIU's seize timeout \(raise criu dump --timeout" \
	FAKEGPU_HANG=lock FAKEGPU_HANG_MS=600000
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
healthy_then_gone
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
healthy_then_gone
log "post-dump script failed, CRIU let the tasks go: the guard returned the process to running, data intact"

# Without the guard (e.g. it was killed too), cuda-criu resume is the way back from a stranded state.
start_memcheck stranded 16
pid=$LAST_PID
cuda_criu lock "$pid" >/dev/null && cuda_criu checkpoint "$pid" >/dev/null || fail "stranded: cuda-criu checkpoint failed"
[ "$(cuda_state "$pid")" = checkpointed ] || fail "stranded: not checkpointed"
cuda_criu resume "$pid" >/dev/null || fail "stranded: cuda-criu resume failed"
[ "$(cuda_state "$pid")" = running ] || fail "stranded: not running after cuda-criu resume"
healthy_then_gone
log "stranded process brought back by cuda-criu resume: ok"

# target_dies NAME LOG_PATTERN ENV...: a tree whose child the fake driver kills at the call that ENV
# names (CHILD in LOG_PATTERN and ENV stands for its pid); the dump fails naming it, and the root is
# returned to running with its data.
target_dies() {
	local name=$1 pattern=$2 a env=()
	shift 2
	start_tree "$name"
	for a in "$@"; do env+=("${a//CHILD/$child}"); done
	dump_fails "$name" "${env[@]}"
	expect_log "$T/dump.log" "${pattern//CHILD/$child}" "$name: the dead pid is not named"
	wait_for "$name: the killed child to be gone" 10 ended "$child"
	[ "$(cuda_state "$root")" = running ] || fail "$name: root left $(cuda_state "$root")"
	expect_healthy "$STATE"
	kill -9 -- "-$root"; wait_gone "$root"
}

# The target dies mid-dump, or while being locked: the dump fails, the other process runs on intact.
target_dies crash "checkpoint pid CHILD" FAKEGPU_CRASH_TARGET=checkpoint:CHILD
log "target killed mid-dump: reported, the other process running and intact"
target_dies crash-lock "Error \(cuda_plugin\): .*lock pid CHILD" FAKEGPU_CRASH_TARGET=lock:CHILD
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
healthy_then_gone
log "rollback failure: named with the way back (cuda-criu resume), which restores the process intact"

# The rollback's restore hangs past CUDA_CRIU_RESTORE_TIMEOUT: the dump fails within seconds naming the
# process and the way back; neither CRIU nor its guard (whose own attempt hangs too) is left waiting.
start_memcheck rollback-hangs 16
root=$LAST_PID
t0=$SECONDS
dump_fails rollback-hangs CRIU_FAULT=3 FAKEGPU_HANG=restore FAKEGPU_HANG_MS=600000 CUDA_CRIU_RESTORE_TIMEOUT=1
expect_log "$T/dump.log" "Error \(cuda_plugin\): could not return pid $root .*no answer from the driver after 1000 ms.*cuda-criu resume $root" \
	"rollback-hangs: no line naming the pid, the hang and the way back"
wait_for "CRIU and its guard to exit" 20 criu_gone "$T/img-rollback-hangs"
[ $((SECONDS - t0)) -lt 30 ] || fail "rollback-hangs: took $((SECONDS - t0)) s"
[ "$(cuda_state "$root")" = checkpointed ] || fail "rollback-hangs: expected checkpointed, got $(cuda_state "$root")"
cuda_criu resume "$root" >/dev/null || fail "rollback-hangs: cuda-criu resume failed"
expect_healthy "$STATE"
kill -9 "$root"; wait_gone "$root"
log "rollback hangs: dump failed in $((SECONDS - t0)) s naming the way back (cuda-criu resume), which restores the process intact"

# A target dies when its restore thread gets the rollback's restore request: reported for that pid, the
# other process is returned to running with its data.
target_dies rollback-crash "Error \(cuda_plugin\): could not return pid CHILD " CRIU_FAULT=3 \
	FAKEGPU_CRASH_TARGET=restore:CHILD
! grep -q "could not return pid $root " "$T/dump.log" || fail "rollback-crash: root $root was not returned"
log "target killed during the rollback: reported, the other process running and intact"

# CRIU SIGKILLed (by the fake driver, FAKEGPU_KILL_CALLER) while locking the second process of a tree: the
# guard unlocks the first one.
start_tree pause-killed
dump_fails pause-killed FAKEGPU_KILL_CALLER=lock:$child
[ "$DUMP_RC" -eq 137 ] || fail "pause-killed: CRIU was not killed (exit $DUMP_RC)"
expect_log "$T/dump.log" "pid $root: running, restore thread" "pause-killed: root was not locked before CRIU died"
tree_healthy pause-killed
kill -9 -- "-$root"; wait_gone "$root"
log "criu killed during the lock: the guard returned the tree to running, data intact"

# CRIU SIGKILLed in the rollback (at the child's restore call): the guard returns both processes.
start_tree rollback-killed
dump_fails rollback-killed CRIU_FAULT=3 FAKEGPU_KILL_CALLER=restore:$child
[ "$DUMP_RC" -eq 137 ] || fail "rollback-killed: CRIU was not killed (exit $DUMP_RC)"
expect_log "$T/dump.log" "dump failed: returning 2 CUDA process" "rollback-killed: no rollback started"
tree_healthy rollback-killed
kill -9 -- "-$root"; wait_gone "$root"
log "criu killed during the rollback: the guard returned the tree to running, data intact"

# Restore failures, patched CRIU (ours): the restore fails and no restored process is left.
restore_must_fail() { # NAME CRIU_BINARY FAULT [EXPECTED_ERROR [ENV...]]: FAULT goes into FAKEGPU_FAIL
	local name=$1 criu=$2 fault=$3 expected=${4:-CUDA_ERROR_UNKNOWN}
	shift 3; [ $# -gt 0 ] && shift
	start_memcheck "$name" 16
	local pid=$LAST_PID
	CRIU=$criu dump "$pid" "$T/img-$name" || fail "$name: dump failed"
	wait_gone "$pid"
	local rc=0
	env $(criu_env "$criu") FAKEGPU_FAIL="$fault" "$@" "$criu" restore -D "$T/img-$name" -d -L "$PLUGIN_DIR" -v4 -o restore.log \
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
# The driver never finishes loading in CRIU (cuInit of the restore's warm-up, from POST_FORKING): the first
# RESUME_DEVICES_LATE waits its 60 s, then fails naming the pid; CRIU exits although cuInit still sleeps.
t0=$SECONDS
restore_must_fail warmup-hangs "$CRIU" none "loading the CUDA driver .cuInit, NVML. gave no answer within 60 s" \
	FAKEGPU_INIT_MS=600000
[ "$RESTORE_RC" -ne 0 ] || fail "warmup-hangs: a driver that never loaded was reported as success"
[ $((SECONDS - t0)) -lt 90 ] || fail "warmup-hangs: took $((SECONDS - t0)) s"
wait_for "warmup-hangs: CRIU and its guard to exit" 10 criu_gone "$T/img-warmup-hangs"
log "the driver never loads in CRIU: restore failed after $((SECONDS - t0)) s naming the pid, nothing left running"

# restore_tree_must_fail NAME VAR OP: dumps a tree of two CUDA processes and restores it with VAR=OP:CHILD
# (OP alone for FAKEGPU_KILL_CALLER) for CRIU; the restore must fail and leave no process of the tree nor
# CRIU or its guard. Sets $RESTORE_RC; CRIU's log goes to $T/restore.log.
restore_tree_must_fail() {
	local name=$1 var=$2 op=$3
	start_tree "$name"
	dump "$root" "$T/img-$name" || fail "$name: dump failed"
	wait_gone "$root" "$child"
	local fault=$op:$child
	[ "$var" != FAKEGPU_KILL_CALLER ] || fault=$op
	RESTORE_RC=0
	env "$var=$fault" "$CRIU" restore -D "$T/img-$name" -d -L "$PLUGIN_DIR" -v4 -o restore.log 2>/dev/null ||
		RESTORE_RC=$?
	cp "$T/img-$name/restore.log" "$T/restore.log"
	[ "$RESTORE_RC" -ne 0 ] || fail "$name: restore reported success"
	wait_for "$name: restored tree to be gone" 10 tree_ended
	wait_for "$name: CRIU and its guard to exit" 10 criu_gone "$T/img-$name"
}
# The target dies during its restore or its unlock: the restore fails naming it, the tree is killed.
for op in restore unlock; do
	restore_tree_must_fail "$op-crash" FAKEGPU_CRASH_TARGET $op
	expect_log "$T/restore.log" "Error \(cuda_plugin\): .*pid $child" "$op-crash: the dead pid is not named"
	log "target killed during its $op: restore failed (exit $RESTORE_RC), nothing left running"
done
# CRIU SIGKILLed at the restore call, then at the unlock call: nothing of CRIU runs any more; the restore
# guard kills the processes whose GPU state was not restored.
for op in restore unlock; do
	restore_tree_must_fail "$op-criu-killed" FAKEGPU_KILL_CALLER $op
	[ "$RESTORE_RC" -eq 137 ] || fail "$op-criu-killed: CRIU was not killed (exit $RESTORE_RC)"
	log "criu killed at the $op call: the restore guard killed the tree, nothing left running"
done
# A restore that succeeds leaves no guard behind.
start_tree restore-ok
dump "$root" "$T/img-restore-ok" || fail "restore-ok: dump failed"
wait_gone "$root" "$child"
restore "$T/img-restore-ok" || fail "restore-ok: restore failed"
wait_for "restore-ok: the restore guard to exit" 2 criu_gone "$T/img-restore-ok"
tree_healthy restore-ok
kill -9 -- "-$root"; wait_gone "$root"
log "successful restore: the restore guard is gone, the tree runs intact"

# Stock CRIU 4.1.1 ignores the hook's failure: the plugin kills the restored tree itself.
if stock_criu; then
	restore_must_fail stock-restore-fails "$CRIU411" restore
	expect_log "$T/restore.log" "restored processes are killed now" "stock CRIU: no kill message"
	log "restore failure with stock CRIU 4.1.1: exit $RESTORE_RC, restored process killed, error logged"
else
	log "$STOCK_WHY: skipped that part"
fi
log PASS
