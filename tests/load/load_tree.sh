#!/usr/bin/env bash
# Load: a tree of 16 CUDA processes (fake GPU) dumped and restored LOAD_ROUNDS times in a row (default
# 20). Every round must succeed with all 16 restored and verifying their data; across rounds no workload
# may gain fds or threads, the fake GPU daemon's memory must stay within a bound, and no criu may be left.
#   LOAD_ROUNDS=20 LOAD_PROCS=16 LOAD_MB=8 DAEMON_GROWTH_KB=65536
source "$(dirname "$0")/../e2e/lib.sh"
TEST_NAME=load_tree
e2e_setup
ROUNDS=${LOAD_ROUNDS:-20}
PROCS=${LOAD_PROCS:-16}
MB=${LOAD_MB:-8}
DAEMON_GROWTH_KB=${DAEMON_GROWTH_KB:-65536}
start_fake_gpu

start_memcheck load "$MB" --children $((PROCS - 1))
root=$LAST_PID
states=("$STATE")
for ((i = 0; i < PROCS - 1; i++)); do states+=("$STATE.$i"); done
for s in "${states[@]}"; do wait_for "$s" 30 test -f "$s"; done
pids=()
for s in "${states[@]}"; do pids+=("$(state_value "$s" pid)"); done

# PID: "fds threads". The state file the workload rewrites every iteration is left out: it is open only
# for a moment, whenever the sample happens to catch it.
counts() {
	echo "$(find "/proc/$1/fd" -mindepth 1 -printf '%l\n' 2>/dev/null | grep -vc '\.state[.0-9]*\.tmp\.') $(ls "/proc/$1/task" | wc -l)"
}
# Every workload runs on after the restore: its counter passes its value now by 3 verified iterations
# (all checked together: one by one costs seconds per round).
all_healthy() {
	local s i start=() deadline=$((SECONDS + 30)) behind
	for s in "${states[@]}"; do start+=("$(state_value "$s" iterations)"); done
	while :; do
		behind=""
		for i in "${!states[@]}"; do
			s=${states[$i]}
			[ "$(state_value "$s" status)" = ok ] || fail "round $round: $s: $(cat "$s")"
			[ "$(state_value "$s" iterations)" -gt $((start[i] + 2)) ] || behind=$s
		done
		[ -n "$behind" ] || return 0
		[ $SECONDS -lt $deadline ] || fail "round $round: $behind stopped counting after the restore"
		sleep 0.05
	done
}
rss_kb() { sed -n 's/^VmRSS:\s*\([0-9]*\).*/\1/p' "/proc/$1/status"; }
declare -A base
for p in "${pids[@]}"; do base[$p]=$(counts "$p"); done
daemon_fds0=$(ls "/proc/$DAEMON_PID/fd" | wc -l)
log "$PROCS CUDA processes x $MB MiB, $ROUNDS rounds; fds/threads of the root: ${base[$root]}, daemon RSS $(rss_kb "$DAEMON_PID") kB"

t_start=$SECONDS
daemon_rss1=""
for ((round = 1; round <= ROUNDS; round++)); do
	img=$T/img
	rm -rf "$img"
	t0=$(date +%s%N)
	dump "$root" "$img" || fail "round $round: dump failed"
	t1=$(date +%s%N)
	wait_gone "${pids[@]}"
	expect_log "$T/dump.log" "checkpointing $PROCS CUDA process\(es\) in parallel" "round $round: not one batch of $PROCS"
	[ -z "$(plugin_errors "$T/dump.log")" ] || fail "round $round: errors in the dump log"
	restore "$img" || fail "round $round: restore failed"
	t2=$(date +%s%N)
	expect_summary "$T/restore.log" restore $PROCS "round $round: not all $PROCS restored"
	[ -z "$(plugin_errors "$T/restore.log")" ] || fail "round $round: errors in the restore log"
	all_healthy
	for p in "${pids[@]}"; do
		now=$(counts "$p")
		[ "$now" = "${base[$p]}" ] || fail "round $round: pid $p has fds/threads '$now', before the first dump '${base[$p]}':
$(find "/proc/$p/fd" -mindepth 1 -printf '%f -> %l\n')"
	done
	! pgrep -f "criu .*-D $img" >/dev/null || fail "round $round: a criu process is left: $(pgrep -af "criu .*-D $img")"
	rss=$(rss_kb "$DAEMON_PID")
	[ -n "$daemon_rss1" ] || daemon_rss1=$rss
	log "round $round: dump $(((t1 - t0) / 1000000)) ms, restore $(((t2 - t1) / 1000000)) ms, daemon RSS $rss kB"
done

# The first round settles the daemon's allocator; later rounds must not keep growing it.
rss=$(rss_kb "$DAEMON_PID")
[ $((rss - daemon_rss1)) -le "$DAEMON_GROWTH_KB" ] ||
	fail "the fake GPU daemon grew from $daemon_rss1 kB after round 1 to $rss kB after round $ROUNDS"
daemon_fds=$(ls "/proc/$DAEMON_PID/fd" | wc -l)
[ "$daemon_fds" -le "$daemon_fds0" ] || fail "the fake GPU daemon holds $daemon_fds fds, $daemon_fds0 before the first dump"
kill -9 -- "-$root" 2>/dev/null || true
wait_gone "${pids[@]}"
log "PASS: $ROUNDS rounds of $PROCS processes in $((SECONDS - t_start)) s; daemon RSS $daemon_rss1 -> $rss kB, fds $daemon_fds0 -> $daemon_fds"
