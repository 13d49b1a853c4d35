#!/usr/bin/env bash
# A dump that leaves its tasks alive (--leave-running, --leave-stopped) succeeds only when every CUDA
# process is back as it was found; a stopped process is refused at once; a restore with --leave-stopped
# restores the GPU state and leaves the processes stopped, ready to go on at SIGCONT.
source "$(dirname "$0")/lib.sh"
e2e_setup
start_fake_gpu

is_stopped() { [ "$(awk '/^State:/ {print $2}' "/proc/$1/status")" = T ]; }

# 1. --leave-running whose return of the process fails (the driver refuses its restore in place, as r580
# does for a CUDA IPC importer): CRIU exits non-zero, the log names the pid and the state it is left in.
start_memcheck leave-fails 16
pid=$LAST_PID
FAKEGPU_FAIL="restore:$pid" dump "$pid" "$T/img-leave-fails" --leave-running 2>/dev/null &&
	fail "leave-fails: criu dump --leave-running reported success although pid $pid is not back"
grep -qE "could not return pid $pid to its CUDA state 'running' \(it is now 'checkpointed'\)" "$T/dump.log" ||
	fail "leave-fails: the log does not name pid $pid and its state"
grep -q "A plugin could not return the dumped tasks to the state they were found in" "$T/dump.log" ||
	fail "leave-fails: CRIU did not report the dump failed"
alive "$pid" || fail "leave-fails: the process died"
log "leave-running whose process cannot be returned: the dump fails, naming pid $pid (left checkpointed)"
kill -9 "$pid"
wait_gone "$pid"

# 2. --leave-stopped: the dump succeeds, the process is back running in CUDA terms and stopped; it goes
# on with its data at SIGCONT. CRIU returns at once (the guard does not wait for a stopped process).
start_memcheck leave-stopped 16
pid=$LAST_PID
t0=$SECONDS
dump "$pid" "$T/img-leave-stopped" --leave-stopped || fail "leave-stopped: dump failed"
wait_for "leave-stopped: pid $pid stopped" 10 is_stopped "$pid"
grep -q "all CUDA processes are back as they were found" "$T/dump.log" || fail "leave-stopped: not returned"
sleep 1
kill -CONT "$pid"
wait_for "leave-stopped: pid $pid to run" 20 is_running "$pid"
expect_healthy "$STATE"
log "leave-stopped dump: returned, stopped, goes on at SIGCONT ($((SECONDS - t0)) s)"
kill -9 "$pid"
wait_gone "$pid"

# 3. A stopped CUDA process: refused at once (its restore thread is stopped too), named; it stays stopped
# and goes on at SIGCONT.
start_memcheck stopped 16
pid=$LAST_PID
kill -STOP "$pid"
wait_for "stopped: pid $pid stopped" 10 is_stopped "$pid"
t0=$SECONDS
dump "$pid" "$T/img-stopped" 2>/dev/null && fail "stopped: the dump of a stopped CUDA process succeeded"
[ $((SECONDS - t0)) -lt 10 ] || fail "stopped: the refusal took $((SECONDS - t0)) s"
grep -qE "pid $pid is stopped \(SIGSTOP or a terminal stop\).*kill -CONT $pid" "$T/dump.log" ||
	fail "stopped: the log does not say that pid $pid is stopped"
is_stopped "$pid" || fail "stopped: pid $pid no longer stopped"
kill -CONT "$pid"
wait_for "stopped: pid $pid to run" 20 is_running "$pid"
expect_healthy "$STATE"
log "stopped process: refused in $((SECONDS - t0)) s, named; goes on at SIGCONT"
kill -9 "$pid"
wait_gone "$pid"

# 4. criu restore --leave-stopped: CRIU queues SIGSTOP before the device hook; the GPU state is restored
# all the same, the process left stopped, and it goes on at SIGCONT.
dump_one restore-stopped
t0=$SECONDS
restore "$img" --leave-stopped || fail "restore --leave-stopped failed"
[ $((SECONDS - t0)) -lt 60 ] || fail "restore --leave-stopped took $((SECONDS - t0)) s"
wait_for "restore-stopped: pid $pid stopped" 10 is_stopped "$pid"
grep -q "restore: 1 CUDA process(es), 0 failed" "$T/restore.log" || fail "restore-stopped: no GPU state restored"
kill -CONT "$pid"
wait_for "restore-stopped: pid $pid to run" 20 is_running "$pid"
expect_healthy "$STATE"
log "restore --leave-stopped: GPU state restored in $((SECONDS - t0)) s, stopped, goes on at SIGCONT"
log "ok"
