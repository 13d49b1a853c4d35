#!/usr/bin/env bash
# The GPU reservation ledger cannot be used against restores (os/gpu_ledger.h, docs/hardening.md): a
# CUDA process (fake GPU, fake NVML with room) is dumped once, then restored from that image once per
# hostile state planted in the ledger's place (CUDA_CRIU_LEDGER, a directory of this test's): a lock held
# by another uid, the directory or the file owned by that uid, loose modes, symbolic links, garbage, a
# FIFO. Each restore must complete within the lock's deadline (CUDA_CRIU_LEDGER_TIMEOUT) plus the
# restore's own time, its process running with its device data verified and nothing half-restored, the
# plugin's warning naming the file and the reason where the ledger is not used; what was planted is never
# written through.
source "$(dirname "$0")/lib.sh"
e2e_setup
start_fake_gpu

OTHER=64123 # a uid of no one's, made for the test: owns nothing else, no name needed
DIR=$T/run/cuda-criu
LEDGER=$DIR/gpu-reservations
WAIT_S=2
export CUDA_CRIU_LEDGER=$LEDGER CUDA_CRIU_LEDGER_TIMEOUT=$WAIT_S
mkdir -p "$T/run"
chmod 0755 "$T" "$T/run"

start_memcheck ledger 16
pid=$LAST_PID
dump "$pid" "$T/img" || fail "dump failed"
wait_gone "$pid"
state_mib=$(grep -oE "dump: 1 CUDA process\(es\), [0-9.]+ MiB of GPU state" "$T/dump.log" | grep -oE "[0-9.]+ MiB" | cut -d' ' -f1)
[ -n "$state_mib" ] || fail "no GPU state size in the dump's summary"
room=(LD_LIBRARY_PATH="$FAKE_NVML_DIR" FAKENVML_FREE=$((1 << 34)))

# restore_case NAME WARNING: restores the image with the fake NVML; the restore must succeed within the
# deadline and a margin, its process run healthy, and its log match WARNING ("" = no ledger warning).
restore_case() {
	local name=$1 warning=$2 t0 took
	t0=$(date +%s%N)
	env "${room[@]}" "$CRIU" restore -D "$T/img" -d -L "$PLUGIN_DIR" -v4 -o "$T/restore-$name.log" </dev/null \
		>/dev/null 2>&1 || fail "$name: criu restore failed: $(grep -m2 -E "Error \(cuda_plugin\)|Restoring FAILED" "$T/restore-$name.log")"
	took=$((($(date +%s%N) - t0) / 1000000))
	[ "$took" -lt $(((WAIT_S + 15) * 1000)) ] || fail "$name: the restore took $took ms (deadline ${WAIT_S} s)"
	expect_summary "$T/restore-$name.log" restore 1 "$name: no clean restore summary"
	[ -z "$(plugin_errors "$T/restore-$name.log")" ] || fail "$name: errors: $(plugin_errors "$T/restore-$name.log")"
	alive "$pid" || fail "$name: pid $pid not running after the restore"
	[ "$(cuda_state "$pid")" = running ] || fail "$name: CUDA state $(cuda_state "$pid") after the restore"
	expect_healthy "$STATE"
	if [ -n "$warning" ]; then
		expect_log "$T/restore-$name.log" "Warn.*cuda_plugin.*$warning" "$name: no warning naming it"
	else
		! grep -qE "Warn.*cuda_plugin.*(ledger|reservation)" "$T/restore-$name.log" ||
			fail "$name: a ledger warning: $(grep -m1 -E "ledger|reservation" "$T/restore-$name.log")"
	fi
	log "$name: restored in $took ms, running, data verified${warning:+; warned}"
	kill -9 "$pid"
	wait_gone "$pid"
}

mode_of() { stat -c %a "$1"; }
owner_of() { stat -c %u "$1"; }

# 1. None yet: made 0700 / 0600, root's; the reservation is gone once the restore is done.
restore_case fresh ""
[ "$(mode_of "$DIR") $(owner_of "$DIR")" = "700 0" ] || fail "fresh: directory $(mode_of "$DIR") uid $(owner_of "$DIR")"
[ "$(mode_of "$LEDGER") $(owner_of "$LEDGER")" = "600 0" ] || fail "fresh: file $(mode_of "$LEDGER") uid $(owner_of "$LEDGER")"
[ ! -s "$LEDGER" ] || fail "fresh: reservations left after the restore: $(cat "$LEDGER")"
# Another user cannot even open it, so neither lock it nor read it.
! setpriv --reuid=$OTHER --regid=$OTHER --clear-groups flock -n "$LEDGER" true 2>/dev/null ||
	fail "uid $OTHER could lock the ledger"
! setpriv --reuid=$OTHER --regid=$OTHER --clear-groups flock -n "$DIR" true 2>/dev/null ||
	fail "uid $OTHER could lock the ledger's directory"

# 2. Loose modes of root's, as an older version left them: tightened, one line each, used.
chmod 0755 "$DIR"
chmod 0644 "$LEDGER"
restore_case loose ""
expect_log "$T/restore-loose.log" "ledger's directory $DIR had mode 0755: now 0700" "loose: the directory not tightened"
expect_log "$T/restore-loose.log" "ledger's file $LEDGER had mode 0644: now 0600" "loose: the file not tightened"
[ "$(mode_of "$DIR")/$(mode_of "$LEDGER")" = 700/600 ] || fail "loose: modes $(mode_of "$DIR")/$(mode_of "$LEDGER")"

# 3. The lock held by another uid (an fd of the directory root opened, handed to it): the restore waits
#    for the deadline, no longer, and goes on without the ledger.
exec {held}<"$DIR"
setpriv --reuid=$OTHER --regid=$OTHER --clear-groups bash -c "flock -x $held && exec sleep 120" &
holder=$!
PIDS+=("$holder")
exec {held}<&-
wait_for "uid $OTHER to hold the ledger's lock" 10 bash -c "! flock -n '$DIR' true"
restore_case locked "ledger $LEDGER stayed locked by another process for 2.0 s \(ledger-timeout\): this restore goes on without it"
kill "$holder"
wait "$holder" 2>/dev/null || true

# 4. The directory owned by that uid: not used.
chown $OTHER "$DIR"
restore_case dir-owner "ledger $LEDGER cannot be trusted \($DIR is owned by uid $OTHER"
chown 0 "$DIR"

# 5. The file owned by that uid: not used, not written.
chown $OTHER "$LEDGER"
before=$(stat -c %Y.%i "$LEDGER")
restore_case file-owner "ledger $LEDGER cannot be trusted \($LEDGER is owned by uid $OTHER"
[ "$(stat -c %Y.%i "$LEDGER")" = "$before" ] || fail "file-owner: the file was replaced"
rm -f "$LEDGER"

# 6. The file a symbolic link: not followed, its target untouched.
echo "not the ledger" >"$T/target"
ln -s "$T/target" "$LEDGER"
restore_case file-symlink "ledger $LEDGER cannot be trusted \(it is a symbolic link\)"
[ "$(cat "$T/target")" = "not the ledger" ] && [ -L "$LEDGER" ] || fail "file-symlink: written through"
rm -f "$LEDGER"

# 7. The directory a symbolic link (to a directory of root's, 0700): not followed.
mkdir -m 0700 "$T/elsewhere"
rm -rf "$DIR"
ln -s "$T/elsewhere" "$DIR"
restore_case dir-symlink "ledger $LEDGER cannot be trusted \($DIR is a symbolic link\)"
[ -z "$(ls -A "$T/elsewhere")" ] || fail "dir-symlink: written through: $(ls -A "$T/elsewhere")"
rm -f "$DIR"
mkdir -m 0700 "$DIR"

# 8. Garbage: not used, left as it is.
printf 'garbage\n' >"$LEDGER"
chmod 0600 "$LEDGER"
restore_case garbage "ledger $LEDGER cannot be trusted \(a line of it is not"
[ "$(cat "$LEDGER")" = garbage ] || fail "garbage: the file was rewritten"
rm -f "$LEDGER"

# 9. A FIFO in the file's place: refused from its type, never blocks.
mkfifo -m 0600 "$LEDGER"
restore_case fifo "ledger $LEDGER cannot be trusted \($LEDGER is not a regular file\)"
rm -f "$LEDGER"

# 10. Used again once cleaned up: no warning, nothing left.
restore_case clean-again ""
[ ! -s "$LEDGER" ] || fail "clean-again: reservations left: $(cat "$LEDGER")"
log PASS
