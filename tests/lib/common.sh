# Helpers shared by the shell tests: the end-to-end tests (tests/e2e/lib.sh), the container tests
# (test-containers/lib.sh) and the real-GPU runner (tests/gpu/run-gpu-tests.sh, also from the GPU bundle,
# where this file lies next to it). Sourced; it sets no shell options and needs no build tree.
#
# fail, and the helpers that call it (wait_for, expect_healthy, expect_log), end the test: the GPU runner,
# whose tests go on after one fails, uses only the others.

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
