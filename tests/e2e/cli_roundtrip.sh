#!/usr/bin/env bash
# cuda-criu roundtrip against the fake GPU with real CRIU, the cases that pass: one cycle of the
# cuda_memcheck workload with a health command, its JSON and JUnit reports; --repeat 3; --leave-running;
# --device-map with --keep-images; readiness by output line and by TCP port; ended processes reaped each
# cycle. Each run leaves no process and no file behind.
source "$(dirname "$0")/lib.sh"
e2e_strict_setup
start_fake_gpu --gpus 2
# The round trip's own temporary directories go here, to be looked for afterwards.
export TMPDIR=$T/tmp
mkdir -p "$TMPDIR"

RT=("$CUDA_CRIU" roundtrip --criu "$CRIU" --libdir "$PLUGIN_DIR")
# The workload finds the fake libcuda through env(1), which execs it: the program's pid is the workload's.
WORKLOAD=(env "LD_LIBRARY_PATH=$(dirname "$FAKE_LIB")" "$MEMCHECK" --mb 32 --interval-ms 20)
# healthy.sh STATE: the workload counts on, has found no error, and is the process the round trip checks.
cat >"$T/healthy.sh" <<'EOF'
it() { sed -n 's/^iterations=//p' "$1"; }
a=$(it "$1"); sleep 0.3; b=$(it "$1")
grep -qx status=ok "$1" && [ "${b:-0}" -gt "${a:-0}" ] && [ "$(sed -n 's/^pid=//p' "$1")" = "$ROUNDTRIP_PID" ]
EOF
health() { echo "sh $T/healthy.sh $1"; }

# expect_steps FILE CYCLE STEP...: each step has an "ok" line with a time.
expect_steps() {
	local f=$1 c=$2 s
	shift 2
	for s in "$@"; do
		grep -qE "^ +$c  $s +ok +[0-9]+\.[0-9]{2} s  " "$f" || fail "cycle $c step $s not ok: $(cat "$f")"
	done
}
# expect_clean WHAT PATTERN: no process matching PATTERN and no temporary directory is left.
expect_clean() {
	local left
	left=$(pgrep -f -- "$2" || true)
	[ -z "$left" ] || fail "$1: processes left running: $(ps -o pid=,args= -p "$(echo $left | tr ' ' ,)")"
	[ -z "$(ls -A "$TMPDIR")" ] || fail "$1: left in \$TMPDIR: $(ls -A "$TMPDIR")"
}

# 1. One cycle, reported as a table, JSON and JUnit XML.
rc=0
"${RT[@]}" --ready-file "$T/one.state" --health-cmd "$(health "$T/one.state")" --require-cuda \
	--json "$T/one.json" --junit "$T/one.xml" -- "${WORKLOAD[@]}" --state "$T/one.state" >"$T/one.txt" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "round trip exited $rc: $(cat "$T/one.txt")"
expect_steps "$T/one.txt" - setup start
expect_steps "$T/one.txt" 1 dump exit restore health
grep -qE '^ +1  dump +ok .*image [0-9.]+ MiB, GPU state 32\.0 MiB of 1 CUDA process' "$T/one.txt" || fail "dump line"
grep -qE '^ +1  restore +ok .*the plugin restored 1 CUDA process' "$T/one.txt" || fail "restore line"
grep -qE '^PASS  roundtrip cuda_memcheck: 1 cycle\(s\)' "$T/one.txt" || fail "no PASS line: $(cat "$T/one.txt")"
python3 - "$T/one.json" <<'EOF' || fail "JSON report: $(cat "$T/one.json")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["result"] == "pass" and d["exit_status"] == 0 and d["failure"] is None, d
steps = [(s["cycle"], s["step"], s["result"]) for s in d["steps"]]
assert steps == [(None, "setup", "ok"), (None, "start", "ok"), (1, "dump", "ok"), (1, "exit", "ok"),
                 (1, "restore", "ok"), (1, "health", "ok")], steps
dump = d["steps"][2]
assert 32 << 20 <= dump["gpu_state_bytes"] < 33 << 20 and dump["cuda_processes"] == 1, dump
assert dump["image_bytes"] > 32 << 20, dump
assert all(s["seconds"] >= 0 for s in d["steps"])
assert d["command"][-2:] == ["--state", sys.argv[1][:-5] + ".state"], d["command"]
EOF
python3 - "$T/one.xml" <<'EOF' || fail "JUnit report: $(cat "$T/one.xml")"
import sys, xml.etree.ElementTree as ET
suite = ET.parse(sys.argv[1]).getroot()
assert suite.tag == "testsuite", suite.tag
assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("6", "0", "0"), suite.attrib
cases = suite.findall("testcase")
assert [c.get("name") for c in cases] == ["setup", "start", "cycle 1: dump", "cycle 1: exit",
                                          "cycle 1: restore", "cycle 1: health"], [c.get("name") for c in cases]
assert all(c.find("failure") is None and float(c.get("time")) >= 0 for c in cases)
assert "GPU state 32.0 MiB" in cases[2].find("system-out").text
EOF
expect_clean "one cycle" "$T/one.state"
log "one cycle: every step ok, JSON and JUnit reports valid, nothing left: ok"

# 2. Three cycles of the same process. The plugin finds the fake libcuda only through --criu-env, which
# sets CRIU's environment and nobody else's.
rc=0
env -u CUDA_CRIU_LIBCUDA "${RT[@]}" --repeat 3 --criu-env "CUDA_CRIU_LIBCUDA=$FAKE_LIB" --require-cuda \
	--ready-file "$T/three.state" --health-cmd "$(health "$T/three.state") && [ -z \"\$CUDA_CRIU_LIBCUDA\" ]" \
	-- "${WORKLOAD[@]}" --state "$T/three.state" >"$T/three.txt" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "--repeat 3 exited $rc: $(cat "$T/three.txt")"
for c in 1 2 3; do expect_steps "$T/three.txt" $c dump exit restore health; done
[ "$(grep -cE '^ +[0-9]+  restore +ok .*the plugin restored 1 CUDA process' "$T/three.txt")" -eq 3 ] || fail "not 3 restores"
pid=$(sed -n 's/^ *-  start .* pid \([0-9]*\) ready.*/\1/p' "$T/three.txt")
[ "$(grep -c "pid $pid healthy after the restore" "$T/three.txt")" -eq 3 ] || fail "not the same pid 3 times"
grep -qE '^PASS  roundtrip cuda_memcheck: 3 cycle\(s\)' "$T/three.txt" || fail "no PASS line"
grep -qE '^ +dump +median [0-9.]+ s, min [0-9.]+ s, max [0-9.]+ s over 3 cycles' "$T/three.txt" || fail "no dump times"
expect_clean "--repeat 3" "$T/three.state"
log "--repeat 3, the driver named through --criu-env: ok"

# 3. --leave-running: the dumped process runs on, healthy; then it is killed and restored from the image.
rc=0
"${RT[@]}" --leave-running --ready-file "$T/leave.state" --health-cmd "$(health "$T/leave.state")" \
	-- "${WORKLOAD[@]}" --state "$T/leave.state" >"$T/leave.txt" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "--leave-running exited $rc: $(cat "$T/leave.txt")"
expect_steps "$T/leave.txt" 1 dump running kill restore health
grep -qE '^ +1  running +ok .*kept running after the dump: the health command passed' "$T/leave.txt" || fail "running line"
! grep -qE '^ +1  exit ' "$T/leave.txt" || fail "an exit step with --leave-running"
expect_clean "--leave-running" "$T/leave.state"
log "--leave-running: ok"

# 4. --device-map onto the second GPU, images kept in --dir.
rc=0
"${RT[@]}" --device-map 0=1 --keep-images --dir "$T/kept" --ready-file "$T/map.state" \
	--health-cmd "$(health "$T/map.state")" -- "${WORKLOAD[@]}" --state "$T/map.state" >"$T/map.txt" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "--device-map exited $rc: $(cat "$T/map.txt")"
grep -qE '^ +1  restore +ok .*device map 0=1' "$T/map.txt" || fail "restore line: $(cat "$T/map.txt")"
grep -q "^work directory kept: $T/kept\$" "$T/map.txt" || fail "kept directory not named"
expect_log "$T/kept/images-1/restore.log" "restoring with GPU pairs: .*device map" "no remap in the restore log"
[ -f "$T/kept/images-1/cuda-plugin.img" ] && [ -f "$T/kept/program.log" ] || fail "--keep-images: files missing"
cuda_criu inspect "$T/kept/images-1" >"$T/inspect.txt"
grep -qE ' running +32\.0 MiB ' "$T/inspect.txt" || fail "the kept image does not inspect: $(cat "$T/inspect.txt")"
rm -rf "$T/kept"
expect_clean "--device-map" "$T/map.state"
log "--device-map 0=1 with --keep-images: ok"

# 5. Readiness by an output line, and by a TCP port (plain programs: CRIU and no GPU).
rc=0
"${RT[@]}" --ready-log '^tick [0-9]+$' -- sh -c 'i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.05; done' \
	>"$T/log.txt" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "--ready-log exited $rc: $(cat "$T/log.txt")"
grep -qE '^ +1  health +ok .*its output matched: tick [0-9]+' "$T/log.txt" || fail "health line: $(cat "$T/log.txt")"
expect_clean "--ready-log" "echo tick"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
rc=0
"${RT[@]}" --ready-port "$port" --repeat 2 -- python3 -c "
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', $port)); s.listen(8)
while True:
    c, _ = s.accept(); c.recv(1); c.close()
" >"$T/port.txt" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "--ready-port exited $rc: $(cat "$T/port.txt")"
grep -qE "^ +2  health +ok .*127\.0\.0\.1:$port accepts connections" "$T/port.txt" || fail "health line: $(cat "$T/port.txt")"
expect_clean "--ready-port" "s.bind..'127.0.0.1', $port"
log "--ready-log and --ready-port: ok"
# 6. What ends during a cycle (the plugin's guard processes, reparented to the round trip) is reaped in
# that cycle: at the health check of the last cycle, no zombie of an earlier cycle is left (a long
# --repeat must not pile up zombies). The health command counts the round trip's zombie children.
rc=0
"${RT[@]}" --repeat 4 --ready-file "$T/reap.state" \
	--health-cmd "echo \$ROUNDTRIP_CYCLE \$(ps --ppid \$PPID -o stat= | grep -c '^Z') >>$T/zombies.txt; $(health "$T/reap.state")" \
	-- "${WORKLOAD[@]}" --state "$T/reap.state" >"$T/reap.txt" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "--repeat 4 exited $rc: $(cat "$T/reap.txt")"
# Cycle 1 has the zombies of its own guards (the test sees them, or it would show nothing); cycle 4 no more.
first=$(awk '$1 == 1 {print $2}' "$T/zombies.txt")
last=$(awk '$1 == 4 {print $2}' "$T/zombies.txt")
[ "${first:-0}" -ge 1 ] || fail "no zombie seen in cycle 1 (are the plugin's guards still reparented here?): $(cat "$T/zombies.txt")"
[ "${last:-99}" -le "$first" ] || fail "zombies pile up over the cycles: $(cat "$T/zombies.txt")"
expect_clean "zombies" "$T/reap.state"
log "ended processes reaped each cycle: ok"
log PASS
