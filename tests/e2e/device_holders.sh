#!/usr/bin/env bash
# NVIDIA device files are stood in for (/dev/null, /dev/zero) only in a process the driver says has no
# CUDA state and that inherited them from a CUDA process of the dump (tests/e2e/fork_workers.sh). Any
# other holder fails the dump, named, and goes on running as it was: a process using NVML alone (a GPU
# monitor), and any holder while the plugin is inactive (no driver found). A CUDA process holding the fd
# of a CUDA memory handle shared with another process is refused before its lock.
source "$(dirname "$0")/lib.sh"
e2e_setup
start_fake_gpu
MONITOR=$BUILD_DIR/tests/workloads/nvml_monitor

polls() { awk '{print $1}' "$T/nvml.state" 2>/dev/null || echo 0; }
counts_on() { local a; a=$(polls); sleep 0.3; [ "$(polls)" -gt "$a" ]; }

# refused CASE PATTERN [env assignments...]: a fresh NVML monitor's dump fails, the log matches PATTERN,
# the monitor runs on.
refused() {
	local name=$1 pattern=$2
	shift 2
	LD_LIBRARY_PATH=$FAKE_NVML_DIR start "nvml-$name" "$MONITOR" "$T/nvml.state"
	local pid=$LAST_PID
	wait_for "the monitor to poll" 10 counts_on
	ls -l "/proc/$pid/fd" | grep -q "$FAKEGPU_DIR/dev/nvidiactl" || fail "$name: the monitor holds no device node"
	mkdir -p "$T/img-$name"
	if env "$@" "$CRIU" dump -t "$pid" -D "$T/img-$name" -L "$PLUGIN_DIR" -v4 -o dump.log 2>/dev/null; then
		fail "$name: the dump of an NVML-only process succeeded"
	fi
	grep -qE "$pattern" "$T/img-$name/dump.log" || fail "$name: no line matching '$pattern'"
	alive "$pid" || fail "$name: the monitor died"
	wait_for "$name: the monitor to poll on" 10 counts_on
	log "$name: dump refused by name, the monitor polls on"
	kill -9 "$pid"
	wait_gone "$pid"
}

refused nvml-only "pid [0-9]+ holds NVIDIA device files but does not use CUDA \(no libcuda mapped: NVML"
refused plugin-inactive "pid [0-9]+ holds NVIDIA device files, but the CUDA plugin is inactive: no NVIDIA driver found \(no file /nonexistent/libcuda.so.1\)" \
	CUDA_CRIU_LIBCUDA=/nonexistent/libcuda.so.1
# A CUDA process holding one /dev/nvidiactl more than the driver's own: the fd of a CUDA memory handle
# shared with another process, which the driver checkpoints but cannot restore on the importing side.
# Refused before the lock, named; it runs on unlocked with its data.
FAKEGPU_SHARED_HANDLE=1 start_memcheck shared-handle 16
pid=$LAST_PID
[ "$(ls -l "/proc/$pid/fd" | grep -c "$FAKEGPU_DIR/dev/nvidiactl")" = 2 ] || fail "shared-handle: not two nvidiactl nodes"
mkdir -p "$T/img-shared-handle"
"$CRIU" dump -t "$pid" -D "$T/img-shared-handle" -L "$PLUGIN_DIR" -v4 -o dump.log 2>/dev/null &&
	fail "shared-handle: the dump of a process holding a shared memory handle succeeded"
grep -qE "pid $pid holds 2 open /dev/nvidiactl files, 1 more than the CUDA driver opens: a CUDA memory handle exported to or imported from another process" \
	"$T/img-shared-handle/dump.log" || fail "shared-handle: the refusal does not name pid $pid and the cause"
wait_for "shared-handle: pid $pid to run" 10 is_running "$pid"
expect_healthy "$STATE"
log "shared-handle: refused before the lock, named; runs on with its data"
log "ok"
