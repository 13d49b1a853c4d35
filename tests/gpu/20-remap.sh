# Real-GPU tests of the GPU pairs and of refused restores (sourced by run-gpu-tests.sh: each test_NAME
# function is the test NAME, with - for _): explicit and automatic maps, two GPUs, a missing GPU, a GPU
# without room, another driver version. Those for 2 GPUs skip on one.

# GPU pairs handed to the driver (cuCheckpointProcessRestore's gpuPairs) with one GPU: the explicit map
# 0=0 restores GPU 0 onto itself through the remapping path.
test_remap_self() {
	local dir=$work/remap-self
	start_in "$dir" "$bundle/bin/cuda_memcheck" --mb 1024 --state "$dir/state" --interval-ms 100
	CUDA_CRIU_DEVICE_MAP=0=0 dump_restore_test remap-self "$dir" 120 "$dir/state"
	local line; line=$(grep -o 'cuda_plugin: restoring with GPU pairs:.*' "$dir/restore.log" | tail -n1)
	if [ -z "$line" ]; then
		failed remap-self "the plugin did not restore with GPU pairs"
	else
		echo "  $line"
	fi
}

# A device map naming a GPU this machine lacks: the restore fails before any process runs, says why.
test_refuse_map() {
	local name=refuse-map dir=$work/refuse-map pid line base
	dumped $name "$dir" 256 || return
	if CUDA_CRIU_DEVICE_MAP=0=7 criu_restore "$dir"; then
		failed $name "criu restore succeeded with a map onto a missing GPU"; kill_pids "$pid"; return
	fi
	sleep 1
	if alive "$pid" && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then
		failed $name "pid $pid runs after the refused restore"; kill_pids "$pid"; return
	fi
	line=$(grep -o 'Error (cuda_plugin):.*' "$dir/restore.log" | head -n1)
	[ -n "$line" ] || { failed $name "no 'Error (cuda_plugin)' line in restore.log"; show_log "$dir/restore.log"; return; }
	passed $name "restore refused, nothing left running"
	echo "  $line"
}

# Checkpointed on GPU 0, restored onto GPU 1 by an explicit map. The driver checkpoints every GPU the
# process can see (it opens all their device nodes), so the map pairs both: 0=1,1=0.
test_remap_gpu1() {
	with_two_gpus remap-gpu1 || return
	local dir=$work/remap-gpu1 pid
	start_in "$dir" "$bundle/bin/cuda_memcheck" --mb 2048 --device 0 --state "$dir/state" --interval-ms 100
	wait_state "$dir/state" 120 1 || { failed remap-gpu1 "before the dump: $why"; return; }
	pid=$(state_value "$dir/state" pid)
	RESTORE_ENV=CUDA_CRIU_DEVICE_MAP=0=1,1=0 KEEP_RUNNING=1 dump_restore_test remap-gpu1 "$dir" 120 "$dir/state"
	alive "$pid" && expect_on remap-gpu1 "$pid" 1
	kill_pids "$pid"
}

# A tree whose processes sit on different GPUs, restored with the two GPUs swapped.
test_tree_2gpu() {
	with_two_gpus tree-2gpu || return
	local dir=$work/tree-2gpu root child
	start_in "$dir" "$bundle/bin/cuda_memcheck" --mb 1024 --device 0 --children 1 --child-device 1 --state "$dir/state"
	wait_state "$dir/state.0" 120 1 || { failed tree-2gpu "before the dump: $why"; return; }
	root=$(state_value "$dir/state" pid); child=$(state_value "$dir/state.0" pid)
	RESTORE_ENV=CUDA_CRIU_DEVICE_MAP=0=1,1=0 KEEP_RUNNING=1 dump_restore_test tree-2gpu "$dir" 120 "$dir/state" "$dir/state.0"
	alive "$root" "$child" && expect_on tree-2gpu "$root" 1 && expect_on tree-2gpu "$child" 0
	kill_pids "$child" "$root"
}

# One PyTorch process holding weights on two GPUs: dumped, restored as it was, then restored swapped.
test_torch_2gpu() {
	with_two_gpus torch-2gpu || return
	local dir=$work/torch-2gpu
	start_in "$dir" "$python" -u "$bundle/torch_workload.py" --gb 2 --second-device 1 --state "$dir/state" --interval-ms 100
	RESTORE_ENV=CUDA_CRIU_DEVICE_MAP=0=1,1=0 dump_restore_test torch-2gpu "$dir" 240 "$dir/state"
}

# Automatic remapping: a process that sees only GPU 0 (CUDA_VISIBLE_DEVICES=0) is restored by a CRIU that
# sees only GPU 1: GPU 0 is then absent for the plugin, a GPU of the same model is there, no map is given.
test_auto_remap() {
	with_two_gpus auto-remap || return
	local dir=$work/auto-remap pid nodes line
	start_in "$dir" env CUDA_VISIBLE_DEVICES=0 "$bundle/bin/cuda_memcheck" --mb 1024 --state "$dir/state" --interval-ms 100
	wait_state "$dir/state" 120 1 || { failed auto-remap "before the dump: $why"; return; }
	pid=$(state_value "$dir/state" pid)
	nodes=$(ls -l "/proc/$pid/fd" 2>/dev/null | grep -o '/dev/nvidia[0-9]*$' | sort -u | xargs)
	echo "  auto-remap: pid $pid holds the GPU device nodes: ${nodes:-none}"
	RESTORE_ENV=CUDA_VISIBLE_DEVICES=1 KEEP_RUNNING=1 dump_restore_test auto-remap "$dir" 120 "$dir/state"
	line=$(grep -o 'cuda_plugin: restoring with GPU pairs:.*' "$dir/restore.log" | tail -n1)
	echo "  ${line:-no 'restoring with GPU pairs' line in restore.log}"
	case "$line" in *"automatic: same model"*) ;; *) failed auto-remap "the plugin did not pair the GPUs automatically" ;; esac
	alive "$pid" && expect_on auto-remap "$pid" 1
	kill_pids "$pid"
}

# Processes restricted to GPU 0 (CUDA_VISIBLE_DEVICES by index, by UUID) and one that is not, moved to
# GPU 1 by hand: `cuda-criu suspend`, then `resume --device-map 0=1`. The driver wants every GPU of the
# machine paired (GPU 0 -> 1 alone is refused, also for the restricted processes); the CLI completes the
# map with 1 -> 0 as the plugin does. Each process must then run on GPU 1 with its data intact.
test_remap_visible() {
	with_two_gpus remap-visible || return
	local name=remap-visible u0 u1 v i=0 dir pid out bad=0
	u0=$(gpu_uuid 0); u1=$(gpu_uuid 1)
	for v in 0 "$u0" unrestricted; do
		dir=$work/$name/$i; i=$((i + 1))
		if [ "$v" = unrestricted ]; then
			start_in "$dir" env -u CUDA_VISIBLE_DEVICES "$bundle/bin/cuda_memcheck" --mb 256 --device 0 --state "$dir/state" --interval-ms 100
		else
			start_in "$dir" env CUDA_VISIBLE_DEVICES="$v" "$bundle/bin/cuda_memcheck" --mb 256 --state "$dir/state" --interval-ms 100
		fi
		wait_state "$dir/state" 60 1 || { failed $name "CUDA_VISIBLE_DEVICES=$v: $why"; continue; }
		pid=$(state_value "$dir/state" pid)
		started+=("$pid")
		echo "  CUDA_VISIBLE_DEVICES=$v: pid $pid holds $(ls -l "/proc/$pid/fd" | grep -o '/dev/nvidia[0-9]*$' | sort -u | xargs)"
		if ! out=$(cli suspend "$pid" 2>&1 && cli resume --device-map 0=1 "$pid" 2>&1); then
			bad=1; echo "    suspend, resume --device-map 0=1: $out"
			cli resume "$pid" >/dev/null 2>&1
		fi
		why=""
		if advance 30 "$dir/state" "$(state_value "$dir/state" iterations)" && [ "$(gpu_uuids_of "$pid")" = "$u1" ]; then
			echo "    on GPU 1 now, data intact (iterations $after)"
		else
			bad=1; echo "    not running on GPU 1 with its data: ${why:-on $(gpu_uuids_of "$pid")}"
		fi
		kill_pids "$pid"
	done
	[ "$bad" = 0 ] && passed $name "each process moved to GPU 1 by 'resume --device-map 0=1', data intact"
	[ "$bad" = 0 ] || failed $name "a process did not reach GPU 1 with its data (see above)"
}

# A GPU without enough free memory: the restore is refused before any process runs, with a message that
# says how much is free; once the memory is free again, the same image restores with its data.
test_refuse_free() {
	local name=refuse-free dir=$work/refuse-free pid hog line base
	if ! "$python" -c 'import torch' 2>/dev/null; then skipped $name "$python has no PyTorch (the memory hog)"; return; fi
	dumped $name "$dir" 2048 || return
	start_in "$dir/hog" env -u LD_LIBRARY_PATH "$python" -c '
import time, torch
free, total = torch.cuda.mem_get_info(0)
x = torch.empty(free - (1 << 30), dtype=torch.uint8, device="cuda:0")
print("hog", flush=True)
time.sleep(600)'
	local i; for i in $(seq 100); do grep -q hog "$dir/hog/stdout" 2>/dev/null && break; sleep 0.3; done
	hog=$(pgrep -f 'torch.cuda.mem_get_info' | head -n1)
	started+=($hog)
	echo "  $name: memory hog pid ${hog:-?} leaves $(nvidia-smi --query-gpu=memory.free --format=csv,noheader -i 0) free on GPU 0"
	if criu_restore "$dir"; then
		failed $name "criu restore succeeded onto a GPU without room"; kill_pids "$pid" $hog; return
	fi
	line=$(grep -o 'Error (cuda_plugin):.*' "$dir/restore.log" | head -n1)
	echo "  $line"
	case "$line" in *"free now"*) ;; *) failed $name "no free-memory refusal from the plugin"; show_log "$dir/restore.log"; kill_pids "$pid" $hog; return ;; esac
	sleep 1
	if alive "$pid" && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then
		failed $name "pid $pid runs after the refused restore"; kill_pids "$pid" $hog; return
	fi
	kill_pids $hog
	gone_within 30 "$pid" || { failed $name "pid $pid not free after the refused restore"; return; }
	criu_restore "$dir" || { failed $name "restore after freeing the memory: $why"; show_log "$dir/restore.log"; return; }
	advance 60 "$dir/state" "$base" || { failed $name "after the second restore: $why"; kill_pids "$pid"; return; }
	passed $name "refused while 1 GiB was free, restored once freed (iterations $after)"
	kill_pids "$pid"
}

# An image whose recorded driver version differs from this machine's (the version in cuda-plugin.img
# rewritten, same length): the restore is refused at once with both versions named; the untouched image
# then restores.
test_refuse_driver() {
	local name=refuse-driver dir=$work/refuse-driver pid line base refused_s
	dumped $name "$dir" 256 || return
	cp "$dir/img/cuda-plugin.img" "$dir/cuda-plugin.img.orig"
	python3 - "$dir/img/cuda-plugin.img" <<'PY' || { failed $name "could not rewrite the driver version"; return; }
import sys
v = open("/sys/module/nvidia/version").read().strip().encode()
other = bytes([v[0] - 1]) + v[1:]  # 580.x -> 480.x, same length: the protobuf stays valid
data = open(sys.argv[1], "rb").read()
assert data.count(v) == 1, data
open(sys.argv[1], "wb").write(data.replace(v, other))
print("  image now says driver %s, this machine runs %s" % (other.decode(), v.decode()))
PY
	if criu_restore "$dir"; then
		failed $name "criu restore succeeded with an image of another driver version"; kill_pids "$pid"; return
	fi
	refused_s=$restore_s
	line=$(grep -o 'Error (cuda_plugin):.*' "$dir/restore.log" | head -n1)
	echo "  $line (after $refused_s s)"
	case "$line" in *"dumped under NVIDIA driver"*) ;; *) failed $name "no driver version refusal"; show_log "$dir/restore.log"; return ;; esac
	alive "$pid" && { failed $name "pid $pid exists after the refused restore"; kill_pids "$pid"; return; }
	cp "$dir/cuda-plugin.img.orig" "$dir/img/cuda-plugin.img"
	criu_restore "$dir" || { failed $name "restore of the untouched image: $why"; show_log "$dir/restore.log"; return; }
	advance 60 "$dir/state" "$base" || { failed $name "after the restore: $why"; kill_pids "$pid"; return; }
	passed $name "refused in $refused_s s naming both versions; the untouched image restored (iterations $after)"
	kill_pids "$pid"
}
