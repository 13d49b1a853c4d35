# Real-GPU tests of other frameworks through cuda-criu roundtrip (sourced by run-gpu-tests.sh: each
# test_NAME function is the test NAME): JAX, CuPy, transformers; PyTorch with other allocators, a CUDA
# graph and registered host memory.

# cuda-criu roundtrip against a JAX, CuPy or transformers program (tests/gpu/framework_workload.py): two
# cycles, the result compared bit for bit by the program after each restore. Skipped where python lacks it.
# JAX runs on GPU 0 only (CUDA_VISIBLE_DEVICES=0; CRIU sees every GPU): a JAX process spanning two GPUs is
# checkpointed, but the r580 driver refuses its restore (CUDA_ERROR_INVALID_VALUE), even in place.
framework_roundtrip() {
	local name=$1 module=$1 dir=$work/$1 rc only=()
	[ "$module" = jax ] && [ "${GPU_TESTS_JAX_GPUS:-0}" != all ] && only=(CUDA_VISIBLE_DEVICES="${GPU_TESTS_JAX_GPUS:-0}")
	if ! "$python" -c "import $module" 2>/dev/null; then skipped $name "$python has no $module"; return; fi
	mkdir -p "$dir"
	local health='f='"$dir"'/state; a=$(sed -n "s/^iterations=//p" $f); sleep 1; b=$(sed -n "s/^iterations=//p" $f); grep -qx status=ok $f && [ "$b" -gt "$a" ]'
	cli roundtrip --require-cuda --health-cmd "$health" --start-timeout 240 --repeat 2 --dir "$dir/rt" --name "$name" \
		-- env -u LD_LIBRARY_PATH "${only[@]}" "$python" -u "$bundle/framework_workload.py" "$module" --mb 1024 --state "$dir/state" \
		>"$dir/rt.txt" 2>&1
	rc=$?
	sed 's/^/  | /' "$dir/rt.txt" | tail -n 16
	[ "$rc" = 0 ] || { failed $name "cuda-criu roundtrip --repeat 2 exited $rc"; return; }
	passed $name "2 cycles of a $module program, its result equal bit for bit after each restore"
}

test_jax() { framework_roundtrip jax; }
test_cupy() { framework_roundtrip cupy; }
test_transformers() { framework_roundtrip transformers; }

# PyTorch with the allocator settings serving stacks use (PYTORCH_CUDA_ALLOC_CONF: expandable segments, whose
# memory the caching allocator maps with cuMemCreate/cuMemMap; or cudaMallocAsync's pools), a CUDA graph
# captured with torch.cuda.graph and 64 MiB of host memory registered with cudaHostRegister, copied through
# on a stream of its own (torch_workload.py --graph --host-register-mb 64): dumped and restored, the pass's
# checksum equal bit for bit after the restore. The workload's ready line must show the allocator asked for.
torch_alloc_test() {
	local name=$1 conf=$2 want=$3 dir=$work/$1 ready
	if ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
		skipped "$name" "$python has no PyTorch with CUDA"
		return
	fi
	start_in "$dir" env -u LD_LIBRARY_PATH PYTORCH_CUDA_ALLOC_CONF="$conf" "$python" -u "$bundle/torch_workload.py" \
		--gb 1 --graph --host-register-mb 64 --state "$dir/state" --interval-ms 100
	wait_state "$dir/state" 240 1 || { failed "$name" "before the dump: $why"; show_workload "$dir"; return; }
	ready=$(grep -m1 '^ready ' "$dir/stdout")
	echo "  $name: PYTORCH_CUDA_ALLOC_CONF=$conf: $ready"
	if [[ "$ready" != *"$want"* ]]; then
		failed "$name" "the workload does not run with $want"
		kill_tree "$(state_value "$dir/state" pid)"
		return
	fi
	dump_restore_test "$name" "$dir" 240 "$dir/state"
}

test_torch_expandable() { torch_alloc_test torch-expandable expandable_segments:True "allocator=native expandable=True"; }
test_torch_mallocasync() { torch_alloc_test torch-mallocasync backend:cudaMallocAsync "allocator=cudaMallocAsync"; }
