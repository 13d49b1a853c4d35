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
	"$CRIU" dump -t "$pid" -D "$dir" -L "$PLUGIN_DIR" -v4 -o dump.log "$@" && cp "$dir/dump.log" "$T/dump.log"
	local rc=$?
	cp "$dir/dump.log" "$T/dump.log" 2>/dev/null || true
	return $rc
}

restore() { # DIR [criu options...]
	local dir=$1
	shift
	local rc=0
	"$CRIU" restore -D "$dir" -d -L "$PLUGIN_DIR" -v4 -o restore.log "$@" || rc=$?
	cp "$dir/restore.log" "$T/restore.log" 2>/dev/null || true
	return $rc
}

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

