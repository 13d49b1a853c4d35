# Shared helpers for the end-to-end tests: real CRIU, our plugin, the fake GPU.
# Each test sources this file, calls e2e_setup, and uses the functions below. Everything a test starts
# is killed and its temporary directory removed on exit.
set -euo pipefail

: "${BUILD_DIR:?BUILD_DIR must point at the build tree}"
CRIU=${CRIU:-$BUILD_DIR/criu/4.2.1/install/sbin/criu}
PLUGIN_DIR=${PLUGIN_DIR:-$BUILD_DIR/plugin}
FAKE_LIB=$BUILD_DIR/tests/fakegpu/libcuda.so.1
FAKE_NVML_DIR=$BUILD_DIR/tests/fakegpu/nvml # a fake libnvidia-ml.so.1 (FAKENVML_FREE, FAKENVML_PERSISTENCE)
FAKE_DAEMON=$BUILD_DIR/tests/fakegpu/fakegpu-daemon
MEMCHECK=$BUILD_DIR/tests/workloads/cuda_memcheck
COUNTER_TREE=$BUILD_DIR/tests/e2e/counter_tree

T=""          # this test's temporary directory
PIDS=()       # processes to kill at the end
DAEMON_PID=""

log() { printf '[%s] %s\n' "${TEST_NAME:-e2e}" "$*"; }

fail() {
	log "FAIL: $*"
	for f in "$T"/*.log; do
		[ -f "$f" ] || continue
		echo "---- last lines of $f"
		tail -n 25 "$f"
	done
	exit 1
}

cleanup() {
	set +e
	local p
	for p in "${PIDS[@]}"; do
		[ -n "$p" ] && kill -9 -- "-$p" 2>/dev/null; kill -9 "$p" 2>/dev/null || true
	done
	[ -n "$DAEMON_PID" ] && kill "$DAEMON_PID" 2>/dev/null || true
	[ -n "$T" ] && [ -z "${KEEP_TMP:-}" ] && rm -rf "$T"
	return 0
}

e2e_setup() {
	TEST_NAME=${TEST_NAME:-$(basename "$0" .sh)}
	[ "$(id -u)" -eq 0 ] || { echo "SKIP: end-to-end tests need root (CRIU)"; exit 77; }
	[ -x "$CRIU" ] || fail "no CRIU at $CRIU: run scripts/build-criu.sh"
	T=$(mktemp -d /tmp/cuda-criu-e2e.XXXXXX)
	trap cleanup EXIT
	[ -z "${KEEP_TMP:-}" ] || log "temporary files kept in $T"
}

# Starts the fake GPU daemon and points the fake libcuda (in workloads and in CRIU) at it.
start_fake_gpu() {
	export FAKEGPU_DIR=$T/fakegpu
	mkdir -p "$FAKEGPU_DIR"
	setsid "$FAKE_DAEMON" --dir "$FAKEGPU_DIR" "$@" </dev/null >"$T/daemon.log" 2>&1 &
	DAEMON_PID=$!
	wait_for "fake GPU daemon" 10 test -S "$FAKEGPU_DIR/daemon.sock"
	# CRIU loads the fake through the plugin's libcuda option: "a driver is present".
	export CUDA_CRIU_LIBCUDA=$FAKE_LIB
}

# wait_for WHAT SECONDS CMD...: polls CMD every 50 ms.
wait_for() {
	local what=$1 secs=$2
	shift 2
	local end=$((SECONDS + secs))
	until "$@" 2>/dev/null; do
		[ $SECONDS -lt $end ] || fail "timed out after ${secs}s waiting for $what"
		sleep 0.05
	done
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

state_value() { # FILE KEY
	sed -n "s/^$2=//p" "$1" 2>/dev/null | head -n1
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

gone() { ! [ -e "/proc/$1" ]; }
wait_gone() { local p; for p in "$@"; do wait_for "pid $p to exit" 10 gone "$p"; done; }
alive() { [ -e "/proc/$1" ] && [ "$(sed -n 's/^State:\s*\(.\).*/\1/p' "/proc/$1/status")" != Z ]; }

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

# The plugin's error lines in a CRIU log.
plugin_errors() { grep -E 'Error \(cuda_plugin\)' "$1" || true; }

CUDA_CRIU=$BUILD_DIR/bin/cuda-criu

# start_memcheck NAME MB [more cuda_memcheck options]: a fake-GPU workload; sets $LAST_PID and $STATE.
start_memcheck() {
	local name=$1 mb=$2
	shift 2
	STATE=$T/$name.state
	start_cuda "$name" "$MEMCHECK" --mb "$mb" --state "$STATE" --interval-ms 20 "$@"
	wait_for "$name to fill its device memory" 20 test -f "$STATE"
}

# expect_healthy STATE [SECONDS]: the workload runs on, verifies its data, and counts past its value now.
expect_healthy() {
	local state=$1 secs=${2:-10}
	local start; start=$(state_value "$state" iterations)
	wait_for "$state to advance past $start" "$secs" sh -c \
		"[ \"\$(sed -n 's/^iterations=//p' $state)\" -gt $((start + 2)) ]"
	[ "$(state_value "$state" status)" = ok ] || fail "$state: $(cat "$state")"
}

cuda_state() { LD_LIBRARY_PATH=$(dirname "$FAKE_LIB") CUDA_CRIU_LIBCUDA=$FAKE_LIB "$CUDA_CRIU" status "$1" | awk '{print $2}'; }
is_running() { [ "$(cuda_state "$1")" = running ]; }
cuda_criu() { LD_LIBRARY_PATH=$(dirname "$FAKE_LIB") CUDA_CRIU_LIBCUDA=$FAKE_LIB "$CUDA_CRIU" "$@"; }

# expect_log FILE PATTERN WHAT
expect_log() { grep -qE "$2" "$1" || fail "$3 (no line matching '$2' in $(basename "$1"))"; }
