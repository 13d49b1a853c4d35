#!/usr/bin/env bash
# runc: a container whose two CUDA processes share GPU memory through legacy CUDA IPC, as the r580 driver
# leaves it in the container's /dev/shm (the fake's FAKEGPU_LEGACY_IPC): an exporter mapping
# /dev/shm/cuda.shm.0.<its pid in the container, in hex>.1 and pid 1 importing from it. runc checkpoint,
# with and without --leave-running, is refused before anything is locked, naming both processes by their
# host pids (the file names the exporter by its pid in the container) and the file; the container runs on
# with its data.
source "$(dirname "$0")/lib.sh"
ct_setup runc
runc_setup

exporter_cmd="FAKEGPU_LEGACY_IPC=export $(memcheck_cmd exporter 16 | sed 's/^exec //') &"
wait_file='f=/dev/shm/cuda.shm.0.$(printf %x $!).1; while [ ! -e $f ]; do sleep 0.05; done;'
make_bundle "$T/bundle" "$exporter_cmd $wait_file FAKEGPU_LEGACY_IPC=import:\$! $(memcheck_cmd importer 16)"
runc_start ct-ipc "$T/bundle"
for f in exporter importer; do
	wait_for "$f to fill its device memory" 20 test -f "$T/state/$f"
	expect_healthy "$T/state/$f"
done
importer=$(runc_ state ct-ipc | jq -r .pid)
exporter=$(ps -o pid= --ppid "$importer" | xargs)
[ -n "$exporter" ] || fail "no exporter in the container"
file=/dev/shm/cuda.shm.0.$(printf %x "$(awk '/^NSpid:/ {print $NF}' "/proc/$exporter/status")").1
grep -q "$file" "/proc/$importer/maps" || fail "the importer (pid $importer) does not map $file"

for opts in "" --leave-running; do
	runc_checkpoint ct-ipc "$T/img" $opts && fail "runc checkpoint $opts of a container sharing GPU memory through CUDA IPC succeeded"
	expect_log "$T/dump.log" "pid $importer maps $file, the legacy CUDA IPC file of pid $exporter" \
		"runc checkpoint $opts was refused without naming both processes"
	grep -q "lock pid" "$T/dump.log" && fail "runc checkpoint $opts: a lock was tried"
	[ "$(runc_ state ct-ipc | jq -r .status)" = running ] || fail "after runc checkpoint $opts the container is $(runc_ state ct-ipc | jq -r .status)"
	for f in exporter importer; do expect_healthy "$T/state/$f"; done
	rm -rf "$T/img"
done
log "runc checkpoint (and --leave-running) refused before the lock, naming pids $importer and $exporter and $file; the container runs on"
runc_remove ct-ipc
log PASS
