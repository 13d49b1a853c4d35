# Real-GPU tests of processes that share GPU memory (CUDA IPC) and of one NCCL rank (sourced by
# run-gpu-tests.sh: each test_NAME function is the test NAME, with - for _).
#
# Driver r580 checkpoints a process that imported CUDA IPC memory but refuses its restore
# (CUDA_ERROR_INVALID_VALUE), in place or from an image, and leaves it checkpointed for good. Where the
# sharing shows in /dev/shm (an IPC event: the driver's /dev/shm/cuda.shm.0.<exporter pid>.1, which torch
# shares with every CUDA tensor it passes), the plugin refuses it before the lock (docs/faults.md, "CUDA
# IPC").

torch_ok() { "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

# ipc_refused NAME MODE: a parent and a child sharing a CUDA tensor (MODE ipc) or an IPC event (event)
# through torch.multiprocessing (spawn): criu dump, with and without --leave-running, is refused before
# the lock naming the child and the file, cuda-criu check and suspend say the same, and both run on.
ipc_refused() {
	local name=$1 mode=$2 dir=$work/$1 parent child pids base opts file
	torch_ok || { skipped "$name" "$python has no PyTorch with CUDA"; return; }
	start_in "$dir" "$python" -u "$bundle/torch_ipc_workload.py" "$mode" --state "$dir/state"
	for f in "$dir/state" "$dir/state.0"; do
		wait_state "$f" 240 1 || { failed "$name" "before the dump: $why"; show_workload "$dir"; return; }
	done
	parent=$(state_value "$dir/state" pid) child=$(state_value "$dir/state.0" pid)
	mapfile -t pids < <(tree_pids "$parent")
	started+=("${pids[@]}")
	file=$(grep -o '/dev/shm/cuda.shm[^ ]*' "/proc/$child/maps" | head -n1)
	echo "  $name: parent $parent maps $(grep -o '/dev/shm/cuda.shm[^ ]*' "/proc/$parent/maps" | head -n1 || echo nothing), child $child maps ${file:-nothing}"
	for opts in "" "-R"; do
		base=$(state_value "$dir/state" iterations)
		if criu_dump "$dir" "$parent" $opts; then
			failed "$name" "criu dump $opts of a tree sharing CUDA memory through IPC succeeded"
			kill_pids "${pids[@]}"; return
		fi
		grep -qE "pid $child maps .*the legacy CUDA IPC file of pid $parent|pid $parent exported GPU memory or an event through legacy CUDA IPC .* pid $child map" "$dir/dump.log" ||
			{ failed "$name" "criu dump $opts failed ($why) without naming the pair"; show_log "$dir/dump.log"; kill_pids "${pids[@]}"; return; }
		advance 30 "$dir/state" "$base" "$dir/state.0" "$(state_value "$dir/state.0" iterations)" ||
			{ failed "$name" "after the refused dump $opts: $why"; kill_pids "${pids[@]}"; return; }
	done
	cli check --runtimes none "$child" >"$dir/check.out" 2>&1
	grep -q "pid-$child .*cannot be checkpointed" "$dir/check.out" ||
		{ failed "$name" "cuda-criu check $child: $(grep pid- "$dir/check.out")"; kill_pids "${pids[@]}"; return; }
	if cli suspend "$child" >"$dir/suspend.out" 2>&1; then
		failed "$name" "cuda-criu suspend of the importer succeeded"; kill_pids "${pids[@]}"; return
	fi
	advance 30 "$dir/state.0" "$(state_value "$dir/state.0" iterations)" ||
		{ failed "$name" "after the refused suspend: $why"; kill_pids "${pids[@]}"; return; }
	passed "$name" "criu dump and dump -R refused before the lock, cuda-criu check and suspend too; both run on"
	grep -oE "(pid $child maps|pid $parent exported)[^:]*" "$dir/dump.log" | head -n1 | sed 's/^/  /'
	kill_pids "${pids[@]}"
}
test_ipc_refused() { ipc_refused ipc-refused ipc; }
test_ipc_events_refused() { ipc_refused ipc-events-refused event; }

# An exporter whose importer is gone (its child checked the tensor and exited): dumped and restored with
# its data; then it shares a new tensor with a new child, and the test reports what that gets.
test_ipc_exporter_alone() {
	local name=ipc-exporter-alone dir=$work/ipc-exporter-alone root again
	torch_ok || { skipped $name "$python has no PyTorch with CUDA"; return; }
	start_in "$dir" "$python" -u "$bundle/torch_ipc_workload.py" exporter --state "$dir/state"
	KEEP_RUNNING=1 dump_restore_test $name "$dir" 240 "$dir/state"
	root=$(state_value "$dir/state" pid)
	alive "$root" || return
	kill -USR1 "$root"
	for _ in $(seq 1 120); do
		again=$(state_value "$dir/state" reexport)
		[ -n "$again" ] && break
		sleep 0.5
	done
	echo "  $name: a new export after the restore: ${again:-no answer within 60 s}"
	grep -o "exported GPU memory or an event through legacy CUDA IPC ([^)]*)" "$dir/dump.log" | head -n1 | sed 's/^/  dump: /'
	kill_tree "$root"
}

# One NCCL rank (torch.distributed, world size 1): dumped and restored, its all_reduce bit-exact after.
test_nccl_one_rank() {
	local dir=$work/nccl-one-rank
	torch_ok || { skipped nccl-one-rank "$python has no PyTorch with CUDA"; return; }
	start_in "$dir" "$python" -u "$bundle/torch_ipc_workload.py" nccl --state "$dir/state"
	DUMP_OPTS="--tcp-established --network-lock nftables" RESTORE_OPTS="--tcp-established --network-lock nftables" \
		dump_restore_test nccl-one-rank "$dir" 240 "$dir/state"
}
