# Shared helpers for the end-to-end tests: real CRIU, our plugin, the fake GPU.
# Each test sources this file, calls e2e_setup, and uses the functions below. Everything a test starts
# is killed and its temporary directory removed on exit (on_exit, tests/lib/common.sh: a test adds its own
# cleanup there, never with a trap of its own).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"
build_tree_paths
FAKE_NVML_DIR=$BUILD_DIR/tests/fakegpu/nvml # a fake libnvidia-ml.so.1 (FAKENVML_FREE, FAKENVML_PERSISTENCE)
COUNTER_TREE=$BUILD_DIR/tests/e2e/counter_tree

T=""          # this test's temporary directory
PIDS=()       # processes to kill at the end
DAEMON_PID=""

# kill_started: every process start ran, with its session.
kill_started() {
	local p
	for p in "${PIDS[@]}"; do
		[ -n "$p" ] && kill -9 -- "-$p" 2>/dev/null; kill -9 "$p" 2>/dev/null
	done
	return 0
}

e2e_setup() {
	TEST_NAME=${TEST_NAME:-$(basename "$0" .sh)}
	[ "$(id -u)" -eq 0 ] || skip "end-to-end tests need root (CRIU)"
	[ -x "$CRIU" ] || fail "no CRIU at $CRIU: run scripts/build-criu.sh"
	T=$(mktemp -d /tmp/cuda-criu-e2e.XXXXXX)
	[ -n "${KEEP_TMP:-}" ] || on_exit 'rm -rf "$T"'
	on_exit '[ -z "$DAEMON_PID" ] || kill "$DAEMON_PID"'
	on_exit kill_started
	start_watchdog
	[ -z "${KEEP_TMP:-}" ] || log "temporary files kept in $T"
}

# e2e_strict_setup: e2e_setup for the tests that check command after command (the cuda-criu tests): a
# command that fails outside a check fails the test and says which (functions, the cleanup among them,
# do not inherit this), and the plugin's options come from this test only, never from a machine-wide
# /etc/criu/cuda_plugin.conf.
e2e_strict_setup() {
	e2e_setup
	trap 'fail "line $LINENO: \"$BASH_COMMAND\" failed"' ERR
	: >"$T/cuda_plugin.conf"
	export CUDA_CRIU_CONFIG=$T/cuda_plugin.conf
}

# start_fake_gpu [fakegpu-daemon options...]: the fake GPU daemon in $T/fakegpu; the fake libcuda (in
# workloads and in CRIU) finds it there.
start_fake_gpu() {
	start_fake_gpu_daemon "$T/fakegpu" "$@"
	# CRIU loads the fake through the plugin's libcuda option: "a driver is present".
	export CUDA_CRIU_LIBCUDA=$FAKE_LIB
}

# start NAME CMD...: runs CMD in its own session with stdio on files; sets $LAST_PID.
start() {
	local name=$1
	shift
	setsid "$@" </dev/null >"$T/$name.out" 2>&1 &
	LAST_PID=$!
	disown # CRIU kills it on dump: no job-control noise
	PIDS+=("$LAST_PID")
}

# Runs a workload against the fake libcuda.
start_cuda() {
	local name=$1
	shift
	LD_LIBRARY_PATH=$(dirname "$FAKE_LIB") start "$name" "$@"
}

dump() { # PID DIR [criu options...]
	local pid=$1 dir=$2
	shift 2
	mkdir -p "$dir"
	env $(criu_env "$CRIU") "$CRIU" dump -t "$pid" -D "$dir" -L "$PLUGIN_DIR" -v4 -o dump.log "$@" && cp "$dir/dump.log" "$T/dump.log"
	local rc=$?
	cp "$dir/dump.log" "$T/dump.log" 2>/dev/null || true
	return $rc
}

restore() { # DIR [criu options...]
	local dir=$1
	shift
	local rc=0
	env $(criu_env "$CRIU") "$CRIU" restore -D "$dir" -d -L "$PLUGIN_DIR" -v4 -o restore.log "$@" || rc=$?
	cp "$dir/restore.log" "$T/restore.log" 2>/dev/null || true
	return $rc
}

# The stock CRIU of the compatibility sections (scripts/build-criu.sh 4.1.1; CRIU_411=none skips them).
CRIU411=${CRIU_411:-$BUILD_DIR/criu/4.1.1/install/sbin/criu}
STOCK_FAULT="" # CRIU_FAULT=130 where the stock CRIU needs it on this host (stock_criu)

# stock_criu: whether the stock CRIU can dump and restore a plain process on this host; when it cannot,
# STOCK_WHY says why, for the caller's line saying it skipped its part. Probed once per boot (a `sleep`
# dumped and restored without plugins, each bounded at 10 s) under a lock; the answer is kept beside that
# CRIU (host-probe). CRIU before 4.2 stops the parasite with a hardware breakpoint at its cure; on a host
# whose breakpoints never fire (a hypervisor that does not virtualise the debug registers) the task runs
# past it untraced and every dump hangs. CRIU's own CRIU_FAULT=130 (no breakpoints) is then what users of
# such a CRIU must set: the sections run it so, saying so (docs/faults.md). CRIU 4.2 probes this itself.
stock_criu() {
	STOCK_WHY="" STOCK_FAULT=""
	[ "$CRIU411" != none ] || { STOCK_WHY="stock CRIU: CRIU_411=none"; return 1; }
	[ -x "$CRIU411" ] || { STOCK_WHY="CRIU 4.1.1 not built (scripts/build-criu.sh 4.1.1)"; return 1; }
	local probe boot verdict why
	probe=$(dirname "$(dirname "$(dirname "$CRIU411")")")/host-probe boot=$(cat /proc/sys/kernel/random/boot_id)
	exec {PROBE_LOCK}>>"$probe.lock"
	flock "$PROBE_LOCK"
	if [ "$(sed -n 1p "$probe" 2>/dev/null)" != "$boot" ]; then
		if probe_plain_dump; then
			verdict=ok why=""
		elif CRIU_FAULT=130 probe_plain_dump; then
			verdict=no-breakpoints why="its dump of a plain process hangs here: hardware breakpoints do not fire on this host"
		else
			verdict=broken why="it cannot dump and restore a plain process here: $PROBE_WHY"
		fi
		printf '%s\n%s\n%s\n' "$boot" "$verdict" "$why" >"$probe"
	fi
	exec {PROBE_LOCK}>&-
	verdict=$(sed -n 2p "$probe") why=$(sed -n 3p "$probe")
	case $verdict in
	ok) return 0 ;;
	no-breakpoints)
		STOCK_FAULT=CRIU_FAULT=130
		log "stock CRIU 4.1.1: $why; it runs with CRIU_FAULT=130 (no breakpoints), as its users must here"
		return 0 ;;
	*) STOCK_WHY="stock CRIU 4.1.1: $why"; return 1 ;;
	esac
}

# probe_plain_dump: stock_criu's probe (the environment's CRIU_FAULT goes to CRIU); PROBE_WHY on failure.
probe_plain_dump() {
	local d pid rc=0
	d=$(mktemp -d /tmp/cuda-criu-probe.XXXXXX)
	mkdir "$d/img" "$d/no-plugins"
	setsid sleep 600 </dev/null >/dev/null 2>&1 {PROBE_LOCK}>&- & # (CRIU refuses a task holding a lock)
	pid=$!
	timeout -s KILL 10 "$CRIU411" dump -t "$pid" -D "$d/img" -L "$d/no-plugins" -v4 -o dump.log \
		</dev/null >/dev/null 2>&1 || rc=$?
	if [ $rc -eq 0 ]; then
		wait "$pid" 2>/dev/null || true
		timeout -s KILL 10 "$CRIU411" restore -D "$d/img" -d -L "$d/no-plugins" -v4 -o restore.log \
			</dev/null >/dev/null 2>&1 || rc=$?
	fi
	kill -9 "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	case $rc in
	0) PROBE_WHY="" ;;
	137) PROBE_WHY="no answer within 10 s ($(tail -n1 "$d"/img/*.log 2>/dev/null | tail -n1))" ;;
	*) PROBE_WHY="exit $rc ($(tail -n1 "$d"/img/*.log 2>/dev/null | tail -n1))" ;;
	esac
	rm -rf "$d"
	[ $rc -eq 0 ]
}

# criu_env CRIU: what this CRIU needs in its environment on this host (stock_criu), for env.
criu_env() { [ "$1" != "$CRIU411" ] || echo $STOCK_FAULT; }

# start_time PID: the process's start time (field 22 of /proc/PID/stat); empty when there is none.
start_time() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
	set -- ${stat##*) } # the fields from the third (state) on
	echo "${20}"
}

# gone PID [START]: the pid is free (the process exited and was reaped), or (START: its start_time) it is
# another process's now.
gone() { ! [ -e "/proc/$1" ] || { [ -n "${2:-}" ] && [ "$(start_time "$1")" != "$2" ]; }; }

# holder PID: what /proc says of a process that does not go (its state and tracer, each thread's state
# and wait channel, its parent).
holder() {
	local t ppid
	[ -e "/proc/$1" ] || return 0
	grep -E '^(State|PPid|TracerPid):' "/proc/$1/status" | xargs
	for t in /proc/"$1"/task/*; do
		echo "  thread ${t##*/}: $(grep -E '^(State|TracerPid):' "$t/status" 2>/dev/null | xargs) wchan $(cat "$t/wchan" 2>/dev/null)"
	done
	ppid=$(sed -n 's/^PPid:\s*//p' "/proc/$1/status" 2>/dev/null)
	[ -z "$ppid" ] || echo "  parent $ppid: $(tr '\0' ' ' <"/proc/$ppid/cmdline" 2>/dev/null | cut -c1-120)"
}

# wait_gone PID...: each PID gone within 10 s (a restore needs the pids free again); one that is not is
# described (holder) before the test fails.
wait_gone() {
	local p s end
	for p in "$@"; do
		s=$(start_time "$p") end=$((SECONDS + 10))
		until gone "$p" "$s"; do
			[ $SECONDS -lt $end ] || fail "timed out after 10s waiting for pid $p to exit: $(holder "$p")"
			sleep 0.05
		done
	done
}

# healthy_then_gone: the workload of $STATE runs on healthy (expect_healthy), then $pid is killed and gone.
healthy_then_gone() {
	expect_healthy "$STATE"
	kill -9 "$pid"
	wait_gone "$pid"
}

# start_lazy_pages DIR: CRIU's lazy-pages daemon for the image in DIR, killed at the end of the test.
start_lazy_pages() {
	"$CRIU" lazy-pages -D "$1" -v4 -o lazy-pages.log &
	PIDS+=($!)
	wait_for "the lazy-pages daemon" 10 test -S "$1/lazy-pages.socket"
}

# gpus_of PID: the fake GPU device files the process holds ("dev/nvidia0 dev/nvidia1").
gpus_of() { ls -l /proc/"$1"/fd 2>/dev/null | grep -oE 'dev/nvidia[0-9]+' | sort -u | xargs; }

# dump_one NAME [cuda_memcheck options]: a 16 MiB workload started, dumped and gone; sets $pid and $img
# (with want_child=1, waits for its first child's state file too).
dump_one() {
	local name=$1
	shift
	start_memcheck "$name" 16 "$@"
	pid=$LAST_PID img=$T/img-$name
	[ -z "${want_child:-}" ] || wait_for "$name: child" 10 test -f "$STATE.0"
	local kids; kids=$(ps -o pid= --ppid "$pid" | xargs || true)
	dump "$pid" "$img" || fail "$name: dump failed"
	wait_gone "$pid" $kids
}

CUDA_CRIU=$BUILD_DIR/bin/cuda-criu

# bundle_layout DIR: DIR/bin/cuda-criu, DIR/sbin/criu and DIR/plugin/cuda_plugin.so, as scripts/gpu-bundle.sh
# lays them out. cuda-criu is a copy (it finds what came with it from its own file, /proc/self/exe), the
# others link to this build's.
bundle_layout() {
	mkdir -p "$1/bin" "$1/sbin" "$1/plugin"
	cp "$CUDA_CRIU" "$1/bin/cuda-criu"
	ln -sf "$CRIU" "$1/sbin/criu"
	ln -sf "$PLUGIN_DIR/cuda_plugin.so" "$1/plugin/cuda_plugin.so"
}

# start_memcheck NAME MB [more cuda_memcheck options]: a fake-GPU workload; sets $LAST_PID and $STATE.
start_memcheck() {
	local name=$1 mb=$2
	shift 2
	STATE=$T/$name.state
	start_cuda "$name" "$MEMCHECK" --mb "$mb" --state "$STATE" --interval-ms 20 "$@"
	wait_for "$name to fill its device memory" 20 test -f "$STATE"
}

cuda_state() { LD_LIBRARY_PATH=$(dirname "$FAKE_LIB") CUDA_CRIU_LIBCUDA=$FAKE_LIB "$CUDA_CRIU" status "$1" | awk '{print $2}'; }
is_running() { [ "$(cuda_state "$1")" = running ]; }

# py CODE: runs python CODE with the JSON document on stdin in d.
py() { python3 -c "import json,sys; d=json.load(sys.stdin); $1"; }

# expect_rc RC CMD...: CMD exits with RC; its stdout and stderr are in $T/out and $T/err.
expect_rc() {
	local want=$1 rc=0
	shift
	"$@" >"$T/out" 2>"$T/err" || rc=$?
	[ $rc -eq "$want" ] || fail "'$*' exited $rc, expected $want; stderr: $(cat "$T/err")"
}

cuda_criu() { LD_LIBRARY_PATH=$(dirname "$FAKE_LIB") CUDA_CRIU_LIBCUDA=$FAKE_LIB "$CUDA_CRIU" "$@"; }

