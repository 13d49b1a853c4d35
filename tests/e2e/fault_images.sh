#!/usr/bin/env bash
# Hostile cuda-plugin.img files: a real image of a fake-GPU workload, then variants of its cuda-plugin.img
# (truncated, corrupt, newer format version, bad magic, 1 TiB sparse, empty, a symlink to /etc/passwd, a
# FIFO, a directory, processes and GPUs that do not exist). Each restore must end quickly (no hang), fail
# with an "Error (cuda_plugin): ..." line that names the problem, and leave no process running; an image
# whose pids do not exist restores by detection and says so.
source "$(dirname "$0")/lib.sh"
e2e_setup
IMAGE_EDIT=$BUILD_DIR/tests/fuzz/image_edit
[ -x "$IMAGE_EDIT" ] || fail "no $IMAGE_EDIT: build the image_edit target"
start_fake_gpu
RESTORE_TIMEOUT=${RESTORE_TIMEOUT:-60}

start_memcheck base 16
pid=$LAST_PID
dump "$pid" "$T/base" || fail "dump of the workload failed"
wait_gone "$pid"
img=cuda-plugin.img
[ -f "$T/base/$img" ] || fail "no $img in the dump"
rm -f "$T/base/dump.log"

# variant NAME: a fresh copy of the dump in $T/v-NAME, whose cuda-plugin.img the caller then spoils.
variant() {
	V=$T/v-$1
	rm -rf "$V"
	cp -a "$T/base" "$V"
}

# try_restore NAME: restores $V under a time limit; sets RC (124: it hung) and copies the log.
try_restore() {
	local name=$1
	local t0=$SECONDS
	RC=0
	timeout -s KILL "$RESTORE_TIMEOUT" "$CRIU" restore -D "$V" -d -L "$PLUGIN_DIR" -v4 -o restore.log \
		</dev/null >/dev/null 2>&1 || RC=$?
	SPENT=$((SECONDS - t0))
	cp "$V/restore.log" "$T/restore.log" 2>/dev/null || : >"$T/restore.log"
	[ "$RC" -ne 137 ] || fail "$name: criu restore hung (killed after ${RESTORE_TIMEOUT}s)"
	[ "$RC" -le 128 ] || fail "$name: criu died of signal $((RC - 128))"
	return 0
}

# must_refuse NAME PATTERN: the restore of $V fails, the plugin's error line matches PATTERN, and the
# dumped process does not run.
must_refuse() {
	local name=$1 pattern=$2
	try_restore "$name"
	[ "$RC" -ne 0 ] || fail "$name: the restore succeeded with a hostile image"
	local line
	line=$(grep -E "Error \(cuda_plugin\): .*($pattern)" "$T/restore.log" | head -n1)
	[ -n "$line" ] || fail "$name: no 'Error (cuda_plugin): ...' line matching '$pattern'"
	# Killed by the failed restore, and reaped (the next variant restores the same pid).
	wait_for "$name: no restored process" 20 sh -c "! [ -e /proc/$pid ]"
	log "$name: refused in ${SPENT}s: ${line#*Error (cuda_plugin): }"
}

variant truncated
head -c 60 "$T/base/$img" >"$V/$img"
must_refuse truncated "truncated or padded image"

variant header-only
head -c 10 "$T/base/$img" >"$V/$img"
must_refuse header-only "truncated image: 10 bytes"

variant empty
: >"$V/$img"
must_refuse empty "truncated image: 0 bytes"

variant corrupt
printf '\377\377\377\377' | dd of="$V/$img" bs=1 seek=12 conv=notrunc status=none
must_refuse corrupt "corrupt image"

variant bad-magic
printf 'XXXXXXXX' | dd of="$V/$img" bs=1 seek=0 conv=notrunc status=none
must_refuse bad-magic "bad magic"

variant newer-version # byte 13: the version varint right after the 12-byte header and field tag 0x08
[ "$(od -An -tx1 -j12 -N1 "$T/base/$img" | tr -d ' ')" = 08 ] || fail "unexpected layout of $img"
printf '\003' | dd of="$V/$img" bs=1 seek=13 conv=notrunc status=none
must_refuse newer-version "written by a newer cuda_plugin"

variant oversized # 1 TiB, sparse: refused from its size, never read
truncate -s 1T "$V/$img"
must_refuse oversized "more than any image"

variant symlink
rm "$V/$img"
ln -s /etc/passwd "$V/$img"
must_refuse symlink "symbolic link"

variant fifo # a FIFO with no writer must not block the restore
rm "$V/$img"
mkfifo "$V/$img"
must_refuse fifo "not a regular file"

variant directory
rm "$V/$img"
mkdir "$V/$img"
must_refuse directory "not a regular file|Is a directory"

variant unknown-gpu # a GPU model this machine does not have
"$IMAGE_EDIT" "$T/base/$img" "$V/$img" --gpu-uuid GPU-deadbeef-dead-beef-dead-beefdeadbeef \
	--gpu-name "NVIDIA Z9000" || fail "image_edit failed"
must_refuse unknown-gpu "NVIDIA Z9000"

# Pids that do not exist: the image names a process CRIU's images do not have. The restored CUDA process
# is found by detection and restored; the stray entry is reported, nothing else happens.
variant unknown-pid
ghost=$(( $(cat /proc/sys/kernel/pid_max) - 7 ))
[ ! -e "/proc/$ghost" ] || fail "pid $ghost exists"
"$IMAGE_EDIT" "$T/base/$img" "$V/$img" --pid "$pid=$ghost" || fail "image_edit failed"
try_restore unknown-pid
[ "$RC" -eq 0 ] || fail "unknown-pid: restore failed (exit $RC)"
expect_log "$T/restore.log" "process $ghost of the image .* not found" "unknown-pid: the stray pid is not reported"
expect_summary "$T/restore.log" restore 1 "unknown-pid: the real process was not restored"
[ -z "$(plugin_errors "$T/restore.log")" ] || fail "unknown-pid: errors in the restore log"
[ ! -e "/proc/$ghost" ] || fail "unknown-pid: pid $ghost appeared"
[ "$(cuda_state "$pid")" = running ] || fail "unknown-pid: CUDA state $(cuda_state "$pid")"
expect_healthy "$STATE"
kill -9 "$pid"
wait_for "pid $pid to be reaped" 20 gone "$pid"
log "unknown-pid: restored by detection in ${SPENT}s, stray image entry reported"

# Nothing of ours is left: no criu, nothing started from a variant's directory.
! pgrep -f "criu restore -D $T/" >/dev/null || fail "criu still running: $(pgrep -af "criu restore -D $T/")"
for d in "$T"/v-*; do
	! pgrep -f "$d/" >/dev/null || fail "a process of $d is still running"
done
log PASS
