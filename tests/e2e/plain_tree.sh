#!/usr/bin/env bash
# A plain (non-CUDA) process tree dumped and restored with the plugin loaded continues from its saved
# state; the plugin stays out of the way (no error, no inventory entry), with and without a driver.
source "$(dirname "$0")/lib.sh"
e2e_setup

run_round() { # VARIANT
	local variant=$1 img=$T/img-$1
	start tree "$COUNTER_TREE" --state "$T/count-$variant" --children 2
	local root=$LAST_PID
	wait_for "the tree's state files" 10 test -f "$T/count-$variant.2"
	local pids; pids=$(cat "$T/count-$variant".[0-2] | sed -n 's/^pid=//p' | xargs)
	sleep 0.2
	dump "$root" "$img" || fail "$variant: criu dump failed"
	local before=(); local i
	for i in 0 1 2; do before[$i]=$(state_value "$T/count-$variant.$i" count); done
	wait_gone $pids
	[ -z "$(plugin_errors "$T/dump.log")" ] || fail "$variant: the plugin logged errors on a plain tree"
	grep -q "cuda_plugin: " "$T/dump.log" || fail "$variant: the plugin did not load"
	[ ! -e "$img/cuda-plugin.img" ] || fail "$variant: plugin image written for a tree without CUDA"

	# No inventory entry: the image restores without any plugin (CRIU refuses a missing required one).
	mkdir -p "$T/no-plugins"
	PLUGIN_DIR=$T/no-plugins restore "$img" || fail "$variant: restore without plugins failed"
	for i in 0 1 2; do
		local file=$T/count-$variant.$i pid
		pid=$(state_value "$file" pid)
		alive "$pid" || fail "$variant: process $i (pid $pid) not running after restore"
		local want=$((${before[$i]} + 5))
		wait_for "process $i to count on" 10 sh -c "[ \$(sed -n 's/^count=//p' $file) -ge $want ]"
		# Continued, not restarted: a restarted process would count from 1 again.
		local now; now=$(state_value "$file" count)
		[ "$now" -ge "${before[$i]}" ] || fail "$variant: process $i restarted ($now < ${before[$i]})"
	done
	kill -9 $pids
	wait_gone $pids
	log "$variant: dumped and restored 3 processes; counts continued from ${before[*]}"
}

# 1. No NVIDIA driver (CI's machine): the plugin logs one line and does nothing else.
unset CUDA_CRIU_LIBCUDA
run_round nodriver
grep -q "no NVIDIA driver on this machine; CUDA plugin inactive" "$T/dump.log" ||
	[ -d /proc/driver/nvidia/gpus ] || fail "expected the 'inactive' line"

# 2. A driver present (the fake one), but no process uses CUDA: every pid is left to CRIU.
if [ -x "$FAKE_DAEMON" ]; then
	start_fake_gpu
	run_round withdriver
	grep -q "ready to dump CUDA processes" "$T/dump.log" || fail "plugin not active with a driver present"
fi
log "PASS"
