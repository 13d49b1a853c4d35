#!/usr/bin/env bash
# runc: the container's CUDA process forks workers after CUDA started (PyTorch DataLoader workers with
# the fork start method); the workers inherit the driver's device mappings and an open device file.
# The container is checkpointed, removed and restored with runc + CRIU + our plugin; the workers go on
# sending numbered batches without a gap and hold inert placeholders (/dev/zero mappings at the same
# addresses, /dev/null at the device fd's number).
# The fake GPU stands in for the driver's mappable nodes with a loop device node under
# $FAKEGPU_DIR/dev/nvidia-mappable (docs/forked-children.md). $FAKEGPU_DIR is bind-mounted into the
# container at the same path, so the node is seen there; the container's device cgroup (deny-all in
# make_bundle) gets one rule allowing that block device, as a real GPU container allows /dev/nvidia*.
source "$(dirname "$0")/lib.sh"
ct_setup runc losetup
runc_setup
FORK_WORKERS=$(dirname "$MEMCHECK")/cuda_fork_workers
[ -x "$FORK_WORKERS" ] || fail "$FORK_WORKERS is missing: build the project first"

dd if=/dev/zero of="$T/mappable.img" bs=4096 count=16 status=none
LOOP=$(losetup -f --show "$T/mappable.img" 2>/dev/null) || skip "no loop device (losetup -f failed)"
on_exit "losetup -d $LOOP"
rdev=$(stat -c '%t %T' "$LOOP")
major=$((0x${rdev% *})) minor=$((0x${rdev#* }))
mknod "$FAKEGPU_DIR/dev/nvidia-mappable" b $major $minor ||
	fail "cannot make a block device node under $FAKEGPU_DIR/dev (nodev mount?)"

make_bundle "$T/bundle" "exec /opt/workloads/cuda_fork_workers --state /state/fork --workers 2 --interval-ms 10 2>>/state/fork.err"
jq --argjson major $major --argjson minor $minor \
	'.linux.resources.devices += [{allow: true, type: "b", major: $major, minor: $minor, access: "rw"}]' \
	"$T/bundle/config.json" >"$T/config.json" && mv "$T/config.json" "$T/bundle/config.json"
runc_start ct-fork "$T/bundle"
STATE=$T/state/fork
wait_for "the workers' first batches" 20 sh -c "[ \"\$(sed -n 's/^batches=//p' $STATE 2>/dev/null)\" -ge 20 ] 2>/dev/null"
[ "$(state_value "$STATE" status)" = ok ] || fail "workload says $(state_value "$STATE" status)"
parent=$(runc_pid ct-fork)
workers=$(ps -o pid= --ppid "$parent" | xargs)
[ "$(echo "$workers" | wc -w)" -eq 2 ] || fail "expected 2 workers of pid $parent, found: $workers"
nspid() { awk '/^NSpid:/ {print $NF}' "/proc/$1/status"; }
declare -A maps_before fd_before ns_before
for w in $workers; do
	ns_before[$w]=$(nspid "$w")
	maps_before[$w]=$(grep nvidia-mappable "/proc/$w/maps" | awk '{print $1, $2}' || true)
	[ "$(echo "${maps_before[$w]}" | grep -c .)" -eq 2 ] ||
		fail "worker $w: expected 2 inherited device mappings (was the node reachable in the container?), got: ${maps_before[$w]}"
	fd_before[$w]=$(ls -l "/proc/$w/fd" | awk '/nvidia-mappable/ {print $9}')
	[ -n "${fd_before[$w]}" ] || fail "worker $w: no inherited device fd"
done

runc_checkpoint ct-fork "$T/img" || fail "runc checkpoint failed: $(tail -n 5 "$T/dump.log" 2>/dev/null)"
[ -z "$(plugin_errors "$T/dump.log")" ] || fail "plugin errors in the dump log: $(plugin_errors "$T/dump.log")"
expect_log "$T/dump.log" "mapping of .*nvidia-mappable inherited from the NVIDIA driver" "no claim of the workers' mappings"
[ -s "$T/img/cuda-plugin-devices.img" ] || fail "no cuda-plugin-devices.img in the image"
# cuda-criu inspect names each worker by its host pid and its pid inside the container.
"$BUILD_DIR/bin/cuda-criu" inspect "$T/img" >"$T/inspect.txt" || fail "cuda-criu inspect of the image failed"
for w in $workers; do
	grep -qE "^pid $w \(ns pid ${ns_before[$w]}\): 2 mapping\(s\)" "$T/inspect.txt" ||
		fail "inspect: no line for worker $w (container pid ${ns_before[$w]}): $(cat "$T/inspect.txt")"
done
for p in $parent $workers; do wait_for "pid $p to exit" 10 test ! -e "/proc/$p"; done
runc_ delete -f ct-fork 2>/dev/null || true
before=$(state_value "$STATE" batches)

runc_restore ct-fork "$T/bundle" "$T/img" || fail "runc restore failed: $(tail -n 5 "$T/restore.log" 2>/dev/null)"
[ -z "$(plugin_errors "$T/restore.log")" ] || fail "plugin errors in the restore log: $(plugin_errors "$T/restore.log")"
want=$((before + 50))
wait_for "batches to reach $want" 20 sh -c "[ \$(sed -n 's/^batches=//p' $STATE) -ge $want ]"
[ "$(state_value "$STATE" status)" = ok ] || fail "after restore the workload says $(state_value "$STATE" status)"
# Host pids change with the restore (a new pid namespace); the workers are the restored parent's children.
parent=$(runc_pid ct-fork)
workers_after=$(ps -o pid= --ppid "$parent" | xargs)
[ "$(echo "$workers_after" | wc -w)" -eq 2 ] || fail "expected 2 workers after restore, found: $workers_after"
for w in $workers; do
	# The same worker after the restore: the same pid inside the container.
	n=""
	for x in $workers_after; do [ "$(nspid "$x")" = "${ns_before[$w]}" ] && n=$x; done
	[ -n "$n" ] || fail "no restored worker with container pid ${ns_before[$w]} (workers now: $workers_after)"
	# The worker's addresses and protections, now /dev/zero instead of the device.
	after=$(grep -E "^($(echo "${maps_before[$w]}" | awk '{print $1}' | paste -sd'|')) " "/proc/$n/maps" || true)
	[ "$(echo "$after" | awk '{print $1, $2}')" = "${maps_before[$w]}" ] ||
		fail "worker $n: placeholders differ: before ${maps_before[$w]}; after $after"
	echo "$after" | grep -qv "/dev/zero" && fail "worker $n: placeholder is not /dev/zero: $after"
	[ "$(readlink "/proc/$n/fd/${fd_before[$w]}")" = /dev/null ] ||
		fail "worker $n: fd ${fd_before[$w]} is $(readlink "/proc/$n/fd/${fd_before[$w]}"), not /dev/null"
done
runc_remove ct-fork
log "container with workers forked after CUDA started: restored, workers go on ($before -> $(state_value "$STATE" batches) batches), placeholders in place"
log PASS
