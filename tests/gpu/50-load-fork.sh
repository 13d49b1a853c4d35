# Real-GPU tests of many processes (sourced by run-gpu-tests.sh: each test_NAME function is the test NAME,
# with - for _): 16 processes dumped and restored 20 times; PyTorch training with forked workers.

# Load: a tree of LOAD_PROCS cuda_memcheck processes (default 16, LOAD_MB each) dumped and restored
# LOAD_ROUNDS times in a row (default 20): every round restores all of them verifying their data, no
# process gains fds or threads, the GPU memory they hold stays the same, and no criu is left behind.
test_load() {
	local name=load dir=$work/load procs=${LOAD_PROCS:-16} rounds=${LOAD_ROUNDS:-20} mb=${LOAD_MB:-64}
	local files=("$dir/state") pids=() k f p round args gpu0 gpu dumps=() restores=()
	declare -A base
	for ((k = 0; k < procs - 1; k++)); do files+=("$dir/state.$k"); done
	start_in "$dir" "$bundle/bin/cuda_memcheck" --mb "$mb" --children $((procs - 1)) --state "$dir/state" --interval-ms 100
	for f in "${files[@]}"; do wait_state "$f" 180 1 || { failed $name "before the first dump: $why"; return; }; done
	for f in "${files[@]}"; do pids+=("$(state_value "$f" pid)"); done
	started+=("${pids[@]}")
	counts() { echo "$(ls "/proc/$1/fd" | wc -l) fds, $(ls "/proc/$1/task" | wc -l) threads"; }
	gpu0=$(gpu_gib "${pids[@]}")
	echo "  $name: $procs processes x $mb MiB, $gpu0 GiB on the GPU; root $(counts "${pids[0]}") before the first dump"
	for ((round = 1; round <= rounds; round++)); do
		criu_dump "$dir" "${pids[0]}" || { failed $name "round $round: $why"; show_log "$dir/dump.log"; kill_pids "${pids[@]}"; return; }
		dumps+=("$dump_s")
		gone_within 60 "${pids[@]}" || { failed $name "round $round: pids still there after the dump"; kill_pids "${pids[@]}"; return; }
		args=()
		for f in "${files[@]}"; do args+=("$f" "$(state_value "$f" iterations)"); done
		criu_restore "$dir" || { failed $name "round $round: $why"; show_log "$dir/restore.log"; kill_tree "${pids[0]}"; return; }
		restores+=("$restore_s")
		advance 60 "${args[@]}" || { failed $name "round $round, after the restore: $why"; kill_tree "${pids[0]}"; return; }
		# Baselines from the first restore on: what a round must not change.
		if [ "$round" = 1 ]; then
			for p in "${pids[@]}"; do base[$p]=$(counts "$p"); done
			gpu0=$(gpu_gib "${pids[@]}")
			echo "  $name: after the first restore: root ${base[${pids[0]}]}, $gpu0 GiB on the GPU"
		fi
		for p in "${pids[@]}"; do
			[ "$(counts "$p")" = "${base[$p]}" ] ||
				{ failed $name "round $round: pid $p has $(counts "$p"), had ${base[$p]}"; kill_pids "${pids[@]}"; return; }
		done
		gpu=$(gpu_gib "${pids[@]}")
		[ "$gpu" = "$gpu0" ] || { failed $name "round $round: $gpu GiB on the GPU, $gpu0 after round 1"; kill_pids "${pids[@]}"; return; }
		pgrep -x criu >/dev/null && { failed $name "round $round: a criu process is left: $(pgrep -a -x criu)"; kill_pids "${pids[@]}"; return; }
		rm -rf "$dir/img"
	done
	med() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
	passed $name "$procs processes, $rounds rounds: dump median $(med "${dumps[@]}") s, restore median $(med "${restores[@]}") s; fds, threads and $gpu0 GiB of GPU memory unchanged"
	kill_pids "${pids[@]}"
}

# torch-dataloader / torch-forkpool: a deterministic training loop (torch_fork_train.py) whose data processes
# were forked after CUDA started (DataLoader workers, fork start method; a multiprocessing fork pool). They
# inherit the driver's device files and mappings, which the plugin restores as placeholders. The losses
# logged by a run dumped and restored mid-training must equal, bit for bit, those of an uninterrupted run.
fork_steps=${FORK_STEPS:-400}
torch_fork_test() { # NAME MODE
	local name=$1 mode=$2 dir=$work/$1 root pids n st line
	if ! "$python" -c 'import numpy, torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
		skipped $name "$python has no PyTorch with CUDA (or no numpy)"
		return
	fi
	mkdir -p "$dir"
	local train=("$python" -u "$bundle/torch_fork_train.py" --mode "$mode" --steps "$fork_steps")
	if ! (cd "$dir" && timeout 600 "${train[@]}" --log "$dir/reference.log" >"$dir/reference.out" 2>&1); then
		failed $name "the uninterrupted run failed: $(tail -n 3 "$dir/reference.out" | tr '\n' ' ')"
		return
	fi
	[ "$(wc -l <"$dir/reference.log")" = "$fork_steps" ] || { failed $name "the uninterrupted run logged $(wc -l <"$dir/reference.log") of $fork_steps steps"; return; }

	# The same run, slowed down so that the dump lands mid-training.
	start_in "$dir" "${train[@]}" --log "$dir/run.log" --state "$dir/state" --step-delay-ms 25
	wait_state "$dir/state" 240 $((fork_steps / 4)) || { failed $name "before the dump: $why"; show_workload "$dir"; return; }
	root=$(state_value "$dir/state" pid)
	mapfile -t pids < <(tree_pids "$root")
	started+=("${pids[@]}")
	[ ${#pids[@]} -ge 3 ] || { failed $name "expected the trainer and 2 forked workers, found pids ${pids[*]}"; kill_pids "${pids[@]}"; return; }
	if ! criu_dump "$dir" "$root"; then
		failed $name "$why; the tree $(alive "${pids[@]}" && echo still runs || echo is gone)"
		show_log "$dir/dump.log"; kill_pids "${pids[@]}"
		return
	fi
	n=$(state_value "$dir/state" iterations)
	gone_within 30 "${pids[@]}" || { failed $name "pids ${pids[*]} still exist 30 s after the dump"; kill_pids "${pids[@]}"; return; }
	if ! criu_restore "$dir"; then
		failed $name "$why (dump $dump_s s, image $(gib "$img_bytes") GiB)"
		show_log "$dir/restore.log"; kill_tree "$root"
		return
	fi
	alive "${pids[@]}" || { failed $name "restored, but not all of ${pids[*]} are alive"; show_log "$dir/restore.log"; kill_tree "$root"; return; }
	local deadline=$(($(date +%s) + 300))
	while st=$(state_value "$dir/state" status); [ "$st" = ok ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.5; done
	if [ "$st" != done ]; then
		failed $name "after restore the run did not finish: status=$st at step $(state_value "$dir/state" iterations)"
		show_log "$dir/restore.log"; show_workload "$dir"; kill_tree "$root"
		return
	fi
	if ! cmp -s "$dir/reference.log" "$dir/run.log"; then
		line=$(cmp "$dir/reference.log" "$dir/run.log" 2>&1 | head -n1)
		failed $name "losses differ from the uninterrupted run's ($line; dumped at step $n)"
		diff "$dir/reference.log" "$dir/run.log" | head -n 6 | sed 's/^/  | /'
		return
	fi
	passed $name "dumped at step $n of $fork_steps with ${#pids[@]} processes, dump $dump_s s, restore $restore_s s; $fork_steps losses equal bit for bit to an uninterrupted run"
	line=$(grep -c 'inherited from the NVIDIA driver' "$dir/dump.log"); echo "  device files and mappings of forked processes claimed: $line"
	rm -rf "$dir/img"
}

test_torch_dataloader() { torch_fork_test torch-dataloader dataloader; }
test_torch_forkpool() { torch_fork_test torch-forkpool forkpool; }
