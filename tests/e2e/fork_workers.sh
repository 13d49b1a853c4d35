#!/usr/bin/env bash
# A CUDA process whose workers were forked after CUDA started (PyTorch DataLoader workers, fork start
# method): the workers inherit the driver's device mappings and an open device file, which CRIU cannot
# dump by itself. The fake GPU reproduces them with a block device node (tests/fakegpu: nvidia-mappable)
# and the plugin claims them. Checks: dump and restore bring back the whole tree, the workers go on
# sending numbered batches without a gap, their device mappings come back as zero-filled memory at the
# same addresses and the device fd as /dev/null with the same access mode, also with the device node
# gone; the same onto another GPU (dumped on GPU 0, restored onto GPU 1 by a device map);
# --leave-running and a dump that fails late leave the tree untouched; CRIU 4.1.1 works too.
source "$(dirname "$0")/lib.sh"
e2e_setup
FORK_WORKERS=$BUILD_DIR/tests/workloads/cuda_fork_workers
command -v losetup >/dev/null || { echo "SKIP: no losetup"; exit 77; }
start_fake_gpu --gpus 2

# A loop device over a small file, and its node where the fake libcuda looks for it.
LOOP=""
make_device() {
	dd if=/dev/zero of="$T/mappable.img" bs=4096 count=16 status=none
	LOOP=$(losetup -f --show "$T/mappable.img" 2>/dev/null) || { echo "SKIP: no loop device"; exit 77; }
	local rdev; rdev=$(stat -c '%t %T' "$LOOP")
	mknod "$FAKEGPU_DIR/dev/nvidia-mappable" b $((0x${rdev% *})) $((0x${rdev#* })) ||
		fail "cannot make a block device node under $FAKEGPU_DIR/dev (nodev mount?)"
}
drop_device() {
	rm -f "$FAKEGPU_DIR/dev/nvidia-mappable"
	[ -z "$LOOP" ] || losetup -d "$LOOP" 2>/dev/null || true
	LOOP=""
}
on_exit drop_device
make_device

STATE=""
start_tree() { # NAME: sets $pid, $workers, $STATE
	STATE=$T/$1.state
	start_cuda "$1" "$FORK_WORKERS" --state "$STATE" --workers 2 --interval-ms 10
	pid=$LAST_PID
	wait_for "$1: batches" 10 sh -c "[ \$(sed -n 's/^batches=//p' $STATE) -ge 20 ]"
	workers=$(state_value "$STATE" workers | tr , ' ')
	[ -n "$workers" ] || fail "$1: no workers in the state file"
}
batches() { state_value "$STATE" batches; }
expect_progress() { # WHAT: batches grow by 50 with status ok
	local want=$(($(batches) + 50))
	wait_for "$1: batches to reach $want" 20 sh -c "[ \$(sed -n 's/^batches=//p' $STATE) -ge $want ]"
	[ "$(state_value "$STATE" status)" = ok ] || fail "$1: workload says $(state_value "$STATE" status)"
}
# The worker's device mappings ("START-END PERMS" lines) and device fds.
device_maps() { grep nvidia-mappable "/proc/$1/maps" | awk '{print $1, $2}'; }
device_fds() { ls -l "/proc/$1/fd" | grep -c nvidia-mappable || true; }

# check_placeholders WHAT: each worker has, at the addresses recorded in maps_before, /dev/zero
# mappings with the same protections, and at its device fd's number /dev/null opened the same way.
check_placeholders() {
	local w after fd flags
	for w in $workers; do
		# Same addresses and protections; now /dev/zero (shared anonymous memory) instead of the device.
		after=$(grep -E "^($(echo "${maps_before[$w]}" | awk '{print $1}' | paste -sd'|')) " "/proc/$w/maps" || true)
		[ "$(echo "$after" | awk '{print $1, $2}')" = "${maps_before[$w]}" ] ||
			fail "$1: worker $w: placeholders differ: before ${maps_before[$w]}; after $after"
		echo "$after" | grep -qv "/dev/zero" && fail "$1: worker $w: placeholder is not /dev/zero: $after"
		fd=${fd_before[$w]}
		[ "$(readlink "/proc/$w/fd/$fd")" = /dev/null ] ||
			fail "$1: worker $w: fd $fd is $(readlink "/proc/$w/fd/$fd"), not /dev/null"
		# The fake opened the device O_RDWR (octal flags end in 2) and O_CLOEXEC (02000000).
		flags=$(sed -n 's/^flags:\s*//p' "/proc/$w/fdinfo/$fd")
		[ $((0$flags & 3)) -eq 2 ] || fail "$1: worker $w: fd $fd has flags $flags, not O_RDWR"
		[ $((0$flags & 02000000)) -ne 0 ] || fail "$1: worker $w: fd $fd lost O_CLOEXEC (flags $flags)"
	done
}
# record_devices WHAT: fills maps_before and fd_before from the running workers, checking the fake.
declare -A maps_before fd_before
record_devices() {
	local w
	for w in $workers; do
		maps_before[$w]=$(device_maps "$w")
		fd_before[$w]=$(ls -l "/proc/$w/fd" | awk '/nvidia-mappable/ {print $9}')
		[ "$(echo "${maps_before[$w]}" | wc -l)" -eq 2 ] || fail "$1: worker $w: expected 2 inherited device mappings, got: ${maps_before[$w]}"
		[ "$(device_fds "$w")" -eq 1 ] || fail "$1: worker $w: expected 1 inherited device fd"
	done
	[ "$(device_maps "$pid" | wc -l)" -eq 2 ] || fail "$1: the CUDA parent does not map the device (fake broken)"
}

# 1. Dump and restore, the device node gone before the restore (a machine without the device).
start_tree roundtrip
record_devices roundtrip
dump "$pid" "$T/img" || fail "dump of a tree with workers forked after CUDA started failed"
wait_gone "$pid" $workers
[ -z "$(plugin_errors "$T/dump.log")" ] || fail "plugin errors in the dump: $(plugin_errors "$T/dump.log")"
[ -s "$T/img/cuda-plugin-devices.img" ] || fail "no cuda-plugin-devices.img in the image"
grep -q "mapping of .*nvidia-mappable inherited from the NVIDIA driver" "$T/dump.log" || fail "no claim of the mapping logged"
grep -q "file .*nvidia-mappable (id .*) inherited from the NVIDIA driver" "$T/dump.log" || fail "no claim of the fd logged"
grep -q "2 process(es) of the tree hold NVIDIA device files inherited from a CUDA parent" "$T/dump.log" ||
	fail "the workers holding device files are not counted: $(grep 'process(es) of the tree' "$T/dump.log")"
# cuda-criu inspect shows, per worker, what it inherited and what the restore puts in its place.
if [ -x "$CUDA_CRIU" ]; then
	cuda_criu inspect "$T/img" >"$T/inspect.txt" || fail "inspect of the image failed"
	for w in $workers; do
		grep -qE "^pid $w \(ns pid $w\): 2 mapping\(s\), [0-9]+ open file\(s\)$" "$T/inspect.txt" ||
			fail "inspect: no line for worker $w: $(cat "$T/inspect.txt")"
		while read -r range perms; do
			grep -qF "  map $range $perms offset " "$T/inspect.txt" &&
				grep -qE "  map $range $perms offset [0-9a-fx]+ .*/nvidia-mappable -> zero-filled shared memory \(/dev/zero\)$" "$T/inspect.txt" ||
				fail "inspect: worker $w: no line for its mapping $range $perms: $(cat "$T/inspect.txt")"
		done <<<"${maps_before[$w]}"
		grep -qE "^  fd ${fd_before[$w]} .*/nvidia-mappable O_RDWR\|O_CLOEXEC -> /dev/null O_RDWR\|O_CLOEXEC$" "$T/inspect.txt" ||
			fail "inspect: worker $w: no line for its fd ${fd_before[$w]}: $(cat "$T/inspect.txt")"
	done
	grep -q "^pid $pid " "$T/inspect.txt" && fail "inspect: the CUDA parent listed as holding device files after its checkpoint"
	cuda_criu inspect --json "$T/img" | py "
w = sorted(int(x) for x in '$workers'.split())
p = d['inherited_devices']['processes']
assert sorted(x['pid'] for x in p) == w, p
for x in p:
    m = [v for v in x['mappings'] if v['path'].endswith('/nvidia-mappable')]
    assert len(m) == 2 and all(v['restored_as'] == 'zero-filled shared memory (/dev/zero)' for v in m), x
    assert all(v['start'].startswith('0x') and int(v['end'], 16) > int(v['start'], 16) for v in m), x
    f = [v for v in x['fds'] if v['path'].endswith('/nvidia-mappable')]
    assert len(f) == 1 and f[0]['flags'] == 'O_RDWR|O_CLOEXEC' and f[0]['restored_as'] == '/dev/null O_RDWR|O_CLOEXEC', x
assert any(v.endswith('/nvidia-mappable') for v in d['inherited_devices']['mapped_paths']), d" ||
		fail "inspect --json: $(cuda_criu inspect --json "$T/img")"
	log "inspect: per worker, its inherited mappings and fd and their placeholders (text and JSON)"
fi
before=$(batches)
drop_device
restore "$T/img" || fail "restore failed"
alive "$pid" || fail "the CUDA parent (pid $pid) is not running after restore"
for w in $workers; do alive "$w" || fail "worker $w is not running after restore"; done
expect_progress "after restore"
[ "$(batches)" -gt "$before" ] || fail "the batch count restarted"
check_placeholders roundtrip
log "roundtrip: tree restored without the device; workers go on ($before -> $(batches) batches); placeholders in place"
kill -9 "$pid" $workers; wait_gone "$pid" $workers

# 2. Onto another GPU: the tree dumped on GPU 0 and restored onto GPU 1 by a device map. The parent's
# GPU state moves; the workers' placeholders do not depend on the GPU.
make_device
start_tree remap
record_devices remap
[ "$(gpus_of "$pid")" = dev/nvidia0 ] || fail "remap: the parent is on '$(gpus_of "$pid")', not GPU 0"
dump "$pid" "$T/img-remap" || fail "remap: dump failed"
wait_gone "$pid" $workers
before=$(batches)
drop_device
CUDA_CRIU_DEVICE_MAP=0=1 restore "$T/img-remap" || fail "remap: restore onto GPU 1 failed"
expect_log "$T/restore.log" "restoring with GPU pairs: .*device map" "remap: no remap line"
for w in $pid $workers; do alive "$w" || fail "remap: pid $w is not running after restore"; done
# The parent checks its device memory against its pattern at every batch: status ok means intact.
expect_progress "remap"
[ "$(batches)" -gt "$before" ] || fail "remap: the batch count restarted"
[ "$(gpus_of "$pid")" = dev/nvidia1 ] || fail "remap: the parent is on '$(gpus_of "$pid")', not GPU 1"
check_placeholders remap
log "remap: tree dumped on GPU 0 restored onto GPU 1; parent's data intact, workers go on, placeholders in place"
kill -9 "$pid" $workers; wait_gone "$pid" $workers

# 3. --leave-running: the tree goes on untouched, the workers keep their mappings.
make_device
start_tree leave
dump "$pid" "$T/img-leave" -R || fail "dump -R failed"
alive "$pid" || fail "-R: the parent is gone"
expect_progress "-R"
for w in $workers; do [ "$(device_maps "$w" | wc -l)" -eq 2 ] || fail "-R: worker $w lost its mappings"; done
log "--leave-running: tree untouched and going on"
kill -9 "$pid" $workers; wait_gone "$pid" $workers

# 4. A dump that fails after everything was dumped (the post-dump script fails): rolled back.
cat >"$T/post-dump-fails.sh" <<'EOS'
#!/bin/sh
[ "$CRTOOLS_SCRIPT_ACTION" = post-dump ] && exit 1
exit 0
EOS
chmod +x "$T/post-dump-fails.sh"
start_tree rollback
mkdir -p "$T/img-rollback"
"$CRIU" dump -t "$pid" -D "$T/img-rollback" -L "$PLUGIN_DIR" -v4 -o dump.log --action-script "$T/post-dump-fails.sh" \
	2>/dev/null && fail "rollback: criu reported success despite the failing post-dump script"
alive "$pid" || fail "rollback: the parent was killed"
for w in $workers; do alive "$w" || fail "rollback: worker $w was killed"; done
expect_progress "rollback"
for w in $workers; do [ "$(device_maps "$w" | wc -l)" -eq 2 ] || fail "rollback: worker $w lost its mappings"; done
log "failed dump: tree rolled back and going on"
kill -9 "$pid" $workers; wait_gone "$pid" $workers

# 5. Stock CRIU 4.1.1 (the same hooks exist there): works too.
if stock_criu; then
	start_tree stock
	CRIU=$CRIU411 dump "$pid" "$T/img-411" || fail "CRIU 4.1.1: dump failed"
	wait_gone "$pid" $workers
	CRIU=$CRIU411 restore "$T/img-411" || fail "CRIU 4.1.1: restore failed"
	for w in $pid $workers; do alive "$w" || fail "CRIU 4.1.1: pid $w not running after restore"; done
	expect_progress "CRIU 4.1.1"
	log "CRIU 4.1.1: dump and restore work"
	kill -9 "$pid" $workers; wait_gone "$pid" $workers
else
	log "$STOCK_WHY: skipped that part"
fi
# 6. A CUDA process that still maps a device file after its checkpoint (a faulty driver): the dump fails
# naming it, and the tree is returned to running.
FAKEGPU_KEEP_DEVICE_MAPPING=1 start_tree keeps
dump "$pid" "$T/img-keeps" && fail "keeps: the dump of a CUDA process still mapping a device file succeeded"
grep -q "pid $pid still maps 2 NVIDIA device file(s) .* after its CUDA checkpoint" "$T/dump.log" ||
	fail "keeps: no clear error: $(plugin_errors "$T/dump.log")"
alive "$pid" || fail "keeps: the parent was killed"
expect_progress "keeps"
log "a CUDA process still mapping a device after its checkpoint: dump refused, tree going on"
kill -9 "$pid" $workers; wait_gone "$pid" $workers

# 7. cuda-criu roundtrip: two cycles of dump, exit, restore, health.
if [ -x "$CUDA_CRIU" ]; then
	cat >"$T/healthy.sh" <<'EOS'
b() { sed -n 's/^batches=//p' "$1"; }
x=$(b "$1"); sleep 0.3; y=$(b "$1")
grep -qx status=ok "$1" && [ "${y:-0}" -gt "${x:-0}" ]
EOS
	rc=0
	"$CUDA_CRIU" roundtrip --criu "$CRIU" --libdir "$PLUGIN_DIR" --repeat 2 --ready-file "$T/rt.state" \
		--health-cmd "sh $T/healthy.sh $T/rt.state" --require-cuda -- \
		env "LD_LIBRARY_PATH=$(dirname "$FAKE_LIB")" "$FORK_WORKERS" --state "$T/rt.state" --workers 2 \
		--interval-ms 10 >"$T/rt.txt" 2>&1 || rc=$?
	[ $rc -eq 0 ] || fail "cuda-criu roundtrip exited $rc: $(cat "$T/rt.txt")"
	grep -qE '^PASS  roundtrip cuda_fork_workers: 2 cycle\(s\)' "$T/rt.txt" || fail "roundtrip: no PASS line: $(cat "$T/rt.txt")"
	log "cuda-criu roundtrip: 2 cycles pass"
fi
log "PASS"
