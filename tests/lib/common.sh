# Helpers shared by the shell tests: the end-to-end tests (tests/e2e/lib.sh), the container tests
# (test-containers/lib.sh) and the real-GPU runner (tests/gpu/run-gpu-tests.sh and tests/gpu/lib.sh, also
# from the GPU bundle, where this file lies next to them). Sourced; it sets no shell options and needs no
# build tree. A name means one thing in every suite: a suite's own helper never reuses a name from here or
# from another suite's lib.
#
# fail, and the helpers that call it (wait_for, expect_healthy, expect_log, expect_summary), end the test:
# the GPU runner, whose tests go on after one fails, uses only the others.

# Globs, relative to $T (the test's temporary directory), of the files whose last lines fail shows.
FAIL_LOGS=('*.log')

log() { printf '[%s] %s\n' "${TEST_NAME:-test}" "$*"; }

skip() {
	echo "SKIP: $*"
	exit 77
}

# fail MESSAGE: says why, shows the end of the test's logs, and ends the test.
fail() {
	log "FAIL: $*"
	[ -n "${T:-}" ] || exit 1
	local g f
	for g in "${FAIL_LOGS[@]}"; do
		for f in "$T"/$g; do
			[ -f "$f" ] || continue
			echo "---- last lines of $f"
			tail -n 30 "$f"
		done
	done
	exit 1
}

# on_exit CMD: CMD (one string, evaluated, its output discarded) runs when the shell exits, also when the
# test fails, before the commands registered earlier. The one cleanup scheme of every suite: the first
# call sets the EXIT trap; nothing else may set it.
EXIT_CMDS=()
on_exit() {
	[ ${#EXIT_CMDS[@]} -gt 0 ] || trap run_exit_cmds EXIT
	EXIT_CMDS+=("$1")
}

run_exit_cmds() {
	local rc=$? i
	set +e
	# A call that the watchdog had to kill fails the test, whatever the test made of its exit status.
	if [ -n "$WATCHDOG_HITS" ] && [ -s "$WATCHDOG_HITS" ] && [ $rc -ne 1 ]; then
		log "FAIL: the watchdog killed a call that hung: $(head -n1 "$WATCHDOG_HITS")"
		rc=1
	fi
	for ((i = ${#EXIT_CMDS[@]} - 1; i >= 0; i--)); do
		eval "${EXIT_CMDS[$i]}" >/dev/null 2>&1
	done
	exit $rc # (in the EXIT trap: the shell's exit status)
}

# Every CRIU, container runtime, cuda-criu and workload call a test makes in its own session is bounded:
# start_watchdog (in the suites' setup) watches the test's descendants in the test's session (workloads
# started in sessions of their own, and the trees CRIU restores, are not calls) with these names. One
# still running after CALL_BOUND seconds, or when the test's own time (TEST_TIMEOUT, ctest's, set by the
# CMake files) is 15 s from running out, is described and killed with what it started: the call fails
# where it hung and says what it waited for, never at ctest's timeout, where nothing would say it.
CALL_BOUND=${CALL_BOUND:-100}
WATCHED_CALLS='^(criu|cuda-criu|cuda-checkpoint|runc|crun|podman|ctr|python3|cuda_.*|counter_tree|nvml_monitor)$'
WATCHDOG_HITS=""

# describe_call PID: a hung call's command line, state and wait channel, those of the tasks it traces
# (CRIU's), and the end of the CRIU log its command line names (-o LOG in -D DIR).
describe_call() {
	local pid=$1 args dir="" out="" t
	args=$(tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline") || return 1
	echo "'$(echo "$args" | xargs | cut -c1-300)' (pid $pid, $(sed -n 's/^State:\s*//p' "/proc/$pid/status"), waiting in $(cat "/proc/$pid/wchan" 2>/dev/null))"
	for t in $(grep -l "^TracerPid:\s*$pid$" /proc/[0-9]*/task/[0-9]*/status 2>/dev/null); do
		t=${t%/status}
		echo "  it traces task ${t##*/}: $(sed -n 's/^State:\s*//p' "$t/status") in $(cat "$t/wchan" 2>/dev/null)"
	done
	dir=$(echo "$args" | sed -n '/^\(-D\|--images-dir\)$/{n;p}' | head -n1)
	out=$(echo "$args" | sed -n '/^\(-o\|--log-file\)$/{n;p}' | head -n1)
	[ -n "$out" ] && [ "${out#/}" = "$out" ] && out=$dir/$out
	[ -z "$out" ] || [ ! -f "$out" ] || { echo "  its log $out ends:"; tail -n 3 "$out" | sed 's/^/    /'; }
}

# watch_calls ROOT START: the watchdog's loop (start_watchdog). A call's age is counted from when the
# watchdog first saw it (pid and start time together name it), not from ps's etimes, which some hosts
# report as billions of seconds for a process that has just started.
watch_calls() {
	local root=$1 start=$2 sid deadline=0 now pid stime comm why what kids
	local -A seen=()
	sid=$(ps -o sid= -p "$root" | tr -d ' ')
	[ -z "${TEST_TIMEOUT:-}" ] || deadline=$((start + TEST_TIMEOUT - 15))
	while kill -0 "$root" 2>/dev/null; do
		now=$(date +%s)
		# The test's descendants in its session: pid, start time (in clock ticks since boot), name.
		while read -r pid stime comm; do
			[[ $comm =~ $WATCHED_CALLS ]] || continue
			: "${seen[$pid:$stime]:=$now}"
			why=""
			[ $((now - ${seen[$pid:$stime]})) -lt "$CALL_BOUND" ] || why="ran past its bound of ${CALL_BOUND}s"
			[ "$deadline" = 0 ] || [ "$now" -lt "$deadline" ] ||
				why="still ran 15 s before the test's ${TEST_TIMEOUT}s run out"
			[ -n "$why" ] || continue
			what=$(describe_call "$pid") || continue # (it has just ended)
			echo "[${TEST_NAME:-test}] watchdog: a call $why, killed: $what" | tee -a "$WATCHDOG_HITS" >&2
			kids=$(ps -e -o pid=,ppid= | awk -v p="$pid" '$2 == p {print $1}')
			kill -9 "$pid" $kids 2>/dev/null
		done < <(ps -e -o pid=,ppid=,sid=,comm= | awk -v root="$root" -v sid="$sid" '
			{ ppid[$1] = $2; s[$1] = $3; c[$1] = $4 }
			END { for (p in ppid) { if (s[p] != sid) continue
				for (q = ppid[p]; q > 1 && q != root; q = ppid[q]) ;
				if (q == root) print p, c[p] } }' |
			while read -r pid comm; do
				# its start time: field 22 of /proc/PID/stat, the 20th after the name in parentheses
				read -r stime 2>/dev/null <"/proc/$pid/stat" || continue
				read -r -a f <<<"${stime##*) }"
				echo "$pid ${f[19]} $comm"
			done)
		sleep 1
	done
}

# start_watchdog: bounds this test's calls (above) until it exits; needs $T.
start_watchdog() {
	WATCHDOG_HITS=$T/.watchdog-hits
	: >"$WATCHDOG_HITS"
	watch_calls $$ "$(date +%s)" </dev/null &
	WATCHDOG_PID=$!
	on_exit 'kill "$WATCHDOG_PID"'
}

# alive PID...: every PID exists and is not a zombie.
alive() {
	local p
	for p in "$@"; do
		[ -e "/proc/$p" ] && [ "$(sed -n 's/^State:\s*\(.\).*/\1/p' "/proc/$p/status" 2>/dev/null)" != Z ] || return 1
	done
}

# The pieces of the build tree the fake-GPU tests run (CRIU and PLUGIN_DIR may come from the caller).
build_tree_paths() {
	: "${BUILD_DIR:?BUILD_DIR must point at the build tree}"
	CRIU=${CRIU:-$BUILD_DIR/criu/4.2.1/install/sbin/criu}
	PLUGIN_DIR=${PLUGIN_DIR:-$BUILD_DIR/plugin}
	FAKE_LIB=$BUILD_DIR/tests/fakegpu/libcuda.so.1
	FAKE_DAEMON=$BUILD_DIR/tests/fakegpu/fakegpu-daemon
	MEMCHECK=$BUILD_DIR/tests/workloads/cuda_memcheck
}

# wait_for WHAT SECONDS CMD...: polls CMD every 50 ms; fails the test when SECONDS pass first.
wait_for() {
	local what=$1 secs=$2
	shift 2
	local end=$((SECONDS + secs))
	until "$@" 2>/dev/null; do
		[ $SECONDS -lt $end ] || fail "timed out after ${secs}s waiting for $what"
		sleep 0.05
	done
}

# start_fake_gpu_daemon DIR [fakegpu-daemon options...]: the fake GPU daemon on DIR, in its own session,
# its output in $T/daemon.log; sets DAEMON_PID and exports FAKEGPU_DIR (what the fake libcuda reads).
start_fake_gpu_daemon() {
	export FAKEGPU_DIR=$1
	shift
	mkdir -p "$FAKEGPU_DIR"
	setsid "$FAKE_DAEMON" --dir "$FAKEGPU_DIR" "$@" </dev/null >"$T/daemon.log" 2>&1 &
	DAEMON_PID=$!
	wait_for "the fake GPU daemon" 10 test -S "$FAKEGPU_DIR/daemon.sock"
}

# state_value FILE KEY: one value from a workload's state file ("key=value" lines); empty when absent.
state_value() {
	sed -n "s/^$2=//p" "$1" 2>/dev/null | head -n1
}

# blank_state STATE: STATE blanked to the same size (CRIU checks the size of files held open), for a
# restored workload to fill again.
blank_state() { head -c 1536 /dev/zero | tr "\\0" "\\n" >"$1"; }

# expect_healthy STATE [SECONDS]: the workload runs on, verifies its data (status=ok, errors=0), and
# counts more than two iterations past its value now within SECONDS (default $HEALTHY_SECS).
HEALTHY_SECS=10
expect_healthy() {
	local state=$1 secs=${2:-$HEALTHY_SECS}
	local start
	start=$(state_value "$state" iterations)
	[ -n "$start" ] || fail "$state: no iterations"
	wait_for "$state to advance past $start" "$secs" sh -c \
		"[ \"\$(sed -n 's/^iterations=//p' $state)\" -gt $((start + 2)) ]"
	[ "$(state_value "$state" status)" = ok ] || fail "$state: $(cat "$state")"
	[ "$(state_value "$state" errors)" = 0 ] || fail "$state: $(cat "$state")"
}

# expect_log FILE PATTERN WHAT: FILE has a line matching the extended regular expression PATTERN.
expect_log() { grep -qE "$2" "$1" || fail "$3 (no line matching '$2' in $1)"; }

# expect_privilege_refusal WHAT CMD...: CMD (run as given, e.g. through setpriv as another user) fails and
# prints exactly one line, which names the privilege it lacks: root, or a capability (CAP_...).
expect_privilege_refusal() {
	local what=$1 out rc=0
	shift
	out=$("$@" </dev/null 2>&1) || rc=$?
	[ "$rc" -ne 0 ] || fail "$what succeeded: $out"
	[ -n "$out" ] && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "$what: not one line (exit $rc): $out"
	grep -qE '(^|[^a-z])root([^a-z]|$)|CAP_[A-Z_]+' <<<"$out" || fail "$what: its line names no privilege: $out"
	log "$what: exit $rc: $out"
}

# expect_summary LOG dump|restore N [WHY [MORE]]: CRIU's LOG has the plugin's summary line: N CUDA processes
# dumped, or restored with none failed; MORE (an extended regular expression) further on the same line.
expect_summary() {
	local log=$1 step=$2 n=$3 why=${4:-"no $2 summary of $3 CUDA process(es)"} more=${5:-}
	local re="cuda_plugin: $step: $n CUDA process\(es\)"
	[ "$step" = dump ] || re+=", 0 failed"
	expect_log "$log" "$re${more:+.*$more}" "$why"
}

# The plugin's error lines in a CRIU log.
plugin_errors() { grep -E 'Error \(cuda_plugin\)' "$1" || true; }

# zero_run_middle FILE [ADD]: the offset of the middle (plus ADD) of the longest run of all-zero 4 KiB pages
# in FILE, e.g. a fake driver's copy of zeroed device memory inside a pages image.
zero_run_middle() {
	python3 - "$1" "${2:-0}" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
zero, best, run = bytes(4096), (0, 0), 0
for off in range(0, len(data), 4096):
    run = run + 1 if data[off:off + 4096] == zero else 0
    if run > best[1]:
        best = (off - (run - 1) * 4096, run)
print(best[0] + best[1] * 4096 // 2 + int(sys.argv[2]))
PY
}

# Replicas with plain CRIU (no runtime), as docs/containers.md describes them. A replica source runs in
# pid, mount and network namespaces of its own, with a /proc of its own: the driver needs that /proc (cuInit
# fails with 304, CUDA_ERROR_OPERATING_SYSTEM, in a pid namespace that sees the host's), and the network
# namespace keeps replicas apart (the driver listens on @cuda-uvmfd-<pid ns inode>-<pid>, which CRIU
# restores under the same name: two replicas in one network namespace collide).
#
# ns_exec CMD...: CMD as pid 1 of such namespaces, leading its own session, stdio on /dev/null opened
# inside and no other fd (CRIU cannot dump a file of a mount that the new namespace does not have), with a
# /dev/shm of its own as a container has (replicas restored into the host's would each restore the same
# ghost file there, such as the unlinked semaphore a PyTorch process holds, and collide).
ns_exec() {
	unshare --pid --fork --mount --mount-proc --net bash -c 'for fd in $(ls /proc/$$/fd); do
		[ "$fd" -gt 2 ] && eval "exec $fd>&-"; done
		while mountpoint -q /dev/shm && umount -l /dev/shm; do :; done
		mount -t tmpfs -o mode=1777 tmpfs /dev/shm || exit 1
		exec </dev/null >/dev/null 2>&1; exec setsid "$@"' ns "$@"
}

# ns_criu_opts PID DIR: the CRIU options for a process that ns_exec started, one per line, in DIR/dump.opts
# and DIR/restore.opts (mapfile -t reads them back): each mount it has but its root, /proc and /dev/shm (a
# tmpfs of its own, which CRIU dumps and makes anew for each restore) is external
# (key mN), restored as a bind of the same host path into a root bound from the host's (--root /); its
# network namespace is made anew and left empty (--empty-ns net: nothing of it is dumped, as runc does),
# so there is nothing to lock either (--network-lock skip: CRIU would lock it with iptables by default).
ns_criu_opts() {
	local pid=$1 dir=$2 m i=0
	printf '%s\n' --empty-ns net --network-lock skip >"$dir/dump.opts"
	printf '%s\n' --empty-ns net --network-lock skip --root / >"$dir/restore.opts"
	for m in $(awk '$5 != "/" && $5 != "/proc" && $5 != "/dev/shm" { print $5 }' "/proc/$pid/mountinfo" | sort -u); do
		i=$((i + 1))
		printf '%s\n' --external "mnt[$m]:m$i" >>"$dir/dump.opts"
		printf '%s\n' --external "mnt[m$i]:$m" >>"$dir/restore.opts"
	done
}

# oci_config FILE OPTIONS...: the one writer of a test container's OCI config.json (runc, crun), shared by
# the container tests and the real-GPU runc tests: /bin/sh -c CMD as root in a read-only ROOT, its own
# pid, ipc, uts and mount namespaces, /proc, /dev, /dev/shm, /sys and /tmp, every device denied but those
# named. Options:
#   --root DIR --hostname NAME --cmd CMD    required
#   --env NAME=VALUE, --cap CAP             the process's environment and capabilities (repeated)
#   --bind SRC DST ro|rw                    a bind mount (repeated); --rbind makes them recursive
#   --device PATH                           a host character device the container has (repeated)
#   --dev-dir DIR                           /dev is a bind mount of DIR (default: a tmpfs runc fills)
#   --devpts, --netns                       /dev/pts mounted; a network namespace (a loopback only)
#   --annotation KEY=VALUE                  an OCI annotation (repeated; runc: org.criu.config, CRIU's
#                                           configuration file for this container)
oci_config() {
	python3 - "$@" <<'PY'
import argparse, json, os
ap = argparse.ArgumentParser(prog="oci_config")
ap.add_argument("file")
ap.add_argument("--root", required=True)
ap.add_argument("--hostname", required=True)
ap.add_argument("--cmd", required=True)
ap.add_argument("--env", action="append", default=[])
ap.add_argument("--cap", action="append", default=[])
ap.add_argument("--bind", nargs=3, action="append", default=[], metavar=("SRC", "DST", "MODE"))
ap.add_argument("--rbind", action="store_true")
ap.add_argument("--device", action="append", default=[])
ap.add_argument("--dev-dir")
ap.add_argument("--devpts", action="store_true")
ap.add_argument("--netns", action="store_true")
ap.add_argument("--annotation", action="append", default=[])
a = ap.parse_args()
devices, allow = [], [{"allow": False, "access": "rwm"}]
if a.dev_dir:
    # runc's own nodes (null, zero, ...) are in DEV_DIR too: allowed here, as runc allows them by default.
    allow.append({"allow": True, "type": "c", "major": 1, "access": "rwm"})
for d in a.device:
    st = os.stat(d)
    ma, mi = os.major(st.st_rdev), os.minor(st.st_rdev)
    devices.append({"path": d, "type": "c", "major": ma, "minor": mi, "fileMode": 0o666, "uid": 0, "gid": 0})
    allow.append({"allow": True, "type": "c", "major": ma, "minor": mi, "access": "rwm"})
mounts = [{"destination": "/proc", "type": "proc", "source": "proc"}]
if a.dev_dir:
    mounts.append({"destination": "/dev", "type": "bind", "source": a.dev_dir, "options": ["bind", "rw", "nosuid"]})
else:
    mounts.append({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]})
if a.devpts:
    mounts.append({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
                   "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]})
mounts += [
    {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
]
mounts += [{"destination": d, "type": "bind", "source": s, "options": ["rbind" if a.rbind else "bind", m]} for s, d, m in a.bind]
namespaces = [{"type": t} for t in ("pid", "ipc", "uts", "mount")] + ([{"type": "network"}] if a.netns else [])
linux = {"namespaces": namespaces, "resources": {"devices": allow},
         "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
         "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]}
if devices:
    linux["devices"] = devices
config = {
    "ociVersion": "1.0.2",
    "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": ["/bin/sh", "-c", a.cmd], "env": a.env,
                "cwd": "/", "capabilities": {"bounding": a.cap, "effective": a.cap, "permitted": a.cap},
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}], "noNewPrivileges": True},
    "root": {"path": a.root, "readonly": True},
    "hostname": a.hostname,
    "mounts": mounts,
    "linux": linux,
}
if a.annotation:
    config["annotations"] = dict(kv.split("=", 1) for kv in a.annotation)
os.makedirs(os.path.dirname(os.path.abspath(a.file)), exist_ok=True)
with open(a.file, "w") as f:
    json.dump(config, f, indent=1)
PY
}
