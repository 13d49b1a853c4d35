#!/usr/bin/env bash
# cuda-criu roundtrip when the program does not survive, or the round trip cannot be tried: a program
# holding a TCP connection to a peer outside its tree (CRIU refuses it: exit 1, CRIU's error and a hint
# shown); a program that crashes after the restore (the health step fails and says how it ended); a
# failing GPU checkpoint (the plugin's error shown); SIGTERM to the round trip itself mid-cycle and
# mid-start (nothing left running, nothing left on disk); setup failures (exit 3: a --dir others can
# write to among them) and bad usage (exit 2).
source "$(dirname "$0")/lib.sh"
e2e_strict_setup
start_fake_gpu
export TMPDIR=$T/tmp
mkdir -p "$TMPDIR"
# sleep under a name of this run's own: the checks that nothing is left running look for processes by
# their command line, and another run of this test (or what an earlier one left) has its own.
NAP=$T/nap
ln -s "$(command -v sleep)" "$NAP"

RT=("$CUDA_CRIU" roundtrip --criu "$CRIU" --libdir "$PLUGIN_DIR")
WORKLOAD=(env "LD_LIBRARY_PATH=$(dirname "$FAKE_LIB")" "$MEMCHECK" --mb 16 --interval-ms 20)

expect_clean() { # WHAT PATTERN: no process matching PATTERN and no temporary directory is left
	local left
	left=$(pgrep -f -- "$2" || true)
	[ -z "$left" ] || fail "$1: processes left running: $(ps -o pid=,args= -p "$(echo $left | tr ' ' ,)")"
	[ -z "$(ls -A "$TMPDIR")" ] || fail "$1: left in \$TMPDIR: $(ls -A "$TMPDIR")"
}
# expect_fail FILE CYCLE STEP PATTERN: the step's FAIL line matches PATTERN.
expect_fail() {
	grep -qE "^ +$2  $3 +FAIL +[0-9]+\.[0-9]{2} s  $4" "$1" || fail "no FAIL line for $2 $3 matching '$4': $(cat "$1")"
}

# 1. Not checkpointable: an established TCP connection to a listener outside the program's tree.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start peer python3 -c "
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', $port)); s.listen(1)
open('$T/peer.ready', 'w').close()
held = [s.accept()[0] for _ in range(8)]
time.sleep(3600)
"
peer=$LAST_PID
wait_for "the peer to listen" 10 test -f "$T/peer.ready"
rc=0
"${RT[@]}" --ready-file "$T/tcp.ready" --json "$T/tcp.json" --junit "$T/tcp.xml" -- python3 -c "
import socket, time
c = socket.create_connection(('127.0.0.1', $port))
open('$T/tcp.ready', 'w').close()
while True:
    time.sleep(0.05)
" >"$T/tcp.txt" 2>&1 || rc=$?
[ $rc -eq 1 ] || fail "a program with a TCP connection: exit $rc, not 1: $(cat "$T/tcp.txt")"
expect_fail "$T/tcp.txt" 1 dump "criu dump exited with status 1"
grep -q 'Error (criu/sk-inet.c:[0-9]*): inet: Connected TCP socket, consider using --tcp-established' "$T/tcp.txt" ||
	fail "CRIU's error not shown: $(cat "$T/tcp.txt")"
grep -qE '^ +hint: the program holds an established TCP connection.*--criu-arg --tcp-established' "$T/tcp.txt" ||
	fail "no hint"
grep -qE '^FAIL  roundtrip python3: cycle 1: dump: criu dump exited with status 1' "$T/tcp.txt" || fail "no FAIL line"
alive "$peer" || fail "the peer outside the tree was killed"
python3 - "$T/tcp.json" "$T/tcp.xml" <<'EOF' || fail "reports of the failure: $(cat "$T/tcp.json" "$T/tcp.xml")"
import json, sys, xml.etree.ElementTree as ET
d = json.load(open(sys.argv[1]))
assert d["result"] == "fail" and d["exit_status"] == 1, d
f = d["failure"]
assert (f["cycle"], f["step"]) == (1, "dump") and "--tcp-established" in f["hint"], f
dump = d["steps"][2]
assert any("Connected TCP socket" in l for b in dump["log"] for l in b["lines"]), dump
assert [s["result"] for s in d["steps"]] == ["ok", "ok", "fail", "skipped", "skipped", "skipped"]
suite = ET.parse(sys.argv[2]).getroot()
assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("6", "1", "3"), suite.attrib
failure = suite.find("testcase[@name='cycle 1: dump']/failure")
assert failure is not None and failure.get("message") == "criu dump exited with status 1", failure
assert "Connected TCP socket" in failure.text and "hint: " in failure.text, failure.text
assert suite.find("testcase[@name='cycle 1: restore']/skipped") is not None
EOF
kill -9 "$peer"
expect_clean "TCP connection" "create_connection..'127.0.0.1', $port"
log "established TCP connection: exit 1, CRIU's error and the hint shown, reports say so, cleaned up: ok"

# 2. A program that crashes after its restore: it aborts a second after the health command has run in
#    the restore phase (leaving $T/crash.go), so within --settle. Not at a time counted from the restore:
#    the health step can start only once CRIU has exited after resuming the tree and the round trip has
#    read its pidfile and log, however long a loaded machine takes for that; a program dead by then fails
#    the restore step, or the health step before the program was seen healthy. Were the round trip still
#    a second late, the health step fails all the same, naming the signal.
rc=0
"${RT[@]}" --dir "$T/crash" --ready-file "$T/crash.ready" --settle 30 \
	--health-cmd '[ "$ROUNDTRIP_PHASE" != restore ] || touch '"$T/crash.go" -- python3 -c "
import os, time
while not os.path.exists('$T/crash.go'):
    open('$T/crash.ready', 'w').close()
    time.sleep(0.05)
time.sleep(1)
os.abort()
" >"$T/crash.txt" 2>&1 || rc=$?
[ $rc -eq 1 ] || fail "a crash after the restore: exit $rc, not 1: $(cat "$T/crash.txt")"
grep -qE '^ +1  restore +ok' "$T/crash.txt" || fail "restore not ok: $(cat "$T/crash.txt")"
expect_fail "$T/crash.txt" 1 health "(the health command passed, then )?the program \(pid [0-9]+\) was killed by signal 6 \(Aborted\)"
grep -qE '^FAIL  roundtrip python3: cycle 1: health: ' "$T/crash.txt" || fail "no FAIL line"
[ ! -e "$T/crash" ] || fail "--dir $T/crash not removed"
expect_clean "crash" "$T/crash.go"
log "crash after the restore: the health step fails and says how the program ended: ok"

# 3. The GPU checkpoint fails: the plugin's error is among the lines shown.
rc=0
FAKEGPU_FAIL=checkpoint "${RT[@]}" --ready-file "$T/ckfail.state" -- "${WORKLOAD[@]}" --state "$T/ckfail.state" \
	>"$T/ckfail.txt" 2>&1 || rc=$?
[ $rc -eq 1 ] || fail "a failing checkpoint: exit $rc: $(cat "$T/ckfail.txt")"
expect_fail "$T/ckfail.txt" 1 dump "criu dump exited with status 1"
grep -qE 'Error \(cuda_plugin\): .*cuCheckpointProcessCheckpoint failed' "$T/ckfail.txt" || fail "the plugin's error not shown"
expect_clean "failing checkpoint" "$T/ckfail.state"
log "failing GPU checkpoint: the plugin's error shown: ok"

# 4. SIGTERM to the round trip after a restore (while the health command keeps failing): it stops, kills
# the restored program, removes its directory, writes its reports, and ends by SIGTERM.
"${RT[@]}" --ready-file "$T/term.state" --health-cmd '[ "$ROUNDTRIP_PHASE" = start ]' --json "$T/term.json" \
	-- "${WORKLOAD[@]}" --state "$T/term.state" >"$T/term.txt" 2>&1 &
rt=$!
wait_for "the restore" 30 grep -qE '^ +1  restore +ok' "$T/term.txt"
sleep 0.5
kill -TERM "$rt"
rc=0
wait "$rt" || rc=$?
[ $rc -eq 143 ] || fail "after SIGTERM: exit $rc, not 143: $(cat "$T/term.txt")"
expect_fail "$T/term.txt" 1 health "interrupted by SIGTERM"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['result'] == 'interrupted', d" "$T/term.json" ||
	fail "JSON after SIGTERM: $(cat "$T/term.json")"
expect_clean "SIGTERM after a restore" "$T/term.state"

# ... and while it waits for a program tree that never gets ready.
"${RT[@]}" --ready-file "$T/never" -- sh -c "$NAP 1001 & $NAP 1001 & wait" >"$T/term2.txt" 2>&1 &
rt=$!
wait_for "the program" 10 pgrep -fx "$NAP 1001"
sleep 0.2
kill -TERM "$rt"
rc=0
wait "$rt" || rc=$?
[ $rc -eq 143 ] || fail "after SIGTERM at the start: exit $rc: $(cat "$T/term2.txt")"
expect_fail "$T/term2.txt" - start "interrupted by SIGTERM"
expect_clean "SIGTERM at the start" "$NAP 1001"
log "SIGTERM mid-cycle and mid-start: nothing left running or on disk: ok"

# 5. The round trip cannot be tried (exit 3), or is asked wrongly (exit 2).
CRIU_ROOT=$(cd "$(dirname "$CRIU")/.." && pwd)
rc=0
"$CUDA_CRIU" roundtrip --criu "$CRIU" --libdir "$CRIU_ROOT/lib/criu-intree" --ready-delay 1 -- "$NAP" 5.25 >"$T/intree.txt" 2>&1 || rc=$?
[ $rc -eq 3 ] || fail "CRIU's own plugin in --libdir: exit $rc: $(cat "$T/intree.txt")"
expect_fail "$T/intree.txt" - setup ".*is CRIU's own CUDA plugin"
grep -qE '^ERROR  roundtrip nap: setup: ' "$T/intree.txt" || fail "no ERROR line: $(cat "$T/intree.txt")"
rc=0
"${RT[@]}" --ready-file "$T/none" -- sh -c 'echo giving up; exit 4' >"$T/exit.txt" 2>&1 || rc=$?
[ $rc -eq 3 ] || fail "a program that ends at once: exit $rc"
expect_fail "$T/exit.txt" - start "the program \(pid [0-9]+\) exited with status 4 before it was ready"
grep -q "giving up" "$T/exit.txt" || fail "the program's output not shown: $(cat "$T/exit.txt")"
rc=0
"${RT[@]}" --ready-file "$T/none" --start-timeout 0.5 -- "$NAP" 5.25 >"$T/slow.txt" 2>&1 || rc=$?
[ $rc -eq 3 ] && expect_fail "$T/slow.txt" - start "the program was not ready within 0.5 s: $T/none did not appear" ||
	fail "a program not ready in time: exit $rc: $(cat "$T/slow.txt")"
# A --dir another user could write to is refused, and left as it was: its owner could plant links or
# swap the images between the dump and the restore.
mkdir -m 0777 "$T/open"
mkdir -m 0700 "$T/theirs" "$T/mine"
chown nobody "$T/theirs"
ln -s "$T/mine" "$T/link"
for d in open theirs link; do
	rc=0
	"${RT[@]}" --dir "$T/$d" --ready-delay 1 -- "$NAP" 5.25 >"$T/dir-$d.txt" 2>&1 || rc=$?
	[ $rc -eq 3 ] || fail "--dir $d: exit $rc, not 3: $(cat "$T/dir-$d.txt")"
	[ -z "$(ls -A "$T/$d/")" ] || fail "--dir $d: files made in it: $(ls -A "$T/$d/")"
done
expect_fail "$T/dir-open.txt" - setup "--dir $T/open is writable by others \(mode 0777\): .*mkdir -m 700"
expect_fail "$T/dir-theirs.txt" - setup "--dir $T/theirs is owned by uid [0-9]+, not by you: "
expect_fail "$T/dir-link.txt" - setup "--dir $T/link is a symbolic link"
expect_clean "setup failures" "$NAP 5.25"
usage() { # EXPECTED-MESSAGE ARGS...
	local want=$1 rc=0
	shift
	"$CUDA_CRIU" roundtrip "$@" >"$T/usage.txt" 2>&1 || rc=$?
	[ $rc -eq 2 ] && grep -q -- "$want" "$T/usage.txt" || fail "roundtrip $*: exit $rc: $(cat "$T/usage.txt")"
}
usage "no program given" --ready-delay 1
usage "give one of" --ready-delay 1 --ready-file x -- true
usage "say how to see that the program is ready" -- true
usage "the round trip sets that option" --ready-delay 1 --criu-arg -R -- true
usage "is not NAME=VALUE" --ready-delay 1 --criu-env FOO -- true
usage "not a whole number" --repeat 0 --ready-delay 1 -- true
usage "must be more than 0" --dump-timeout 0 --ready-delay 1 -- true
usage "not a regular expression" --ready-log '(' -- true
"$CUDA_CRIU" roundtrip --help >"$T/help.txt" && grep -q -- "--leave-running" "$T/help.txt" || fail "roundtrip --help"
log "setup failures (exit 3) and bad usage (exit 2): ok"
log PASS
