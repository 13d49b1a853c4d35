#!/usr/bin/env bash
# Least privilege: `criu dump` and `criu restore` run by an unprivileged user (nobody, no capabilities)
# against a fake-GPU workload of root must fail quickly with a clear error, and leave the workload
# running on its GPU exactly as before (not locked, not checkpointed); so must `cuda-criu checkpoint`,
# `restore` and `roundtrip`, each in one line that names root. docs/hardening.md explains
# which privileges a dump and a restore need.
source "$(dirname "$0")/lib.sh"
e2e_setup
command -v setpriv >/dev/null || { echo "SKIP: no setpriv (util-linux)"; exit 77; }
NOBODY=${NOBODY_UID:-65534}
as_nobody() { setpriv --reuid="$NOBODY" --regid="$NOBODY" --clear-groups --inh-caps=-all "$@"; }
# The unprivileged criu must be able to reach CRIU, the plugin and the fake GPU's files.
for p in "$CRIU" "$PLUGIN_DIR/cuda_plugin.so" "$FAKE_LIB"; do
	as_nobody test -r "$p" || { echo "SKIP: $p is not readable by uid $NOBODY"; exit 77; }
done
chmod 755 "$T"
start_fake_gpu
chmod -R a+rX "$FAKEGPU_DIR"

start_memcheck victim 16 --children 1
pid=$LAST_PID
wait_for "child" 10 test -f "$STATE.0"
child=$(state_value "$STATE.0" pid)
img=$T/img-nobody
mkdir -p "$img"
chown "$NOBODY:$NOBODY" "$img"

t0=$SECONDS
rc=0
as_nobody timeout -s KILL 60 "$CRIU" dump -t "$pid" -D "$img" -L "$PLUGIN_DIR" -v4 -o dump.log \
	</dev/null >"$T/criu.out" 2>&1 || rc=$?
spent=$((SECONDS - t0))
cp "$img/dump.log" "$T/dump.log" 2>/dev/null || true
[ "$rc" -ne 0 ] || fail "criu dump as uid $NOBODY succeeded"
[ "$rc" -ne 137 ] || fail "criu dump as uid $NOBODY hung (killed after 60 s)"
[ "$spent" -le 10 ] || fail "criu dump as uid $NOBODY took ${spent}s to fail"
# CRIU refuses before the plugin touches anything; its reason is on stderr or in the log.
reason=$(grep -hE 'Error|denied|not permitted|root|capabilit' "$T/criu.out" "$T/dump.log" 2>/dev/null | head -n3 || true)
[ -n "$reason" ] || fail "no clear error from an unprivileged dump: $(cat "$T/criu.out")"
log "unprivileged dump failed in ${spent}s (exit $rc): $(echo "$reason" | head -n1)"
for p in "$pid" "$child"; do
	alive "$p" || fail "pid $p died"
	s=$(cuda_state "$p")
	[ "$s" = running ] || fail "pid $p left $s by an unprivileged dump"
done
expect_healthy "$STATE"
expect_healthy "$STATE.0"
[ ! -e "$img/cuda-plugin.img" ] || fail "an unprivileged dump wrote cuda-plugin.img"
log "workload untouched: both processes running on the GPU, data intact"

# cuda-criu as uid 65534: the driver's checkpoint and restore of root's workload, and a round trip (CRIU
# needs root), each fail in one line that names root; the workload is again untouched.
as_nobody test -x "$CUDA_CRIU" || skip "$CUDA_CRIU is not executable by uid $NOBODY"
for cmd in "checkpoint $pid" "restore $pid" "roundtrip --ready-delay 1 -- true"; do
	# shellcheck disable=SC2086 # the words of cmd
	expect_privilege_refusal "cuda-criu $cmd as uid $NOBODY" as_nobody timeout -s KILL 30 "$CUDA_CRIU" $cmd
done
for p in "$pid" "$child"; do
	s=$(cuda_state "$p")
	[ "$s" = running ] || fail "pid $p left $s by cuda-criu as uid $NOBODY"
done
expect_healthy "$STATE"

# Half-privileged: uid 65534 with CAP_CHECKPOINT_RESTORE and `criu --unprivileged`. CRIU gets further and
# loads the plugin, whose PAUSE_DEVICES cannot read the root-owned workload's /proc files and leaves it
# alone; CRIU's own seize then fails (EPERM). The workload must again be untouched.
if setpriv --reuid="$NOBODY" --regid="$NOBODY" --clear-groups --inh-caps=+checkpoint_restore \
	--ambient-caps=+checkpoint_restore true 2>/dev/null; then
	img=$T/img-cr
	mkdir -p "$img"
	chown "$NOBODY:$NOBODY" "$img"
	t0=$SECONDS
	rc=0
	setpriv --reuid="$NOBODY" --regid="$NOBODY" --clear-groups --inh-caps=+checkpoint_restore \
		--ambient-caps=+checkpoint_restore timeout -s KILL 60 "$CRIU" dump --unprivileged -t "$pid" -D "$img" \
		-L "$PLUGIN_DIR" -v4 -o dump.log </dev/null >"$T/criu.out" 2>&1 || rc=$?
	spent=$((SECONDS - t0))
	cp "$img/dump.log" "$T/dump.log" 2>/dev/null || true
	[ "$rc" -ne 0 ] || fail "criu dump --unprivileged with CAP_CHECKPOINT_RESTORE succeeded on root's process"
	[ "$rc" -ne 137 ] || fail "criu dump --unprivileged hung"
	reason=$(grep -hE 'Operation not permitted|Permission denied' "$T/dump.log" | head -n1 || true)
	[ -n "$reason" ] || fail "--unprivileged: no permission error in the log"
	[ -z "$(plugin_errors "$T/dump.log")" ] || fail "--unprivileged: the plugin failed instead of CRIU"
	for p in "$pid" "$child"; do
		s=$(cuda_state "$p")
		[ "$s" = running ] || fail "pid $p left $s by an unprivileged dump"
	done
	expect_healthy "$STATE"
	log "CAP_CHECKPOINT_RESTORE only: dump failed in ${spent}s (exit $rc): ${reason#*: }; workload untouched"
fi

# An unprivileged restore of a real image (made by root) fails the same way, and starts nothing.
dump "$pid" "$T/img-root" || fail "root dump failed"
wait_gone "$pid" "$child"
chmod -R a+rX "$T/img-root"
chmod a+w "$T/img-root"
t0=$SECONDS
rc=0
as_nobody timeout -s KILL 60 "$CRIU" restore -D "$T/img-root" -d -L "$PLUGIN_DIR" -v4 -o restore-nobody.log \
	</dev/null >"$T/criu.out" 2>&1 || rc=$?
spent=$((SECONDS - t0))
[ "$rc" -ne 0 ] || fail "criu restore as uid $NOBODY succeeded"
[ "$rc" -ne 137 ] || fail "criu restore as uid $NOBODY hung"
reason=$(grep -hE 'Error|denied|not permitted|root|capabilit' "$T/criu.out" "$T/img-root/restore-nobody.log" 2>/dev/null | head -n3 || true)
[ -n "$reason" ] || fail "no clear error from an unprivileged restore: $(cat "$T/criu.out")"
for p in "$pid" "$child"; do gone "$p" || fail "pid $p runs after a failed unprivileged restore"; done
log "unprivileged restore failed in ${spent}s (exit $rc): $(echo "$reason" | head -n1)"
# The image is still good for root.
restore "$T/img-root" || fail "root restore after the unprivileged attempt failed"
expect_healthy "$STATE"
expect_healthy "$STATE.0"
log PASS
