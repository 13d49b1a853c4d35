#!/usr/bin/env bash
# cuda-criu migrate moves a tree of two CUDA processes (fake GPU) to "another host": a mount and pid
# namespace of its own, reached through `nsenter`, whose image directory is on a tmpfs only it sees.
# First through CRIU's page server (the pages stream there during the dump), then with --via copy
# (dump here, copy, restore: the GPU image's own files travel too); both downtimes are printed.
source "$(dirname "$0")/lib.sh"
e2e_setup
command -v unshare >/dev/null && command -v nsenter >/dev/null || skip "needs unshare and nsenter (util-linux)"
start_fake_gpu

# new_target NAME: a namespace "host" (its init sleeps; unshare --kill-child ends it with the test); sets
# $target (the init's pid here) and $target_dir (a tmpfs mounted there only).
new_target() {
	target_dir=$T/$1
	mkdir -p "$target_dir"
	setsid unshare --mount --pid --fork --mount-proc --propagation private --kill-child \
		sh -c "mount -t tmpfs tmpfs '$target_dir' && exec sleep 100000" </dev/null >"$T/$1.out" 2>&1 &
	PIDS+=($!)
	local outer=$!
	wait_for "the target namespace $1" 10 sh -c "pgrep -P $outer -x sleep >/dev/null"
	target=$(pgrep -P "$outer" -x sleep)
}
on_target() { nsenter -t "$target" -m -p "$@"; }

# migrate_tree NAME [migrate options...]: a fresh tree moved to a fresh target; checks that it runs there
# and that nothing of the image is visible here; sets $downtime.
migrate_tree() {
	local name=$1 pid kids
	shift
	new_target "target-$name"
	start_memcheck "$name" 48 --children 1
	pid=$LAST_PID
	wait_for "$name: the child" 10 test -f "$STATE.0"
	kids=$(ps -o pid= --ppid "$pid" | xargs)
	cuda_criu migrate --target "nsenter -t $target -m -p" --to "$target_dir/img" --criu "$CRIU" \
		--libdir "$PLUGIN_DIR" --port $((20000 + RANDOM % 20000)) "$@" "$pid" >"$T/$name.migrate" 2>&1 ||
		fail "$name: cuda-criu migrate failed: $(cat "$T/$name.migrate")"
	cat "$T/$name.migrate"
	wait_gone "$pid" $kids # here: gone
	[ -z "$(ls -A "$target_dir")" ] || fail "$name: the target's image is visible here: $(ls "$target_dir")"
	on_target cat "$target_dir/img/restore.log" >"$T/$name-restore.log"
	expect_summary "$T/$name-restore.log" restore 2 "$name: no restore summary of the tree on the target"
	[ -z "$(plugin_errors "$T/$name-restore.log")" ] || fail "$name: plugin errors in the target's restore log"
	# The tree runs on there: two processes of the target's pid namespace verify their data on and on.
	[ "$(on_target pgrep -x cuda_memcheck | wc -l)" = 2 ] || fail "$name: the tree does not run on the target"
	expect_healthy "$STATE"
	expect_healthy "$STATE.0"
	downtime=$(sed -n 's/.*downtime \([0-9.]*\) s.*/\1/p' "$T/$name.migrate")
	[ -n "$downtime" ] || fail "$name: no downtime reported"
	on_target pkill -9 -x cuda_memcheck || true
}

migrate_tree paged
on_target ls "$target_dir/img" >"$T/paged.files"
grep -q '^pages-.*\.img$' "$T/paged.files" || fail "the page server wrote no pages on the target: $(xargs <"$T/paged.files")"
grep -q '^cuda-gpu-[0-9]*\.img$' "$T/paged.files" || fail "the GPU image's files did not reach the target: $(xargs <"$T/paged.files")"
expect_log "$T/paged-restore.log" "restore: 2 CUDA process" "page-server image: no restore summary"
paged=$downtime
log "page server: moved, downtime $paged s"

migrate_tree copied --via copy
on_target ls "$target_dir/img" >"$T/copied.files"
grep -q '^cuda-gpu-[0-9]*\.img$' "$T/copied.files" || fail "the GPU image's files did not reach the target: $(xargs <"$T/copied.files")"
log "dump + copy: moved, downtime $downtime s (page server: $paged s)"

# A dump that fails leaves the tree running here, and says so.
new_target refused
start_memcheck refused 16
pid=$LAST_PID
if cuda_criu migrate --target "nsenter -t $target -m -p" --to "$target_dir/img" --criu "$CRIU" --libdir "$PLUGIN_DIR" \
	--criu-arg --no-such-criu-option "$pid" >"$T/refused.migrate" 2>&1; then
	fail "migrate with a bad CRIU option succeeded"
fi
grep -q "was not moved and runs on here" "$T/refused.migrate" || fail "no word on the tree's state: $(cat "$T/refused.migrate")"
alive "$pid" || fail "the tree died after a failed migration"
expect_healthy "$STATE"
log PASS
