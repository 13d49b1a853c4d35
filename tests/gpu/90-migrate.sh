# Real-GPU tests of moving work and of sizes that do not fit (sourced by run-gpu-tests.sh: test_migrate is
# the test migrate, test_memory_refusal memory-refusal).

# migrate_target NAME: a mount and pid namespace standing for a second host (its init sleeps; its image
# directory a tmpfs only it sees); sets target (the init's pid) and target_dir.
migrate_target() {
	target_dir=$work/migrate/target-$1
	mkdir -p "$target_dir"
	setsid unshare --mount --pid --fork --mount-proc --propagation private --kill-child \
		sh -c "mount -t tmpfs -o size=80% tmpfs '$target_dir' && exec sleep 100000" </dev/null >/dev/null 2>&1 &
	local outer=$! i
	started+=("$outer")
	for i in $(seq 100); do
		target=$(pgrep -P "$outer" -x sleep) && return 0
		sleep 0.1
	done
	why="the target namespace did not start"
	return 1
}

# `cuda-criu migrate` of a 2-process tree (MIGRATE_MB each, default 2048) into a namespace "host": through
# CRIU's page server, then dump + copy; the downtime of each; the data verified on the target.
test_migrate() {
	local name=migrate dir=$work/migrate via pid pids out down=() line
	command -v unshare >/dev/null && command -v nsenter >/dev/null || { skipped $name "needs unshare and nsenter"; return; }
	for via in page-server copy; do
		migrate_target "$via" || { failed $name "$why"; return; }
		start_in "$dir/$via" "$bundle/bin/cuda_memcheck" --mb "${MIGRATE_MB:-2048}" --children 1 --state "$dir/$via/state" --interval-ms 100
		wait_state "$dir/$via/state" 120 1 && wait_state "$dir/$via/state.0" 60 1 || { failed $name "before the move: $why"; show_workload "$dir/$via"; return; }
		pid=$(state_value "$dir/$via/state" pid)
		mapfile -t pids < <(tree_pids "$pid")
		started+=("${pids[@]}")
		out=$dir/$via.out
		cli migrate --via "$via" --target "nsenter -t $target -m -p" --to "$target_dir/img" --criu "$bundle/sbin/criu" \
			--criu-env "LD_LIBRARY_PATH=$bundle/lib" --libdir "$bundle/plugin" --port $((20000 + RANDOM % 20000)) \
			"$pid" >"$out" 2>&1 || { failed $name "--via $via: $(tail -n 5 "$out")"; kill_pids "${pids[@]}"; return; }
		gone_within 30 "${pids[@]}" || { failed $name "--via $via: the tree still runs here"; return; }
		local base0 base1
		base0=$(state_value "$dir/$via/state" iterations) base1=$(state_value "$dir/$via/state.0" iterations)
		advance 120 "$dir/$via/state" "$base0" && advance 60 "$dir/$via/state.0" "$base1" ||
			{ failed $name "--via $via: on the target: $why"; return; }
		[ -z "$(ls -A "$target_dir")" ] || { failed $name "--via $via: the target's image is visible here"; return; }
		line=$(grep -o 'downtime .*' "$out")
		down+=("$via: $line")
		nsenter -t "$target" -m -p sh -c "grep -o 'cuda_plugin: restore:.*' '$target_dir/img/restore.log' | tail -n1" | sed 's/^/  /'
		kill -9 "$target" 2>/dev/null
	done
	passed $name "a tree of 2 x ${MIGRATE_MB:-2048} MiB moved into another mount and pid namespace, data verified there"
	printf '  %s\n' "${down[@]}"
}

# A GPU state larger than the host's available memory: the dump is refused in words before any lock, and
# the process runs on, its data verified.
test_memory_refusal() {
	local name=memory-refusal dir=$work/memory-refusal pid avail_mb zero_mb line
	avail_mb=$(awk '/^MemAvailable:/ { printf "%d", $2 / 1024 }' /proc/meminfo)
	zero_mb=$((avail_mb + 4096))
	local free_mb
	free_mb=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i 0 2>/dev/null | head -n1)
	[ "${free_mb:-0}" -gt $((zero_mb + 2048)) ] ||
		{ skipped $name "GPU 0 has ${free_mb:-?} MiB free, the host ${avail_mb} MiB available: nothing larger fits on the GPU"; return; }
	start_in "$dir" "$bundle/bin/cuda_memcheck" --mb 512 --zero-mb "$zero_mb" --state "$dir/state" --interval-ms 100
	wait_state "$dir/state" 300 1 || { failed $name "before the dump: $why"; show_workload "$dir"; return; }
	pid=$(state_value "$dir/state" pid)
	started+=("$pid")
	dump_refused_for_memory "$dir" "$pid" 120 ||
		{ failed $name "$((zero_mb + 512)) MiB of GPU state, $avail_mb MiB available: $why"; kill_pids "$pid"; return; }
	passed $name "$((zero_mb + 512)) MiB on the GPU, $avail_mb MiB available: refused in ${dump_s} s, the process runs on verified"
	echo "  ${line#*): }"
	kill_pids "$pid"
}
