#!/usr/bin/env bash
# Progress in cuda-criu (docs/cli.md, docs/roundtrip.md): a suspend and a resume whose copies run at
# 48 MB/s show progress lines on stderr, as plain lines when stderr is no terminal and as one line
# rewritten in place on a terminal; a copy that stops making progress is given up after the stall
# timeout; a round trip and a selftest of such a workload show the plugin's progress lines from CRIU's log.
source "$(dirname "$0")/lib.sh"
e2e_strict_setup
start_fake_gpu
export TMPDIR=$T/tmp
mkdir -p "$TMPDIR"
# cuda-criu reads each process's GPU memory through NVML: the fake one asks the fake GPU daemon.
CLI_ENV=(env "LD_LIBRARY_PATH=$(dirname "$FAKE_LIB"):$FAKE_NVML_DIR" "CUDA_CRIU_LIBCUDA=$FAKE_LIB")
criu_cli() { "${CLI_ENV[@]}" "$CUDA_CRIU" "$@"; }
# on_tty FILE CMD...: CMD run on a terminal (a pty of script(1)), what it showed there in FILE.
on_tty() { local f=$1; shift; script -qefc "$(printf '%q ' "$@")" /dev/null >"$f" </dev/null; }
# rewritten FILE TEXT: a line of FILE shows TEXT at least twice, each time after a carriage return.
rewritten() { python3 - "$1" "$2" <<'EOF'
import sys
data = open(sys.argv[1], encoding="utf-8", errors="replace", newline="").read()
sys.exit(0 if any(l.count("\r" + sys.argv[2]) >= 2 for l in data.split("\n")) else 1)
EOF
}
# erased FILE TEXT: wherever FILE shows TEXT in place, the line is erased after it (before a new line).
erased() { python3 - "$1" "$2" <<'EOF'
import sys
data = open(sys.argv[1], encoding="utf-8", errors="replace", newline="").read()
lines = [l for l in data.split("\n") if "\r" + sys.argv[2] in l]
sys.exit(0 if lines and all("\r\033[K" in l.rsplit("\r" + sys.argv[2], 1)[1] for l in lines) else 1)
EOF
}
SLOW=256 # MiB, copied at 48 MB/s: about 5.6 s each way
PLAIN_CK="^cuda-criu: checkpoint: [0-9]+ of $SLOW MiB \([0-9.]+ [MG]B/s\), 0 of 1 process\(es\) done$"
PLAIN_RS="^cuda-criu: restore: [0-9]+ MiB \([0-9.]+ [MG]B/s\), 0 of 1 process\(es\) done$"

# 1. Not a terminal: plain lines, the checkpoint's against the GPU memory NVML reported; the restore's
# without a total. The results on stdout are as without progress.
export FAKEGPU_COPY_MBPS=48
start_memcheck slow $SLOW
pid=$LAST_PID
criu_cli suspend "$pid" >"$T/out" 2>"$T/err" || fail "slow suspend failed: $(cat "$T/err")"
[ "$(cat "$T/out")" = "$pid checkpointed" ] || fail "suspend printed $(cat "$T/out")"
grep -qE "$PLAIN_CK" "$T/err" || fail "suspend: no checkpoint progress line: $(cat "$T/err")"
! grep -q $'\r' "$T/err" || fail "suspend: a carriage return in plain progress: $(cat -A "$T/err")"
n_ck=$(grep -cE "$PLAIN_CK" "$T/err")
criu_cli resume "$pid" >"$T/out" 2>"$T/err" || fail "slow resume failed: $(cat "$T/err")"
[ "$(cat "$T/out")" = "$pid running" ] || fail "resume printed $(cat "$T/out")"
grep -qE "$PLAIN_RS" "$T/err" || fail "resume: no restore progress line: $(cat "$T/err")"
expect_healthy "$STATE"
log "plain: $n_ck checkpoint and $(grep -cE "$PLAIN_RS" "$T/err") restore progress lines: ok"

# 2. A terminal: one line rewritten in place, erased at the end, before the result.
on_tty "$T/tty.txt" "${CLI_ENV[@]}" "$CUDA_CRIU" suspend "$pid" || fail "suspend on a tty failed: $(cat -A "$T/tty.txt")"
rewritten "$T/tty.txt" "cuda-criu: checkpoint: " || fail "suspend on a tty: no line rewritten in place: $(cat -A "$T/tty.txt")"
grep -q $'\r\033\[K'"$pid checkpointed" "$T/tty.txt" || fail "suspend on a tty: the line is not erased before the result: $(cat -A "$T/tty.txt")"
on_tty "$T/tty.txt" "${CLI_ENV[@]}" "$CUDA_CRIU" resume "$pid" || fail "resume on a tty failed: $(cat -A "$T/tty.txt")"
rewritten "$T/tty.txt" "cuda-criu: restore: " || fail "resume on a tty: no line rewritten in place: $(cat -A "$T/tty.txt")"
# The cuda-checkpoint command line shows it too, under its own name.
on_tty "$T/tty.txt" "${CLI_ENV[@]}" "$BUILD_DIR/bin/cuda-checkpoint" --toggle --pid "$pid" ||
	fail "cuda-checkpoint --toggle on a tty failed: $(cat -A "$T/tty.txt")"
rewritten "$T/tty.txt" "cuda-checkpoint: checkpoint: " || fail "cuda-checkpoint: no line rewritten in place: $(cat -A "$T/tty.txt")"
criu_cli resume "$pid" >/dev/null 2>&1 || fail "resume after the toggle failed"
expect_healthy "$STATE"
log "terminal: lines rewritten in place, also as cuda-checkpoint: ok"

# 3. A fast call shows nothing.
kill -9 "$pid"; wait_gone "$pid"
unset FAKEGPU_COPY_MBPS
start_memcheck fast 16
pid=$LAST_PID
criu_cli suspend "$pid" >"$T/out" 2>"$T/err" || fail "fast suspend failed: $(cat "$T/err")"
criu_cli resume "$pid" >>"$T/out" 2>>"$T/err" || fail "fast resume failed: $(cat "$T/err")"
[ ! -s "$T/err" ] || fail "a fast suspend and resume printed progress: $(cat "$T/err")"
kill -9 "$pid"; wait_gone "$pid"
log "fast: no progress shown: ok"

# 4. A stall: the copy stops at 32 MiB for 6 s; with a stall timeout of 1.5 s cuda-criu gives up within
# a few seconds, naming the process (the fake driver, as the real one, maps its whole buffer with MAP_POPULATE,
# so the bytes named are the buffer's); once the driver goes on, resume brings it back.
export FAKEGPU_COPY_MBPS=64 FAKEGPU_STALL_AFTER_MB=32 FAKEGPU_STALL_MS=6000
start_memcheck stall 128
unset FAKEGPU_COPY_MBPS FAKEGPU_STALL_AFTER_MB FAKEGPU_STALL_MS
pid=$LAST_PID
t0=$EPOCHREALTIME
CUDA_CRIU_STALL_TIMEOUT=1.5 expect_rc 1 criu_cli suspend "$pid"
secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
grep -qE "suspend pid $pid: .*the driver's checkpoint made no progress for [0-9] s .*stopped at [0-9]+ of 128 MiB.*CUDA_CRIU_STALL_TIMEOUT" "$T/err" ||
	fail "stall: not named: $(cat "$T/err")"
awk -v s="$secs" 'BEGIN { exit !(s < 5) }' || fail "stall: cuda-criu took $secs s to give up"
is_checkpointed() { [ "$(cuda_state "$1")" = checkpointed ]; }
wait_for "stall: pid $pid checkpointed once the driver went on" 30 is_checkpointed "$pid"
criu_cli resume "$pid" >/dev/null || fail "stall: resume failed"
healthy_then_gone
log "stall: given up after $secs s, resumed afterwards: ok"

# 5. A round trip of a slow workload: the plugin's progress lines of the dump and of the restore, plain
# and, on a terminal, in place.
RT=("${CLI_ENV[@]}" "$CUDA_CRIU" roundtrip --criu "$CRIU" --libdir "$PLUGIN_DIR")
WORKLOAD=(env "LD_LIBRARY_PATH=$(dirname "$FAKE_LIB")" FAKEGPU_COPY_MBPS=48 "$MEMCHECK" --mb $SLOW --interval-ms 20)
"${RT[@]}" --ready-file "$T/rt.state" -- "${WORKLOAD[@]}" --state "$T/rt.state" >"$T/rt.txt" 2>&1 ||
	fail "slow round trip failed: $(cat "$T/rt.txt")"
grep -qE "^cuda-criu: criu dump: checkpoint: [0-9]+ of $SLOW MiB \([0-9.]+ [MG]B/s\), 0 of 1 process\(es\) done$" "$T/rt.txt" ||
	fail "round trip: no checkpoint progress: $(cat "$T/rt.txt")"
grep -qE "^cuda-criu: criu restore: restore: [0-9]+ of [0-9]+ MiB \([0-9.]+ [MG]B/s\), 0 of 1 process\(es\) done$" "$T/rt.txt" ||
	fail "round trip: no restore progress: $(cat "$T/rt.txt")"
grep -qE '^PASS  roundtrip' "$T/rt.txt" || fail "round trip: no PASS line: $(cat "$T/rt.txt")"
on_tty "$T/rt-tty.txt" "${RT[@]}" --ready-file "$T/rt2.state" -- "${WORKLOAD[@]}" --state "$T/rt2.state" ||
	fail "slow round trip on a tty failed: $(cat -A "$T/rt-tty.txt")"
grep -q $'\r'"cuda-criu: criu dump: checkpoint: [0-9]* of $SLOW MiB" "$T/rt-tty.txt" ||
	fail "round trip on a tty: no progress in place: $(cat -A "$T/rt-tty.txt")"
erased "$T/rt-tty.txt" "cuda-criu: criu " ||
	fail "round trip on a tty: a progress line was left on its own line: $(cat -A "$T/rt-tty.txt")"
log "round trip: the plugin's progress shown, plain and in place: ok"

# 6. selftest shows the plugin's progress the same way (its workload copies at 48 MB/s too).
FAKEGPU_COPY_MBPS=48 "${CLI_ENV[@]}" "$CUDA_CRIU" selftest --criu "$CRIU" --libdir "$PLUGIN_DIR" --mb $SLOW --dir "$T" \
	>"$T/selftest.txt" 2>&1 || fail "slow selftest failed: $(cat "$T/selftest.txt")"
grep -qE "^cuda-criu: criu dump: checkpoint: [0-9]+ of $SLOW MiB \([0-9.]+ [MG]B/s\), 0 of 1 process\(es\) done$" "$T/selftest.txt" ||
	fail "selftest: no checkpoint progress: $(cat "$T/selftest.txt")"
grep -qE "^cuda-criu: criu restore: restore: " "$T/selftest.txt" || fail "selftest: no restore progress: $(cat "$T/selftest.txt")"
log "selftest: the plugin's progress shown: ok"
