#!/usr/bin/env bash
# cuda-criu ps, status, lock, checkpoint, restore, unlock, suspend, resume on fake-GPU workloads: the
# states they reach, the data afterwards, several processes at once, timeouts, device maps, errors.
source "$(dirname "$0")/lib.sh"
e2e_strict_setup
start_fake_gpu --gpus 2

states() { local p s=""; for p in "$@"; do s+="$(cuda_state "$p") "; done; echo "${s% }"; }

start_memcheck a 32
a=$LAST_PID; a_state=$STATE
start_memcheck b 16
b=$LAST_PID; b_state=$STATE

# 1. ps: both workloads, running, with their restore threads; nothing else of this test's.
cuda_criu ps >"$T/ps.txt" || fail "ps failed"
head -n1 "$T/ps.txt" | grep -qE '^PID +STATE +RESTORE-TID +COMMAND$' || fail "ps header: $(head -n1 "$T/ps.txt")"
for p in $a $b; do
	tid=$(awk -v p="$p" '$1 == p { print $3 }' "$T/ps.txt")
	grep -qE "^$p +running +[0-9]+ +.*cuda_memcheck --mb" "$T/ps.txt" || fail "ps: no line for $p: $(cat "$T/ps.txt")"
	[ "$(cat "/proc/$p/task/$tid/comm")" = cuda-restore ] || fail "ps: restore tid $tid of $p is not its cuda-restore thread"
done
cuda_criu ps --json >"$T/ps.json" || fail "ps --json failed"
py "p = {x['pid']: x for x in d['processes']}
for pid in ($a, $b):
    assert p[pid]['state'] == 'running' and p[pid]['restore_tid'] > 0 and p[pid]['error'] is None, p[pid]
    assert 'cuda_memcheck' in p[pid]['command'], p[pid]" <"$T/ps.json" || fail "ps --json: $(cat "$T/ps.json")"
log "ps: text and JSON list the CUDA processes with state and restore thread: ok"

# 2. status: one line per pid; JSON; errors for a process without CUDA and for no process at all.
cuda_criu status "$a" "$b" >"$T/status.txt" || fail "status failed"
[ "$(cat "$T/status.txt")" = "$a running"$'\n'"$b running" ] || fail "status: $(cat "$T/status.txt")"
cuda_criu status --json "$a" | py "assert d['processes'][0]['state'] == 'running', d" || fail "status --json"
expect_rc 1 cuda_criu status "$a" $$
grep -q "^$a running$" "$T/out" || fail "status with a bad pid did not print the good one"
grep -q "status pid $$: .*not a CUDA process" "$T/err" || fail "status of a plain process: $(cat "$T/err")"
expect_rc 1 cuda_criu status --json 999999999
py "assert d['processes'][0]['state'] is None and d['processes'][0]['error'] == 'no such process', d" <"$T/out" ||
	fail "status of no process: $(cat "$T/out")"
log "status: states, JSON and errors: ok"

# 3. Each step by hand, one process: it goes through every state and its data survives.
for step in "lock locked" "checkpoint checkpointed" "restore locked" "unlock running"; do
	set -- $step
	cuda_criu "$1" "$a" >"$T/out" || fail "$1 failed"
	[ "$(cat "$T/out")" = "$a $2" ] || fail "$1 printed '$(cat "$T/out")', expected '$a $2'"
	[ "$(cuda_state "$a")" = "$2" ] || fail "after $1: $(cuda_state "$a")"
	# While checkpointed, its device memory is released (the fake daemon forgets it).
	if [ "$1" = checkpoint ]; then cuda_criu ps | grep -qE "^$a +checkpointed " || fail "ps after checkpoint"; fi
done
expect_healthy "$a_state"
log "lock, checkpoint, restore, unlock: each state reached, data intact: ok"

# 4. suspend and resume, two processes at once, from any state, and idempotent.
cuda_criu lock "$b" >/dev/null || fail "lock b"
cuda_criu suspend "$a" "$b" >"$T/out" || fail "suspend of a running and a locked process failed"
[ "$(cat "$T/out")" = "$a checkpointed"$'\n'"$b checkpointed" ] || fail "suspend printed $(cat "$T/out")"
cuda_criu suspend "$a" >/dev/null || fail "suspend of a checkpointed process failed"
[ "$(states "$a" "$b")" = "checkpointed checkpointed" ] || fail "after suspend: $(states "$a" "$b")"
cuda_criu resume --json "$a" "$b" >"$T/out" || fail "resume failed"
py "assert [(p['ok'], p['state']) for p in d['processes']] == [(True, 'running')] * 2, d" <"$T/out" || fail "resume --json"
cuda_criu resume "$a" >/dev/null || fail "resume of a running process failed"
expect_healthy "$a_state"
expect_healthy "$b_state"
log "suspend and resume of two processes at once, from any state: ok"

# 5. A step in the wrong state fails, says why, and names the state the process is left in.
expect_rc 1 cuda_criu checkpoint "$a"
grep -q "checkpoint pid $a: cuCheckpointProcessCheckpoint failed: CUDA_ERROR_ILLEGAL_STATE .*(the process is now running)" \
	"$T/err" || fail "wrong state: $(cat "$T/err")"
[ ! -s "$T/out" ] || fail "a failed step printed on stdout"
expect_rc 1 cuda_criu lock "$a" $$
grep -q "^$a locked$" "$T/out" || fail "lock of a good and a bad pid: the good one not locked"
grep -q "lock pid $$: .*not a CUDA process" "$T/err" || fail "lock of a plain process: $(cat "$T/err")"
cuda_criu unlock "$a" >/dev/null || fail "unlock after partial failure"
log "wrong state and non-CUDA process: clear errors, others still done: ok"

# 6. --timeout: a driver call that hangs is given up after the timeout; the process is left locked and
# resume brings it back. The lock timeout reaches the driver.
cuda_criu lock "$a" >/dev/null || fail "lock for the timeout test"
start_s=$(date +%s%N)
FAKEGPU_HANG=checkpoint FAKEGPU_HANG_MS=20000 expect_rc 1 cuda_criu checkpoint --timeout 1 "$a"
took_ms=$(( ($(date +%s%N) - start_s) / 1000000 ))
[ $took_ms -lt 5000 ] || fail "checkpoint --timeout 1 took $took_ms ms"
grep -q "checkpoint pid $a: no answer from the driver after 1000 ms" "$T/err" || fail "timeout message: $(cat "$T/err")"
[ "$(cuda_state "$a")" = locked ] || fail "after the timed-out checkpoint: $(cuda_state "$a")"
cuda_criu resume "$a" >/dev/null || fail "resume after the timeout"
expect_healthy "$a_state"
expect_rc 2 cuda_criu lock --timeout soon "$a"
grep -q "is not a number of seconds" "$T/err" || fail "bad --timeout: $(cat "$T/err")"
log "--timeout bounds the wait for a hanging driver: ok"

# 7. --device-map: restored onto the other GPU (the fake's device file follows), data intact.
cuda_criu check --json --criu "$CRIU" --libdir "$PLUGIN_DIR" >"$T/check.json" || fail "check failed"
uuids=$(py "print(' '.join(g['uuid'] for g in d['gpus']))" <"$T/check.json")
set -- $uuids
[ $# -eq 2 ] || fail "expected two GPUs, got: $uuids"
ls -l "/proc/$b/fd" | grep -q "$FAKEGPU_DIR/dev/nvidia0\$" || fail "b does not start on GPU 0"
cuda_criu suspend "$b" >/dev/null || fail "suspend b"
cuda_criu restore --device-map "$1=$2" "$b" >"$T/out" || fail "restore --device-map failed"
[ "$(cat "$T/out")" = "$b locked" ] || fail "restore --device-map printed $(cat "$T/out")"
cuda_criu unlock "$b" >/dev/null || fail "unlock after the remap"
ls -l "/proc/$b/fd" | grep -q "$FAKEGPU_DIR/dev/nvidia1\$" || fail "b is not on GPU 1 after the remap: $(ls -l /proc/$b/fd)"
expect_healthy "$b_state"
# By index (the driver's ordinals): back onto GPU 0.
cuda_criu suspend "$b" >/dev/null || fail "suspend b (2)"
cuda_criu resume --device-map 1=0 "$b" >/dev/null || fail "resume --device-map 1=0: $(cat "$T/err")"
ls -l "/proc/$b/fd" | grep -q "$FAKEGPU_DIR/dev/nvidia0\$" || fail "b is not on GPU 0 after the map by index: $(ls -l /proc/$b/fd)"
expect_healthy "$b_state"
expect_rc 2 cuda_criu restore --device-map 0=7 "$b"
grep -q "there is no GPU 7 here (2 GPU(s))" "$T/err" || fail "map onto a missing index: $(cat "$T/err")"
expect_rc 2 cuda_criu restore --device-map "$1" "$b"
grep -q "is not OLD=NEW" "$T/err" || fail "bad map: $(cat "$T/err")"
expect_rc 2 cuda_criu lock --device-map "$1=$2" "$b"
log "--device-map by UUID and by index restores onto another GPU; bad maps refused: ok"

# 8. resume while another caller acts on the same process (the dump guard returns a process that a failed
# dump left behind while the dump's log tells the user to run cuda-criu resume): the driver refuses a call
# while another one is in progress (CUDA_ERROR_ILLEGAL_STATE), and resume takes the process again from its
# state then, to running. Here the other caller is a cuda-criu restore of a slow copy (1.5 s).
FAKEGPU_COPY_MBPS=32 start_memcheck slow 48
slow=$LAST_PID
cuda_criu suspend "$slow" >/dev/null || fail "suspend of the slowly copying process failed"
cuda_criu restore "$slow" >"$T/other.out" 2>&1 &
other=$!
sleep 0.3
cuda_criu resume "$slow" >"$T/resume.out" 2>&1 || fail "resume alongside another restore failed: $(cat "$T/resume.out")"
wait "$other" || fail "the other restore failed: $(cat "$T/other.out")"
[ "$(cuda_state "$slow")" = running ] || fail "after resume alongside a restore: $(cuda_state "$slow")"
expect_healthy "$STATE"
kill -9 "$slow"
wait_gone "$slow"
log "resume alongside another caller's restore: waits it out, then running, data intact: ok"

# 9. Usage errors.
expect_rc 2 cuda_criu lock
expect_rc 2 cuda_criu unlock 12x
expect_rc 2 cuda_criu frobnicate 1
grep -q "unknown command 'frobnicate'" "$T/err" || fail "unknown command message"
[ "$(states "$a" "$b")" = "running running" ] || fail "final states: $(states "$a" "$b")"
log PASS
