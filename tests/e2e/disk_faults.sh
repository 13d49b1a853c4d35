#!/usr/bin/env bash
# Disk faults (docs/faults.md): how close the room preflight's estimate is to the image a dump writes; a
# dump onto a small tmpfs that fills up mid-dump, in both orders (the plugin's GPU image write fails;
# CRIU's pages write fails after the GPU image was written): the dump fails, the process runs on with its
# data, and what the directory keeps does not restore; a tmpfs clearly too small: refused by the room
# preflight before any lock; a read-only image directory at restore (the plugin's GPU image mapped or
# written back, and CRIU's pages mapped, gpu-image=criu). Needs root (mounts).
source "$(dirname "$0")/lib.sh"
e2e_setup
start_fake_gpu

# The tmpfs mounts of this test go before the temporary directory that holds them: the processes that
# may map an image on them are killed first.
MOUNTS=()
disk_cleanup() {
	set +e
	local p m
	for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
	for p in "${PIDS[@]}"; do
		for _ in $(seq 100); do [ -e "/proc/$p" ] || break; sleep 0.05; done
	done
	for m in "${MOUNTS[@]}"; do umount "$m" 2>/dev/null || umount -l "$m"; done
	return 0
}
on_exit disk_cleanup

# mount_tmpfs NAME MB: a tmpfs of MB MiB at $T/NAME; sets M.
mount_tmpfs() {
	M=$T/$1
	mkdir -p "$M"
	mount -t tmpfs -o "size=$2m,mode=0700" tmpfs "$M" || fail "cannot mount a tmpfs at $M"
	MOUNTS+=("$M")
}

# CRIU asks the fake NVML for each process's GPU memory (the preflight's estimate), and logs outside the
# image directory (a full or read-only one would lose the log).
# cdump NAME PID DIR [criu options]: the log in $T/NAME-dump.log ($LOG).
cdump() {
	local name=$1 pid=$2 dir=$3
	shift 3
	LOG=$T/$name-dump.log
	mkdir -p "$dir"
	LD_LIBRARY_PATH=$FAKE_NVML_DIR timeout -s KILL 60 "$CRIU" dump -t "$pid" -D "$dir" -L "$PLUGIN_DIR" -v4 \
		-o "$LOG" "$@" </dev/null >/dev/null 2>&1
}
# crestore NAME DIR [criu options]: the log in $T/NAME-restore.log ($LOG).
crestore() {
	local name=$1 dir=$2
	shift 2
	LOG=$T/$name-restore.log
	timeout -s KILL 60 "$CRIU" restore -D "$dir" -d -L "$PLUGIN_DIR" -v4 -o "$LOG" "$@" </dev/null >/dev/null 2>&1
}

plugin_files() { (cd "$1" && ls -1 cuda-plugin.img cuda-gpu*.img 2>/dev/null | xargs); }
on_disk() { du -s --block-size=1 "$1" | cut -f1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
# floor_estimate LOG: "FLOOR ESTIMATE" in bytes, from the plugin's preflight line (MiB with one decimal).
floor_estimate() {
	sed -nE 's/.*space preflight: .* the image needs at least ([0-9.]+) MiB, up to ([0-9.]+) MiB.*/\1 \2/p' "$1" |
		head -n1 | awk '{ printf "%d %d\n", $1 * 1048576, $2 * 1048576 }'
}

# restored STATE: a workload of STATE runs (a restored one included), whatever its pid: a pid the test
# killed may be another process's by now (the pid space wraps on a busy machine).
restored() { pgrep -f -- "--state $1" >/dev/null; }

# must_not_restore NAME DIR PID: the dumped process is gone (killed by the test); a restore of DIR fails
# and leaves nothing of it running.
must_not_restore() {
	local name=$1 dir=$2 pid=$3
	kill -9 "$pid"
	wait_gone "$pid"
	if crestore "$name" "$dir"; then fail "$name: the directory of the failed dump restored"; fi
	expect_log "$LOG" "No inventory.img image" "$name: the restore does not fail for want of CRIU's inventory"
	sleep 0.3
	! restored "$STATE" || fail "$name: a process of the failed dump runs after the refused restore"
	log "$name: the restore fails: $(grep -E 'Error \(' "$LOG" | grep -v RLIMIT | head -n1 | cut -c1-140)"
}

# 1. How close the estimate is: a workload with 16 MiB of data and 32 MiB of zeroed GPU memory, dumped
#    with the GPU image (zeros left out) and with gpu-image=criu (zeros written), into the disk. The real
#    image lies between the floor and the estimate (plus CRIU's small images).
for mode in plugin criu; do
	start_memcheck "size-$mode" 16 --zero-mb 32
	pid=$LAST_PID
	CUDA_CRIU_GPU_IMAGE=$mode cdump "size-$mode" "$pid" "$T/img-$mode" || fail "size-$mode: dump failed"
	wait_gone "$pid"
	read -r floor estimate < <(floor_estimate "$LOG") || fail "size-$mode: no space preflight line"
	real=$(on_disk "$T/img-$mode")
	# (the log gives the floor to 0.1 MiB, rounded: the exact floor may be up to 0.05 MiB below the figure,
	# and with gpu-image=criu the image exceeds it by CRIU's small images alone, ~0.1 MiB)
	[ "$real" -ge $((floor - 52429)) ] || fail "size-$mode: the image ($real bytes) is smaller than the preflight's floor ($floor)"
	[ "$real" -le $((estimate + (1 << 20))) ] || fail "size-$mode: the image ($real bytes) exceeds the estimate ($estimate) by more than 1 MiB"
	log "gpu-image=$mode: image $(mib "$real") MiB on disk; preflight floor $(mib "$floor") MiB, estimate $(mib "$estimate") MiB ($(awk -v r="$real" -v e="$estimate" 'BEGIN { printf "%.0f", 100 * e / r }')% of the image)"
	eval "pid_$mode=$pid state_$mode=$STATE"
done

# 2a. The GPU image's write fails: 96 MiB of GPU data, 64 MiB of private memory, a tmpfs of 80 MiB. The
#     preflight only warns (the floor, 64 MiB, fits; the estimate, 160 MiB, does not); two writers, both
#     files removed.
start_memcheck full-gpu 96
pid=$LAST_PID
mount_tmpfs full-gpu 80
if CUDA_CRIU_IO_THREADS=2 cdump full-gpu "$pid" "$M"; then fail "full-gpu: the dump succeeded on a full tmpfs"; fi
expect_log "$LOG" "Warn .*cuda_plugin\): the image may not fit in $M: its file system has 80.0 MiB free" \
	"full-gpu: the preflight did not warn"
expect_log "$LOG" "Error \(cuda_plugin\): cannot store the GPU image \(the dump fails; every process is returned to its state\): .*write cuda-gpu-[0-9]+\.img at offset [0-9]+: No space left on device" \
	"full-gpu: the error does not name the file and ENOSPC"
expect_log "$LOG" "all CUDA processes are back as they were found" "full-gpu: no rollback"
expect_healthy "$STATE"
[ "$(cuda_state "$pid")" = running ] || fail "full-gpu: the process is $(cuda_state "$pid")"
[ -z "$(plugin_files "$M")" ] || fail "full-gpu: the failed dump left $(plugin_files "$M")"
log "full-gpu: $(grep -m1 -oE 'write cuda-gpu-[0-9]+\.img at offset [0-9]+: No space left on device' "$LOG"); process running, no plugin file left"
must_not_restore full-gpu "$M" "$pid"

# 2b. CRIU's pages write fails after the GPU image was written (written before CRIU goes on:
#     write-while-dumping=off; with it, which of the two writes finds the file system full first is a race,
#     2a's case): 16 MiB of GPU data (and 32 of zeros), 16 MiB
#     of private memory, a tmpfs of 24 MiB. The plugin's rollback at exit(DUMP) returns the process. CRIU
#     removes no image of a failed dump, nor does the plugin: the GPU image stays, but CRIU never wrote
#     its inventory, so the directory does not restore.
start_memcheck full-pages 16 --zero-mb 32
pid=$LAST_PID
mount_tmpfs full-pages 24
if CUDA_CRIU_WRITE_WHILE_DUMPING=off cdump full-pages "$pid" "$M"; then fail "full-pages: the dump succeeded on a full tmpfs"; fi
expect_log "$LOG" "cuda_plugin: GPU image: 48.0 MiB of GPU state, 16.0 MiB written" "full-pages: the GPU image was not written first"
expect_log "$LOG" "Error \(criu/.*No space left on device" "full-pages: CRIU's write did not fail for lack of space"
expect_log "$LOG" "dump failed: returning 1 CUDA process\(es\) to the state they were found in" "full-pages: no rollback"
expect_log "$LOG" "all CUDA processes are back as they were found" "full-pages: the process was not returned"
expect_healthy "$STATE"
[ "$(cuda_state "$pid")" = running ] || fail "full-pages: the process is $(cuda_state "$pid")"
[ ! -e "$M/inventory.img" ] || fail "full-pages: CRIU wrote its inventory"
expect_log "$LOG" "dump failed: the GPU image's files \([0-9]+\) removed" "full-pages: the GPU image's removal is not logged"
[ "$(plugin_files "$M")" = cuda-plugin.img ] || fail "full-pages: left $(plugin_files "$M"), not cuda-plugin.img alone"
log "full-pages: $(grep -m1 -oE 'Error \(criu/[^)]*\): .*No space left on device' "$LOG"); left in the directory: $(plugin_files "$M") and CRIU's partial images, no inventory.img"
must_not_restore full-pages "$M" "$pid"

# 2c. The GPU image's write fails while CRIU dumps the process and CRIU's own dump succeeds (a folder where
#     the first data file goes): CRIU waits for the write before its inventory (criu-patches/0009) and
#     fails the dump there; the process runs on, no inventory, nothing of the plugin's left.
start_memcheck gpu-write-late 16
pid=$LAST_PID
M="$T/gpu-write-late"
mkdir -p "$M/cuda-gpu-0.img"
if cdump gpu-write-late "$pid" "$M"; then fail "gpu-write-late: the dump succeeded without its GPU image"; fi
expect_log "$LOG" "cuda_plugin: GPU image: written while CRIU dumps the processes" \
	"gpu-write-late: the GPU image was not written while CRIU dumped the process"
expect_log "$LOG" "Error \(cuda_plugin\): cannot store the GPU image \(the dump fails; every process is returned to its state\): .*cuda-gpu-0\.img.*Is a directory" \
	"gpu-write-late: the error does not name the file and EISDIR"
expect_log "$LOG" "A plugin's work before the inventory failed" "gpu-write-late: CRIU did not fail the dump before its inventory"
expect_log "$LOG" "all CUDA processes are back as they were found" "gpu-write-late: no rollback"
expect_healthy "$STATE"
[ "$(cuda_state "$pid")" = running ] || fail "gpu-write-late: the process is $(cuda_state "$pid")"
[ ! -e "$M/inventory.img" ] || fail "gpu-write-late: CRIU wrote its inventory"
rmdir "$M/cuda-gpu-0.img" || fail "gpu-write-late: something was written into the folder in the way"
[ -z "$(plugin_files "$M")" ] || fail "gpu-write-late: the failed dump left $(plugin_files "$M")"
log "gpu-write-late: $(grep -m1 -oE "A plugin's work before the inventory failed" "$LOG"); process running, no inventory"
must_not_restore gpu-write-late "$M" "$pid"

# 2d. The room preflight: a tmpfs of 4 MiB for 16 MiB of private memory. Refused before any lock: the
#     fake driver would fail a lock (FAKEGPU_FAIL=lock in CRIU's environment), and no lock is logged.
start_memcheck no-room 16 --zero-mb 32
pid=$LAST_PID
mount_tmpfs no-room 4
t0=$SECONDS
if FAKEGPU_FAIL=lock cdump no-room "$pid" "$M"; then fail "no-room: the dump succeeded"; fi
expect_log "$LOG" "Error \(cuda_plugin\): not enough room for the image in $M: its file system has 4.0 MiB free, but this dump writes at least [0-9.]+ MiB there \(up to [0-9.]+ MiB; .*\)\. Free [0-9.]+ MiB there, dump into a directory with room \(criu dump -D\), or set CUDA_CRIU_SPACE_CHECK=warn" \
	"no-room: no refusal naming the room, the estimate and the fix"
if grep -qE "cuCheckpointProcessLock|lock [0-9.]+ ms|checkpointing" "$LOG"; then fail "no-room: a process was locked before the refusal"; fi
[ "$(cuda_state "$pid")" = running ] || fail "no-room: the process is $(cuda_state "$pid")"
expect_healthy "$STATE"
[ -z "$(plugin_files "$M")" ] || fail "no-room: the refused dump left $(plugin_files "$M")"
log "no-room: refused in $((SECONDS - t0)) s before any lock: $(grep -m1 -oE 'not enough room.*' "$LOG" | cut -c1-200)"
kill -9 "$pid"; wait_gone "$pid"

# 3. A read-only image directory at restore. A restore writes nothing into the image directory that it
#    needs: CRIU's stats-restore fails with an error line and is let go, and the images are mapped
#    MAP_PRIVATE or read. CRIU's own log is the one file it must create: inside a read-only directory
#    it cannot start (with the default -o restore.log, a relative name).
# ro_copy NAME SRC: SRC copied onto a tmpfs mounted read-only at $T/NAME ($M).
ro_copy() {
	mount_tmpfs "$1" 100
	cp -a "$2/." "$M/"
	mount -o remount,ro "$M" || fail "$1: cannot remount $M read-only"
	touch "$M/x" 2>/dev/null && fail "$1: $M is writable"
	return 0
}
ro_copy ro-plugin "$T/img-plugin"
pid=$pid_plugin STATE=$state_plugin
if timeout -s KILL 60 "$CRIU" restore -D "$M" -d -L "$PLUGIN_DIR" -v4 -o restore.log </dev/null >"$T/ro-log.out" 2>&1; then
	fail "ro-log: CRIU restored with its log in a read-only directory"
fi
! restored "$STATE" || fail "ro-log: a process runs after the failed restore"
log "ro-log: criu restore -o restore.log in a read-only directory fails at once: $(grep -m1 -iE 'read-only|error' "$T/ro-log.out" | cut -c1-140)"
for how in mapped written; do
	if [ "$how" = written ]; then export CUDA_CRIU_MAP_IMAGE=off; fi
	crestore "ro-$how" "$M" || fail "ro-$how: the restore from a read-only directory failed: $(plugin_errors "$LOG")"
	unset CUDA_CRIU_MAP_IMAGE
	expect_summary "$LOG" restore 1 "ro-$how: no restore summary"
	if [ "$how" = mapped ]; then
		expect_log "$LOG" "asking CRIU to map its GPU image .* from the plugin's files" "ro-mapped: not mapped"
	else
		expect_log "$LOG" "the GPU image is written into the processes by the plugin" "ro-written: not written"
	fi
	[ -z "$(plugin_errors "$LOG")" ] || fail "ro-$how: plugin errors: $(plugin_errors "$LOG")"
	expect_healthy "$STATE"
	log "ro-$how: GPU image $how from a read-only directory: restored ($(grep -m1 -oE 'Unable to open stats-restore: [A-Za-z -]+' "$LOG" || echo 'no stats-restore error'))"
	kill -9 "$pid"; wait_gone "$pid"
done

ro_copy ro-criu "$T/img-criu"
pid=$pid_criu STATE=$state_criu
crestore ro-criu "$M" || fail "ro-criu: the restore from a read-only directory failed: $(plugin_errors "$LOG")"
expect_summary "$LOG" restore 1 "ro-criu: no restore summary"
expect_log "$LOG" "asking CRIU to map its GPU state .* from the image" "ro-criu: not mapped from CRIU's pages"
[ -z "$(plugin_errors "$LOG")" ] || fail "ro-criu: plugin errors: $(plugin_errors "$LOG")"
expect_healthy "$STATE"
log "ro-criu: CRIU's pages (gpu-image=criu) mapped from a read-only directory: restored"
kill -9 "$pid"; wait_gone "$pid"
log PASS
