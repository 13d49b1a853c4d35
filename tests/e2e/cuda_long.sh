#!/usr/bin/env bash
# Long and impossible checkpoints (docs/faults.md): the driver's refusal of managed memory is fast and
# named, a long copy logs its progress, a copy that stops making progress is given up after the stall
# timeout (and the process comes back once the driver lets go), and a checkpoint that cannot fit in the
# process's memory cgroup is refused before any process is locked.
source "$(dirname "$0")/lib.sh"
e2e_setup
start_fake_gpu
# CRIU reads each process's GPU memory through NVML: the fake one asks the fake GPU daemon.
criu_nvml() { LD_LIBRARY_PATH=$FAKE_NVML_DIR "$@"; }
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
# refused_dump WHAT MAX-SECS PATTERN HOW: the dump of $pid into $T/img-WHAT fails within MAX-SECS seconds
# (sets secs) and its log has a line matching PATTERN (HOW: what that line shows).
refused_dump() {
	local what=$1 max=$2 t0=$EPOCHREALTIME
	if criu_nvml dump "$pid" "$T/img-$what"; then fail "$what: the dump succeeded"; fi
	secs=$(elapsed "$t0")
	expect_log "$T/dump.log" "$3" "$what: $4"
	awk -v s="$secs" -v m="$max" 'BEGIN { exit !(s <= m) }' || fail "$what: the dump took $secs s to fail (more than $max s)"
}

# 1. Managed memory: refused within 5 s, in words, the process running on with its data.
start_memcheck managed 16 --managed-mb 4
pid=$LAST_PID
refused_dump managed 5 "checkpoint pid $pid: the NVIDIA driver cannot checkpoint this process: it uses CUDA managed memory" \
	"the refusal names the process and managed memory"
wait_for "managed: pid $pid to run" 10 is_running "$pid"
expect_healthy "$STATE"
log "managed memory: refused in $secs s, the process runs on"
kill -9 "$pid"; wait_gone "$pid"

# 2. Progress: a 256 MiB state copied at 48 MB/s logs lines with bytes, total and rate, both ways.
export FAKEGPU_COPY_MBPS=48
start_memcheck slow 256
unset FAKEGPU_COPY_MBPS
pid=$LAST_PID
criu_nvml dump "$pid" "$T/img-slow" || fail "slow: dump failed"
expect_log "$T/dump.log" "cuda_plugin: checkpoint: [0-9]+ of 256 MiB \([0-9.]+ [MG]B/s\), 0 of 1 process\(es\) done" \
	"slow: checkpoint progress lines"
wait_gone "$pid"
criu_nvml restore "$T/img-slow" || fail "slow: restore failed"
expect_log "$T/restore.log" "cuda_plugin: restore: [0-9]+ of [0-9]+ MiB \([0-9.]+ [MG]B/s\), 0 of 1 process\(es\) done" \
	"slow: restore progress lines"
expect_healthy "$STATE"
log "progress: $(grep -c 'cuda_plugin: checkpoint: ' "$T/dump.log") checkpoint and $(grep -c 'cuda_plugin: restore: ' "$T/restore.log") restore lines"
kill -9 "$pid"; wait_gone "$pid"

# 3. A stall: the copy stops at 32 MiB for 4 s; with a stall timeout of 1.5 s the dump fails within a few
# seconds naming the process, long before the checkpoint timeout. Once the driver goes on, the dump's
# guard returns the process to running. The fake driver maps its copy with MAP_POPULATE, as the real one
# does, so the process grows by the whole buffer at once (populated by the kernel with huge-pages=off, by
# the plugin by default): the stall is seen by the restore thread's CPU time.
for hp in off auto; do
	export FAKEGPU_COPY_MBPS=64 FAKEGPU_STALL_AFTER_MB=32 FAKEGPU_STALL_MS=4000
	start_memcheck stall-$hp 128
	unset FAKEGPU_COPY_MBPS FAKEGPU_STALL_AFTER_MB FAKEGPU_STALL_MS
	pid=$LAST_PID
	# (secs has one decimal: within 3.9 s is under 4 s)
	CUDA_CRIU_HUGE_PAGES=$hp CUDA_CRIU_STALL_TIMEOUT=1.5 refused_dump stall-$hp 3.9 \
		"checkpoint pid $pid: the driver's checkpoint made no progress for [0-9] s" \
		"huge-pages=$hp: the stall is named"
	wait_for "stall: pid $pid back to running" 30 is_running "$pid"
	expect_healthy "$STATE"
	log "stall (huge-pages=$hp): given up after $secs s; the process runs again once the driver finished"
	kill -9 "$pid"; wait_gone "$pid"
done

# 4. A memory cgroup with less room than the GPU state: refused before any lock; dumped once raised.
cg=""
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
	cg=/sys/fs/cgroup/cuda-criu-e2e-$$ limit=memory.max usage=memory.current unlimited=max
	grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
elif [ -d /sys/fs/cgroup/memory ]; then
	cg=/sys/fs/cgroup/memory/cuda-criu-e2e-$$ limit=memory.limit_in_bytes usage=memory.usage_in_bytes unlimited=-1
fi
if [ -z "$cg" ] || ! mkdir "$cg" 2>/dev/null || [ ! -f "$cg/$limit" ]; then
	log "SKIP part 4: no memory cgroup can be made here"
	exit 0
fi
on_exit '[ -f "$cg/cgroup.procs" ] && { kill -9 $(cat "$cg/cgroup.procs") 2>/dev/null; sleep 0.3; rmdir "$cg"; }'
STATE=$T/cg.state
start_cuda cg sh -c "echo \$\$ >$cg/cgroup.procs && exec $MEMCHECK --mb 64 --state $STATE --interval-ms 20"
pid=$LAST_PID
wait_for "cg: the workload" 20 test -f "$STATE"
echo $(($(cat "$cg/$usage") + 16 * 1024 * 1024)) >"$cg/$limit"
if criu_nvml dump "$pid" "$T/img-cg" -R; then fail "cg: the dump succeeded with the cgroup limit below the GPU state"; fi
expect_log "$T/dump.log" "not enough memory for the checkpoint: .*pid $pid \(64.0 MiB\).*memory cgroup $cg has room for" \
	"cg: the refusal names the process, its GPU state and the cgroup"
! grep -qE "pid $pid: running, restore thread|locking|lock pid $pid" "$T/dump.log" || fail "cg: pid $pid was locked before the refusal"
expect_healthy "$STATE"
echo "$unlimited" >"$cg/$limit"
criu_nvml dump "$pid" "$T/img-cg2" -R || fail "cg: the dump failed once the limit was raised"
expect_healthy "$STATE"
log "memory cgroup: refused before any lock; dumped once the limit was raised"
