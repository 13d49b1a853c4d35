#!/usr/bin/env bash
# podman (runtime runc): a container whose two CUDA processes share GPU memory through legacy CUDA IPC, as
# the r580 driver leaves it in the container's /dev/shm (the fake's FAKEGPU_LEGACY_IPC; runc_legacy_ipc.sh
# is the same with runc alone). `podman container checkpoint`, with and without --leave-running, is
# refused before anything is locked, CRIU's log naming both processes by their host pids and the file; the
# container runs on with its data.
source "$(dirname "$0")/lib.sh"
ct_setup runc podman
podman_setup
pod_fakegpu_mounts

exporter_cmd="FAKEGPU_LEGACY_IPC=export $(memcheck_cmd exporter 16 | sed 's/^exec //') &"
wait_file='f=/dev/shm/cuda.shm.0.$(printf %x $!).1; while [ ! -e $f ]; do sleep 0.05; done;'
pod_run pc-ipc "$exporter_cmd $wait_file FAKEGPU_LEGACY_IPC=import:\$! $(memcheck_cmd importer 16)" "${POD_FAKEGPU[@]}"
for f in exporter importer; do
	wait_for "$f to fill its device memory" 20 test -f "$T/state/$f"
	expect_healthy "$T/state/$f"
done
importer=$(pod_pid pc-ipc)
exporter=$(ps -o pid= --ppid "$importer" | xargs)
[ -n "$exporter" ] || fail "no exporter in the container"
file=/dev/shm/cuda.shm.0.$(printf %x "$(awk '/^NSpid:/ {print $NF}' "/proc/$exporter/status")").1
grep -q "$file" "/proc/$importer/maps" || fail "the importer (pid $importer) does not map $file"

for opts in "" --leave-running; do
	# shellcheck disable=SC2086 # opts: one option or none
	pod container checkpoint --keep $opts pc-ipc >"$T/checkpoint.log" 2>&1 &&
		fail "podman container checkpoint $opts of a container sharing GPU memory through CUDA IPC succeeded"
	pod_log pc-ipc dump
	expect_log "$T/dump.log" "pid $importer maps $file, the legacy CUDA IPC file of pid $exporter" \
		"podman container checkpoint $opts was refused without naming both processes"
	grep -q "lock pid" "$T/dump.log" && fail "podman container checkpoint $opts: a lock was tried"
	[ "$(pod_status pc-ipc)" = running ] || fail "after podman container checkpoint $opts the container is $(pod_status pc-ipc)"
	for f in exporter importer; do expect_healthy "$T/state/$f"; done
	log "podman container checkpoint $opts refused: $(tail -n1 "$T/checkpoint.log" | cut -c1-200)"
done
log "podman container checkpoint (and --leave-running) refused before the lock, naming pids $importer and $exporter and $file; the container runs on"
pod rm -f -t 0 pc-ipc >/dev/null
log PASS
