# Real-GPU tests of processes that share GPU memory (CUDA IPC) and of one NCCL rank (sourced by
# run-gpu-tests.sh: each test_NAME function is the test NAME, with - for _).
#
# Driver r580 checkpoints a process that imported CUDA IPC memory but refuses its restore
# (CUDA_ERROR_INVALID_VALUE), in place or from an image, and leaves it checkpointed for good; nothing the
# plugin can read before the lock tells such a process apart (docs/faults.md, "CUDA IPC").

torch_ok() { "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

# --leave-running of a parent and a child sharing a CUDA tensor (torch.multiprocessing, spawn): the
# child's return fails, so CRIU must exit non-zero, naming it and the state it is left in; the parent,
# returned, runs on with its data.
test_ipc_leave_running() {
	local name=ipc-leave-running dir=$work/ipc-leave-running parent child pids base rc
	torch_ok || { skipped $name "$python has no PyTorch with CUDA"; return; }
	start_in "$dir" "$python" -u "$bundle/torch_ipc_workload.py" ipc --state "$dir/state"
	for f in "$dir/state" "$dir/state.0"; do
		wait_state "$f" 240 1 || { failed $name "before the dump: $why"; show_workload "$dir"; return; }
	done
	parent=$(state_value "$dir/state" pid) child=$(state_value "$dir/state.0" pid)
	mapfile -t pids < <(tree_pids "$parent")
	started+=("${pids[@]}")
	criu_dump "$dir" "$parent" -R --link-remap
	rc=$?
	base=$(state_value "$dir/state" iterations)
	if [ "$rc" = 0 ]; then
		failed $name "criu dump -R exited 0 with the IPC importer (pid $child) not returned"
		show_log "$dir/dump.log"; kill_pids "${pids[@]}"; return
	fi
	grep -qE "could not return pid $child to its CUDA state 'running'" "$dir/dump.log" ||
		{ failed $name "criu dump -R failed ($why) without naming the importer pid $child"; show_log "$dir/dump.log"; kill_pids "${pids[@]}"; return; }
	grep -q "A plugin could not return the dumped tasks" "$dir/dump.log" ||
		{ failed $name "CRIU did not report the dump failed"; show_log "$dir/dump.log"; kill_pids "${pids[@]}"; return; }
	advance 30 "$dir/state" "$base" ||
		{ failed $name "the exporter (pid $parent) did not run on: $why"; kill_pids "${pids[@]}"; return; }
	passed $name "criu dump -R failed as it must: $(grep -oE "could not return pid $child[^;]*" "$dir/dump.log" | head -n1 | cut -c1-160); the exporter runs on"
	grep -oE "cuCheckpointProcessRestore failed[^;]*" "$dir/dump.log" | head -n1 | sed 's/^/  /'
	kill_pids "${pids[@]}"
}

# One NCCL rank (torch.distributed, world size 1): dumped and restored, its all_reduce bit-exact after.
test_nccl_one_rank() {
	local dir=$work/nccl-one-rank
	torch_ok || { skipped nccl-one-rank "$python has no PyTorch with CUDA"; return; }
	start_in "$dir" "$python" -u "$bundle/torch_ipc_workload.py" nccl --state "$dir/state"
	DUMP_OPTS="--tcp-established --network-lock nftables" RESTORE_OPTS="--tcp-established --network-lock nftables" \
		dump_restore_test nccl-one-rank "$dir" 240 "$dir/state"
}
