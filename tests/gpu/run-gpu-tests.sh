#!/usr/bin/env bash
# Checkpoint/restore tests on a real NVIDIA GPU, run from the root of the bundle that scripts/gpu-bundle.sh
# builds (CRIU, its libraries, the plugin, the workloads):
#
#   bash build/gpu-bundle/run-gpu-tests.sh [TEST...]      (as root; default: all tests)
#   bash build/gpu-bundle/run-gpu-tests.sh --list | --help  (the test names | this text; touch nothing)
#
# Tests: --list names them (those for 2 GPUs skip on one). Each prints one line, "PASS name (figures)", "FAIL name: why"
# or "SKIP name: why"; the exit status is 1 when any test failed. Only criu runs with the bundle's lib/ in
# LD_LIBRARY_PATH: the workloads use the machine's own libraries and its libcuda.so.1.
#
# Environment:
#   GPU_TESTS_WORK   scratch folder for images and logs (default /var/tmp/cuda-criu-gpu-tests; emptied first)
#   OUT              if set, results.txt and logs.tar.gz (all CRIU and workload logs) are written there
#   GPU_TESTS_PYTHON the python with PyTorch (default python3)
#   GPU_TESTS_CRIU_TIMEOUT  seconds a criu dump or restore may take before it is killed (default 120)
#   MEMCHECK_MB, TORCH_GB, TREE_MB, LEAVE_MB   workload sizes (4096, 4, 1024, 1024); the test names stay
#   LOAD_PROCS, LOAD_ROUNDS, LOAD_MB   the load test (16 processes, 20 rounds, 64 MiB each)
#   FORK_STEPS       training steps of torch-dataloader and torch-forkpool (400)
#   GPU_TESTS_RUNC_REMAP  how runc-remap pairs the GPUs: map (CUDA_CRIU_DEVICE_MAP, default) or auto (no map)
#   GPU_TESTS_JAX_GPUS  CUDA_VISIBLE_DEVICES of the jax test's workload (default 0; all: every GPU)
#   GPU_TESTS_RUNC_REMAP_KEEP0  if set, runc-remap's restored container keeps /dev/nvidia0 beside nvidia1
#   GPU_TESTS_RUNC_WORKLOAD  what runc and runc-remap run in the container: memcheck (cuda_memcheck on 1 GiB,
#                    default) or torch (torch_workload.py on 2 GiB, with the host's python and PyTorch)
set -uo pipefail

bundle=$(cd "$(dirname "$0")" && pwd)
# The helpers shared with the other shell tests: next to this script in the bundle, in tests/lib/ in the
# source tree.
for common in "$bundle/common.sh" "$bundle/../lib/common.sh" ""; do [ -f "$common" ] && break; done
[ -n "$common" ] || { echo "no common.sh next to $0 nor in $bundle/../lib: rebuild the bundle (scripts/gpu-bundle.sh)" >&2; exit 2; }
source "$common"
work=${GPU_TESTS_WORK:-/var/tmp/cuda-criu-gpu-tests}
python=${GPU_TESTS_PYTHON:-python3}
all_tests=(memcheck-4g torch tree leave-running managed-refused progress-16g cgroup-limit remap-self refuse-map
	remap-gpu1 tree-2gpu torch-2gpu auto-remap remap-visible refuse-free refuse-driver cli-steps roundtrip-torch runc runc-remap load
	torch-dataloader torch-forkpool jax cupy transformers gpu-image)
memcheck_mb=${MEMCHECK_MB:-4096}
torch_gb=${TORCH_GB:-4}
tree_mb=${TREE_MB:-1024}
leave_mb=${LEAVE_MB:-1024}
criu_timeout=${GPU_TESTS_CRIU_TIMEOUT:-120}

case "${1:-}" in
-h | --help) sed -n '2,/^set -uo pipefail/{/^set/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
--list) printf '%s\n' "${all_tests[@]}"; exit 0 ;;
esac

# Everything printed also goes to $work/results.txt (and $OUT/results.txt, as it happens, so that a run cut
# short still leaves its lines there): run again behind tee.
if [ -z "${GPU_TESTS_TEED:-}" ]; then
	rm -rf "$work" && mkdir -p "$work" || { echo "cannot create $work" >&2; exit 2; }
	[ -z "${OUT:-}" ] || mkdir -p "$OUT"
	# A TERM (from timeout, which signals the whole group) ends the tests; the logs are still packed.
	trap 'echo "interrupted" >>"$work/results.txt"' INT TERM
	GPU_TESTS_TEED=1 bash "$0" "$@" 2>&1 | tee "$work/results.txt" ${OUT:+"$OUT/results.txt"}
	rc=${PIPESTATUS[0]}
	if [ -n "${OUT:-}" ]; then
		cp "$work/results.txt" "$OUT/results.txt"
		# Logs only: the images are GBs.
		(cd "$work" && find . -type f ! -path '*/img/*' -print0 |
			tar --null -czf "$OUT/logs.tar.gz" -T -) || echo "could not write $OUT/logs.tar.gz" >&2
	fi
	exit "$rc"
fi

failures=0
started=() # every workload pid we saw, killed on exit

criu_cmd=(env "LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$bundle/sbin/criu")
criu() { "${criu_cmd[@]}" "$@"; }

now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
gib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1073741824 }'; }

passed() { echo "PASS $1 ($2)"; }
failed() { echo "FAIL $1: $2"; failures=$((failures + 1)); }
skipped() { echo "SKIP $1: $2"; }

# wait_state FILE TIMEOUT_S MIN_ITERATIONS: until the workload has done MIN_ITERATIONS verified passes.
# Sets why on failure.
wait_state() {
	local file=$1 deadline=$(($(date +%s) + $2)) min=$3 st it
	while [ "$(date +%s)" -lt "$deadline" ]; do
		st=$(state_value "$file" status)
		it=$(state_value "$file" iterations)
		case "$st" in
		ok) [ "${it:-0}" -ge "$min" ] && return 0 ;;
		"") ;;
		*) why="$(basename "$file") says status=$st"; return 1 ;;
		esac
		sleep 0.2
	done
	why="$(basename "$file") did not reach $min iteration(s) with status=ok in $2 s (iterations=${it:-none}, status=${st:-none})"
	return 1
}

# advance TIMEOUT_S FILE BASELINE [FILE BASELINE...]: until every file shows more iterations than its
# baseline, status=ok throughout; then watches 3 s more and wants status=ok still. Sets why, and after.
advance() {
	local t=$1; shift
	local -a files=() base=()
	while [ $# -gt 0 ]; do files+=("$1"); base+=("$2"); shift 2; done
	local deadline=$(($(date +%s) + t)) i st it done_all
	after=""
	while :; do
		done_all=1
		for i in "${!files[@]}"; do
			st=$(state_value "${files[$i]}" status)
			it=$(state_value "${files[$i]}" iterations)
			if [ -n "$st" ] && [ "$st" != ok ]; then
				why="$(basename "${files[$i]}") says status=$st"; return 1
			fi
			[ "${it:-0}" -gt "${base[$i]}" ] || done_all=0
		done
		[ "$done_all" = 1 ] && break
		if [ "$(date +%s)" -ge "$deadline" ]; then
			why="iterations did not advance within $t s:"
			for i in "${!files[@]}"; do
				why+=" $(basename "${files[$i]}") ${base[$i]}->$(state_value "${files[$i]}" iterations)"
			done
			return 1
		fi
		sleep 0.2
	done
	sleep 3
	for i in "${!files[@]}"; do
		st=$(state_value "${files[$i]}" status)
		[ "$st" = ok ] || { why="$(basename "${files[$i]}") says status=$st"; return 1; }
		after+="${after:+, }${base[$i]}->$(state_value "${files[$i]}" iterations)"
	done
}

# The pids of a process tree, root first.
tree_pids() {
	local p c
	for p in "$@"; do
		[ -d "/proc/$p" ] || continue
		echo "$p"
		c=$(cat /proc/"$p"/task/*/children 2>/dev/null)
		[ -n "$c" ] && tree_pids $c
	done
}

alive() { local p; for p in "$@"; do [ -d "/proc/$p" ] || return 1; done; }

# wait_gone TIMEOUT_S PID...: a restore needs the pids free again.
wait_gone() {
	local deadline=$(($(date +%s) + $1)) p; shift
	for p in "$@"; do
		while [ -d "/proc/$p" ]; do
			[ "$(date +%s)" -lt "$deadline" ] || return 1
			sleep 0.05
		done
	done
}

kill_pids() {
	[ $# -gt 0 ] || return 0
	kill -9 "$@" 2>/dev/null
	wait_gone 20 "$@" || echo "  warning: pids $* still exist after SIGKILL"
}

kill_tree() { local -a p; mapfile -t p < <(tree_pids "$1"); kill_pids "${p[@]}"; }

# GPU memory (GiB) the given pids hold, as nvidia-smi sees it.
gpu_gib() {
	local pids=" $* "
	nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
		awk -F', *' -v pids="$pids" 'index(pids, " " $1 " ") { m += $2 } END { printf "%.2f", m / 1024 }'
}

# Logs of a failed step: the end of the CRIU log and what our plugin said.
show_log() {
	local log=$1
	[ -f "$log" ] || { echo "  (no $log)"; return; }
	echo "  --- last 30 lines of $log"
	tail -n 30 "$log" | sed 's/^/  | /'
	if grep -q 'cuda_plugin' "$log"; then
		echo "  --- cuda_plugin lines of $log (last 25)"
		grep 'cuda_plugin' "$log" | tail -n 25 | sed 's/^/  | /'
	fi
}

show_workload() {
	local dir=$1 f
	for f in "$dir"/stdout "$dir"/stderr; do
		[ -s "$f" ] && { echo "  --- $(basename "$f") of the workload (last 10)"; tail -n 10 "$f" | sed 's/^/  | /'; }
	done
}

plugin_line() { grep -o "cuda_plugin: $2:.*" "$1" 2>/dev/null | tail -n1; }

# start DIR CMD...: the workload in its own session, not a child of this shell, stdio to files.
start() {
	local dir=$1; shift
	mkdir -p "$dir"
	(cd "$dir" && exec setsid -f "$@" >"$dir/stdout" 2>"$dir/stderr" </dev/null)
}

# dump DIR PID EXTRA...: sets dump_s, img_bytes; why on failure.
# GPU pairs handed to the driver (cuCheckpointProcessRestore's gpuPairs) with one GPU: the explicit map
# 0=0 restores GPU 0 onto itself through the remapping path.
test_remap_self() {
	local dir=$work/remap-self
	start "$dir" "$bundle/bin/cuda_memcheck" --mb 1024 --state "$dir/state" --interval-ms 100
	CUDA_CRIU_DEVICE_MAP=0=0 dump_restore_test remap-self "$dir" 120 "$dir/state"
	local line; line=$(grep -o 'cuda_plugin: restoring with GPU pairs:.*' "$dir/restore.log" | tail -n1)
	if [ -z "$line" ]; then
		failed remap-self "the plugin did not restore with GPU pairs"
	else
		echo "  $line"
	fi
}

# The UUIDs of the GPUs the given pids hold, as nvidia-smi sees them.
gpus_of() {
	local pids=" $* "
	nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader 2>/dev/null |
		awk -F', *' -v pids="$pids" 'index(pids, " " $1 " ") { print $2 }' | sort -u | xargs
}
gpu_uuid() { nvidia-smi --query-gpu=uuid --format=csv,noheader -i "$1" 2>/dev/null; }
ngpus() { nvidia-smi -L 2>/dev/null | grep -c '^GPU'; }

# with_two_gpus NAME: skips unless the machine has two GPUs.
with_two_gpus() { [ "$(ngpus)" -ge 2 ] || { skipped "$1" "needs 2 GPUs, this machine has $(ngpus)"; return 1; }; }

# expect_on NAME PID GPU_INDEX: the process holds memory on that GPU only.
expect_on() {
	local got want; got=$(gpus_of "$2"); want=$(gpu_uuid "$3")
	if [ "$got" != "$want" ]; then
		failed "$1" "pid $2 is on '$got' after the restore, expected GPU $3 ($want)"
		return 1
	fi
	echo "  pid $2 runs on GPU $3 ($want) after the restore"
}

# Checkpointed on GPU 0, restored onto GPU 1 by an explicit map. The driver checkpoints every GPU the
# process can see (it opens all their device nodes), so the map pairs both: 0=1,1=0.
test_remap_gpu1() {
	with_two_gpus remap-gpu1 || return
	local dir=$work/remap-gpu1 pid
	start "$dir" "$bundle/bin/cuda_memcheck" --mb 2048 --device 0 --state "$dir/state" --interval-ms 100
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
	start "$dir" "$bundle/bin/cuda_memcheck" --mb 1024 --device 0 --children 1 --child-device 1 --state "$dir/state"
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
	start "$dir" "$python" -u "$bundle/torch_workload.py" --gb 2 --second-device 1 --state "$dir/state" --interval-ms 100
	RESTORE_ENV=CUDA_CRIU_DEVICE_MAP=0=1,1=0 dump_restore_test torch-2gpu "$dir" 240 "$dir/state"
}

# dumped NAME DIR MB: cuda_memcheck with MB MiB started in DIR, dumped, and gone; sets pid, and base (its
# iterations when dumped). Fails the test NAME, returning 1, when a step fails.
dumped() {
	local name=$1 dir=$2 mb=$3
	start "$dir" "$bundle/bin/cuda_memcheck" --mb "$mb" --state "$dir/state" --interval-ms 100
	wait_state "$dir/state" 120 1 || { failed "$name" "before the dump: $why"; return 1; }
	pid=$(state_value "$dir/state" pid)
	started+=("$pid")
	dump "$dir" "$pid" || { failed "$name" "$why"; show_log "$dir/dump.log"; return 1; }
	wait_gone 30 "$pid" || { failed "$name" "pid $pid still exists after the dump"; return 1; }
	base=$(state_value "$dir/state" iterations)
}

# A device map naming a GPU this machine lacks: the restore fails before any process runs, says why.
test_refuse_map() {
	local name=refuse-map dir=$work/refuse-map pid line base
	dumped $name "$dir" 256 || return
	if CUDA_CRIU_DEVICE_MAP=0=7 restore "$dir"; then
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

# Automatic remapping: a process that sees only GPU 0 (CUDA_VISIBLE_DEVICES=0) is restored by a CRIU that
# sees only GPU 1: GPU 0 is then absent for the plugin, a GPU of the same model is there, no map is given.
test_auto_remap() {
	with_two_gpus auto-remap || return
	local dir=$work/auto-remap pid nodes line
	start "$dir" env CUDA_VISIBLE_DEVICES=0 "$bundle/bin/cuda_memcheck" --mb 1024 --state "$dir/state" --interval-ms 100
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
			start "$dir" env -u CUDA_VISIBLE_DEVICES "$bundle/bin/cuda_memcheck" --mb 256 --device 0 --state "$dir/state" --interval-ms 100
		else
			start "$dir" env CUDA_VISIBLE_DEVICES="$v" "$bundle/bin/cuda_memcheck" --mb 256 --state "$dir/state" --interval-ms 100
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
		if advance 30 "$dir/state" "$(state_value "$dir/state" iterations)" && [ "$(gpus_of "$pid")" = "$u1" ]; then
			echo "    on GPU 1 now, data intact (iterations $after)"
		else
			bad=1; echo "    not running on GPU 1 with its data: ${why:-on $(gpus_of "$pid")}"
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
	start "$dir/hog" env -u LD_LIBRARY_PATH "$python" -c '
import time, torch
free, total = torch.cuda.mem_get_info(0)
x = torch.empty(free - (1 << 30), dtype=torch.uint8, device="cuda:0")
print("hog", flush=True)
time.sleep(600)'
	local i; for i in $(seq 100); do grep -q hog "$dir/hog/stdout" 2>/dev/null && break; sleep 0.3; done
	hog=$(pgrep -f 'torch.cuda.mem_get_info' | head -n1)
	started+=($hog)
	echo "  $name: memory hog pid ${hog:-?} leaves $(nvidia-smi --query-gpu=memory.free --format=csv,noheader -i 0) free on GPU 0"
	if restore "$dir"; then
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
	wait_gone 30 "$pid" || { failed $name "pid $pid not free after the refused restore"; return; }
	restore "$dir" || { failed $name "restore after freeing the memory: $why"; show_log "$dir/restore.log"; return; }
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
	if restore "$dir"; then
		failed $name "criu restore succeeded with an image of another driver version"; kill_pids "$pid"; return
	fi
	refused_s=$restore_s
	line=$(grep -o 'Error (cuda_plugin):.*' "$dir/restore.log" | head -n1)
	echo "  $line (after $refused_s s)"
	case "$line" in *"dumped under NVIDIA driver"*) ;; *) failed $name "no driver version refusal"; show_log "$dir/restore.log"; return ;; esac
	alive "$pid" && { failed $name "pid $pid exists after the refused restore"; kill_pids "$pid"; return; }
	cp "$dir/cuda-plugin.img.orig" "$dir/img/cuda-plugin.img"
	restore "$dir" || { failed $name "restore of the untouched image: $why"; show_log "$dir/restore.log"; return; }
	advance 60 "$dir/state" "$base" || { failed $name "after the restore: $why"; kill_pids "$pid"; return; }
	passed $name "refused in $refused_s s naming both versions; the untouched image restored (iterations $after)"
	kill_pids "$pid"
}

# Load: a tree of LOAD_PROCS cuda_memcheck processes (default 16, LOAD_MB each) dumped and restored
# LOAD_ROUNDS times in a row (default 20): every round restores all of them verifying their data, no
# process gains fds or threads, the GPU memory they hold stays the same, and no criu is left behind.
test_load() {
	local name=load dir=$work/load procs=${LOAD_PROCS:-16} rounds=${LOAD_ROUNDS:-20} mb=${LOAD_MB:-64}
	local files=("$dir/state") pids=() k f p round args gpu0 gpu dumps=() restores=()
	declare -A base
	for ((k = 0; k < procs - 1; k++)); do files+=("$dir/state.$k"); done
	start "$dir" "$bundle/bin/cuda_memcheck" --mb "$mb" --children $((procs - 1)) --state "$dir/state" --interval-ms 100
	for f in "${files[@]}"; do wait_state "$f" 180 1 || { failed $name "before the first dump: $why"; return; }; done
	for f in "${files[@]}"; do pids+=("$(state_value "$f" pid)"); done
	started+=("${pids[@]}")
	counts() { echo "$(ls "/proc/$1/fd" | wc -l) fds, $(ls "/proc/$1/task" | wc -l) threads"; }
	gpu0=$(gpu_gib "${pids[@]}")
	echo "  $name: $procs processes x $mb MiB, $gpu0 GiB on the GPU; root $(counts "${pids[0]}") before the first dump"
	for ((round = 1; round <= rounds; round++)); do
		dump "$dir" "${pids[0]}" || { failed $name "round $round: $why"; show_log "$dir/dump.log"; kill_pids "${pids[@]}"; return; }
		dumps+=("$dump_s")
		wait_gone 60 "${pids[@]}" || { failed $name "round $round: pids still there after the dump"; kill_pids "${pids[@]}"; return; }
		args=()
		for f in "${files[@]}"; do args+=("$f" "$(state_value "$f" iterations)"); done
		restore "$dir" || { failed $name "round $round: $why"; show_log "$dir/restore.log"; kill_tree "${pids[0]}"; return; }
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

cli() { env "LD_LIBRARY_PATH=$bundle/lib" "$bundle/bin/cuda-criu" "$@"; }

# cuda-criu on a real GPU: each driver step by hand (lock, checkpoint, restore, unlock), the state after
# each, the GPU memory freed while checkpointed; then `inspect` (text and JSON) of a CRIU image.
test_cli_steps() {
	local name=cli-steps dir=$work/cli-steps pid st gpu step
	start "$dir" "$bundle/bin/cuda_memcheck" --mb 1024 --state "$dir/state" --interval-ms 100
	wait_state "$dir/state" 120 1 || { failed $name "before the steps: $why"; return; }
	pid=$(state_value "$dir/state" pid)
	started+=("$pid")
	echo "  $name: cuda-criu ps"
	cli ps 2>&1 | sed 's/^/  | /'
	for step in "lock locked" "checkpoint checkpointed" "restore locked" "unlock running"; do
		set -- $step
		cli "$1" "$pid" >"$dir/$1.out" 2>&1 || { failed $name "cuda-criu $1 $pid: $(cat "$dir/$1.out")"; kill_pids "$pid"; return; }
		st=$(cli status "$pid" 2>&1)
		gpu=$(gpu_gib "$pid")
		echo "  cuda-criu $1 $pid -> '$(cat "$dir/$1.out")'; status '$st'; GPU memory $gpu GiB"
		[ "$st" = "$pid $2" ] || { failed $name "after $1: status says '$st', expected '$pid $2'"; kill_pids "$pid"; return; }
		if [ "$1" = checkpoint ] && [ "$gpu" != 0.00 ]; then
			failed $name "checkpointed, but the process still holds $gpu GiB on the GPU"; kill_pids "$pid"; return
		fi
	done
	advance 30 "$dir/state" "$(state_value "$dir/state" iterations)" || { failed $name "after unlock: $why"; kill_pids "$pid"; return; }
	dump "$dir" "$pid" || { failed $name "$why"; show_log "$dir/dump.log"; kill_pids "$pid"; return; }
	echo "  cuda-criu inspect $dir/img"
	cli inspect "$dir/img" >"$dir/inspect.txt" 2>&1 || { failed $name "inspect: $(cat "$dir/inspect.txt")"; return; }
	sed 's/^/  | /' "$dir/inspect.txt"
	cli inspect --json "$dir/img" >"$dir/inspect.json" 2>&1 || { failed $name "inspect --json: $(cat "$dir/inspect.json")"; return; }
	python3 - "$dir/inspect.json" "$pid" <<'PY' || { failed $name "inspect --json does not describe pid $pid"; return; }
import json, sys
d = json.load(open(sys.argv[1]))
procs = [p for p in d["processes"] if p["pid"] == int(sys.argv[2])]
assert d["cuda_image"] and procs and d["gpus"], d
print("  inspect --json: %d process(es), %d GPU(s), driver %s" % (len(d["processes"]), len(d["gpus"]), d["driver_version"]))
PY
	passed $name "lock/checkpoint/restore/unlock by hand, status after each, inspect of a $(gib "$img_bytes") GiB image"
	rm -rf "$dir/img"
}

# cuda-criu roundtrip against a PyTorch program: two cycles, and one with --leave-running; the reports
# (table, JSON, JUnit) go to the logs.
test_roundtrip_torch() {
	local name=roundtrip-torch dir=$work/roundtrip-torch rc
	if ! "$python" -c 'import torch' 2>/dev/null; then skipped $name "$python has no PyTorch"; return; fi
	mkdir -p "$dir"
	local health='f='"$dir"'/state; a=$(sed -n "s/^iterations=//p" $f); sleep 1; b=$(sed -n "s/^iterations=//p" $f); grep -qx status=ok $f && [ "$b" -gt "$a" ]'
	local common=(--criu "$bundle/sbin/criu" --criu-env "LD_LIBRARY_PATH=$bundle/lib" --libdir "$bundle/plugin"
		--require-cuda --health-cmd "$health" --start-timeout 240)
	local workload=(env -u LD_LIBRARY_PATH "$python" -u "$bundle/torch_workload.py" --gb 2 --state "$dir/state" --interval-ms 100)
	cli roundtrip "${common[@]}" --repeat 2 --dir "$dir/rt" --json "$dir/rt.json" --junit "$dir/rt.xml" --name torch-2gb \
		-- "${workload[@]}" >"$dir/rt.txt" 2>&1
	rc=$?
	sed 's/^/  | /' "$dir/rt.txt" | tail -n 30
	[ "$rc" = 0 ] || { failed $name "cuda-criu roundtrip --repeat 2 exited $rc"; return; }
	rm -f "$dir/state"
	cli roundtrip "${common[@]}" --leave-running --dir "$dir/rt-r" --json "$dir/rt-r.json" --name torch-2gb-leave-running \
		-- "${workload[@]}" >"$dir/rt-r.txt" 2>&1
	rc=$?
	sed 's/^/  | /' "$dir/rt-r.txt" | tail -n 20
	[ "$rc" = 0 ] || { failed $name "cuda-criu roundtrip --leave-running exited $rc"; return; }
	passed $name "2 cycles, and 1 with --leave-running, of a 2 GiB PyTorch program"
}

# cuda-criu roundtrip against a JAX, CuPy or transformers program (tests/gpu/framework_workload.py): two
# cycles, the result compared bit for bit by the program after each restore. Skipped where python lacks it.
# JAX runs on GPU 0 only (CUDA_VISIBLE_DEVICES=0; CRIU sees every GPU): a JAX process spanning two GPUs is
# checkpointed, but the r580 driver refuses its restore (CUDA_ERROR_INVALID_VALUE), even in place.
test_framework() {
	local name=$1 module=$1 dir=$work/$1 rc only=()
	[ "$module" = jax ] && [ "${GPU_TESTS_JAX_GPUS:-0}" != all ] && only=(CUDA_VISIBLE_DEVICES="${GPU_TESTS_JAX_GPUS:-0}")
	if ! "$python" -c "import $module" 2>/dev/null; then skipped $name "$python has no $module"; return; fi
	mkdir -p "$dir"
	local health='f='"$dir"'/state; a=$(sed -n "s/^iterations=//p" $f); sleep 1; b=$(sed -n "s/^iterations=//p" $f); grep -qx status=ok $f && [ "$b" -gt "$a" ]'
	cli roundtrip --criu "$bundle/sbin/criu" --criu-env "LD_LIBRARY_PATH=$bundle/lib" --libdir "$bundle/plugin" \
		--require-cuda --health-cmd "$health" --start-timeout 240 --repeat 2 --dir "$dir/rt" --name "$name" \
		-- env -u LD_LIBRARY_PATH "${only[@]}" "$python" -u "$bundle/framework_workload.py" "$module" --mb 1024 --state "$dir/state" \
		>"$dir/rt.txt" 2>&1
	rc=$?
	sed 's/^/  | /' "$dir/rt.txt" | tail -n 16
	[ "$rc" = 0 ] || { failed $name "cuda-criu roundtrip --repeat 2 exited $rc"; return; }
	passed $name "2 cycles of a $module program, its result equal bit for bit after each restore"
}

# runc_prepare DIR: what a runc test needs in DIR: libseccomp for runc, rootfs/ (the host's top directories
# as mount points or links), state/, runc-root/, a criu wrapper, and RUNC_WORKLOAD for runc_config from
# GPU_TESTS_RUNC_WORKLOAD. Uses name (the test) and runc_bin; returns 1 (the test skipped) when the
# workload cannot run here.
runc_prepare() {
	local dir=$1 root=$1/rootfs d
	case "${GPU_TESTS_RUNC_WORKLOAD:-memcheck}" in
	memcheck) unset RUNC_WORKLOAD RUNC_BINDS ;;
	torch)
		# The host's python with PyTorch; its prefix (a virtual environment outside /usr, say) is bound
		# read-only at the same path, beside the host's /usr that its interpreter comes from.
		local py prefix
		py=$(command -v "$python")
		if ! prefix=$("$py" -c 'import sys, torch; assert torch.cuda.is_available(); print(sys.prefix)' 2>/dev/null); then
			skipped "$name" "GPU_TESTS_RUNC_WORKLOAD=torch: $python has no PyTorch with CUDA"; return 1
		fi
		case "$prefix" in /usr | /usr/*) unset RUNC_BINDS ;; *) export RUNC_BINDS=$prefix; mkdir -p "$root$prefix" ;; esac
		mkdir -p "$dir/state" && cp "$bundle/torch_workload.py" "$dir/state/" || return 1
		export RUNC_WORKLOAD="$py -u /state/torch_workload.py --gb 2 --state /state/one --interval-ms 100" ;;
	*) failed "$name" "GPU_TESTS_RUNC_WORKLOAD=${GPU_TESTS_RUNC_WORKLOAD}: want memcheck or torch"; return 1 ;;
	esac
	# runc re-executes itself (runc init) with an empty environment: its libseccomp must be the system's.
	if ! ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2 '; then
		echo "  $name: this machine has no libseccomp.so.2: installing the bundle's copy into /usr/local/lib"
		install -m 644 "$bundle/lib/libseccomp.so.2" /usr/local/lib/ && ldconfig
	fi
	mkdir -p "$dir"/{rootfs,state,runc-root}
	for d in usr etc proc sys dev tmp state opt/bin; do mkdir -p "$root/$d"; done
	for d in bin sbin lib lib64 lib32; do
		if [ -L "/$d" ]; then ln -sfn "$(readlink "/$d")" "$root/$d"; elif [ -d "/$d" ]; then mkdir -p "$root/$d"; fi
	done
	# CRIU through a wrapper: its libraries, and our plugin's directory (runc passes its environment on,
	# CUDA_CRIU_DEVICE_MAP included).
	printf '#!/bin/sh\nexport LD_LIBRARY_PATH=%s CRIU_LIBS_DIR=%s\nexec %s "$@"\n' \
		"$bundle/lib" "$bundle/plugin" "$bundle/sbin/criu" >"$dir/criu"
	chmod +x "$dir/criu"
}

# runc_config BUNDLE_DIR TEST_DIR DEV_DIR DEVICE...: BUNDLE_DIR/config.json for the rootfs and state/ of
# TEST_DIR, running $RUNC_WORKLOAD (default: cuda_memcheck on 1 GiB) with the state file /state/one; the
# host folders in $RUNC_BINDS (colon-separated) are bound read-only at their own paths. The DEVICEs (host paths) are
# the container's devices (cgroup rules, and nodes runc creates in a tmpfs /dev). With DEV_DIR non-empty,
# /dev is instead a bind mount of that host directory (filled by the caller): runc then creates no nodes,
# and CRIU treats /dev as an external mount whose source the restoring config.json names.
runc_config() {
	python3 - "$@" <<'PY'
import json, os, sys
bundle, dir, devdir, devs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
root = dir + "/rootfs"
bindir = os.path.realpath(os.environ["RUNC_BINDIR"])
binds = [("/usr", "/usr", "ro"), ("/etc", "/etc", "ro")]
binds += [(p, p, "ro") for p in ("/lib", "/lib64", "/bin", "/sbin") if os.path.isdir(p) and not os.path.islink(p)]
# Mounts below those (e.g. the driver on its own file system) as mounts of their own: runc tells CRIU
# about the bind mounts of config.json only, and CRIU cannot dump a file system it does not know.
tops = [b[0] for b in binds]
with open("/proc/self/mountinfo") as f:
    subs = sorted({l.split()[4] for l in f}, key=len)
binds += [(m, m, "ro") for m in subs if any(m.startswith(t + "/") for t in tops)]
binds += [(p, p, "ro") for p in os.environ.get("RUNC_BINDS", "").split(":") if p]
binds += [(bindir, "/opt/bin", "ro"), (dir + "/state", "/state", "rw")]
devices, allow = [], [{"allow": False, "access": "rwm"}]
if devdir:
    # runc's own nodes (null, zero, ...) are in DEV_DIR too: allowed here, as runc allows them by default.
    allow.append({"allow": True, "type": "c", "major": 1, "access": "rwm"})
for d in devs:
    st = os.stat(d)
    ma, mi = os.major(st.st_rdev), os.minor(st.st_rdev)
    devices.append({"path": d, "type": "c", "major": ma, "minor": mi, "fileMode": 0o666, "uid": 0, "gid": 0})
    allow.append({"allow": True, "type": "c", "major": ma, "minor": mi, "access": "rwm"})
cmd = "exec " + os.environ.get("RUNC_WORKLOAD", "/opt/bin/cuda_memcheck --mb 1024 --state /state/one --interval-ms 100") \
    + " 2>>/state/one.err"
if devdir:
    # runc reopens stdio that is the host's /dev/null inside the container only when it sets up /dev
    # itself: with /dev bind-mounted the process would keep the host's /dev/null, which CRIU cannot find
    # in the container's mounts ("Can't lookup mount=N for fd=0"). Reopen it here, inside.
    cmd = "exec </dev/null >/dev/null 2>>/state/one.err; " + cmd
caps = ["CAP_KILL"]
dev_mount = {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}
if devdir:
    dev_mount = {"destination": "/dev", "type": "bind", "source": devdir, "options": ["bind", "rw", "nosuid"]}
config = {
    "ociVersion": "1.0.2",
    "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": ["/bin/sh", "-c", cmd],
                "env": ["PATH=/usr/bin:/bin"], "cwd": "/",
                "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}], "noNewPrivileges": True},
    "root": {"path": root, "readonly": True},
    "hostname": "cuda-gpu-ct",
    "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        dev_mount,
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
    ] + [{"destination": d, "type": "bind", "source": s, "options": ["bind", o]} for s, d, o in binds],
    "linux": {
        # No network namespace: CRIU would need iptables to lock it, and that machine has none.
        "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
        "devices": devices,
        "resources": {"devices": allow},
        "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
        "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
    },
}
os.makedirs(bundle, exist_ok=True)
with open(bundle + "/config.json", "w") as f:
    json.dump(config, f, indent=1)
print("  runc: devices " + " ".join(devs) + (" in /dev from " + devdir if devdir else "")
      + "; bind mounts " + " ".join(b[1] for b in binds))
PY
}

# The container commands of the runc tests; they use name, dir and runc_bin of the calling test.
rc_() { "$runc_bin" --root "$dir/runc-root" --log "$dir/runc.log" --criu "$dir/criu" "$@"; }
ct_state() { rc_ state "$1" 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['$2'])" 2>/dev/null; }
ct_remove() { rc_ kill "$1" KILL 2>/dev/null; sleep 1; rc_ delete -f "$1" 2>/dev/null; }
ct_cleanup() { local id; for id in $(rc_ list -q 2>/dev/null); do rc_ kill "$id" KILL; rc_ delete -f "$id"; done 2>/dev/null; }
ct_fail() {
	failed "$name" "$1"
	[ -n "${2:-}" ] && show_log "$2"
	tail -n 5 "$dir/runc.log" 2>/dev/null | sed 's/^/  runc.log | /'
	tail -n 5 "$dir/state/one.err" 2>/dev/null | sed 's/^/  one.err | /'
	ct_cleanup
}

# ct_checkpoint ID HOST_PID: runc checkpoint of container ID into $dir/img (CRIU's log in $dir/work-dump), the
# workload gone and the container removed afterwards. Sets dump_s, img_bytes and at_dump; fails the test
# (ct_fail) and returns 1 when a step fails.
ct_checkpoint() {
	local id=$1 host_pid=$2 t0
	t0=$(now)
	rc_ checkpoint --image-path "$dir/img" --work-path "$dir/work-dump" "$id" </dev/null >"$dir/checkpoint.out" 2>&1 ||
		{ ct_fail "runc checkpoint failed: $(tail -n 3 "$dir/checkpoint.out")" "$dir/work-dump/dump.log"; return 1; }
	dump_s=$(since "$t0")
	img_bytes=$(du -sb "$dir/img" | cut -f1)
	wait_gone 30 "$host_pid" || { ct_fail "pid $host_pid still exists after the checkpoint"; return 1; }
	rc_ delete -f "$id" 2>/dev/null
	at_dump=$(state_value "$dir/state/one" iterations)
	echo "  $name: checkpointed in $dump_s s at iteration $at_dump, image $(gib "$img_bytes") GiB, container removed"
	plugin_line "$dir/work-dump/dump.log" dump | sed 's/^/  /'
}

# A real CUDA workload in a runc container (hand-written OCI config: the host's /usr and /etc read-only, the
# NVIDIA device nodes as devices): checkpointed, the container removed, restored from the image under its
# own name, removed, and restored again under a new name; its data checked each time.
test_runc() {
	local name=runc dir=$work/runc runc_bin=$bundle/sbin/runc n devs=()
	[ -x "$runc_bin" ] || { skipped $name "no runc in the bundle"; return; }
	runc_prepare "$dir" || return
	for n in /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia[0-9]*; do [ -c "$n" ] && devs+=("$n"); done
	RUNC_BINDIR=$bundle/bin runc_config "$dir" "$dir" "" "${devs[@]}" || { failed $name "cannot write config.json"; return; }
	"$runc_bin" --version | head -n1 | sed 's/^/  /'

	# The container's stdio is runc's: /dev/null (CRIU cannot restore a file outside the container).
	rc_ run -d --bundle "$dir" ct-gpu </dev/null >/dev/null 2>&1 || { ct_fail "runc run failed (runc.log below)"; return; }
	wait_state "$dir/state/one" 120 1 || { ct_fail "in the container: $why"; return; }
	local host_pid at_dump now gpu t0 id
	host_pid=$(ct_state ct-gpu pid)
	gpu=$(gpu_gib "$host_pid")
	echo "  runc: container ct-gpu, workload host pid $host_pid (pid $(state_value "$dir/state/one" pid) inside), $gpu GiB on the GPU"
	ct_checkpoint ct-gpu "$host_pid" || return
	for id in ct-gpu ct-gpu-new; do
		t0=$(now)
		rc_ restore -d --bundle "$dir" --image-path "$dir/img" --work-path "$dir/work-$id" "$id" </dev/null >/dev/null 2>&1 ||
			{ ct_fail "runc restore as $id failed" "$dir/work-$id/restore.log"; return; }
		restore_s=$(since "$t0")
		[ "$(ct_state "$id" status)" = running ] || { ct_fail "$id is $(ct_state "$id" status) after the restore" "$dir/work-$id/restore.log"; return; }
		advance 60 "$dir/state/one" "$at_dump" || { ct_fail "$id after the restore: $why" "$dir/work-$id/restore.log"; return; }
		now=$(state_value "$dir/state/one" iterations)
		echo "  runc: restored as $id in $restore_s s (host pid $(ct_state "$id" pid)), iterations $at_dump -> $now, data verified"
		plugin_line "$dir/work-$id/restore.log" restore | sed 's/^/  /'
		ct_remove "$id"
		# Blanked, same size (CRIU checks the size of files held open): the next restore must write it.
		head -c 1536 /dev/zero | tr '\0' '\n' >"$dir/state/one"
	done
	ct_cleanup
	passed $name "checkpoint $dump_s s, image $(gib "$img_bytes") GiB; restored as ct-gpu and as ct-gpu-new, data intact"
	rm -rf "$dir/img"
}

# gpu_nodes_of PID: the GPU device nodes (nvidiaN, by minor number) the process holds open, as a list.
gpu_nodes_of() {
	local f t m
	for f in /proc/"$1"/fd/*; do
		read -r t m < <(stat -L -c '%t %T' "$f" 2>/dev/null) || continue
		[ "$t" = c3 ] && [ $((16#$m)) -lt 255 ] && echo "nvidia$((16#$m))"
	done | sort -u | xargs
}

# runc_devdir DIR NODE...: a /dev for a container in the host directory DIR: the character devices runc
# would create (null, zero, full, random, urandom), its links, shm/ for the tmpfs mounted there, and a node
# with the same numbers for each host NODE (/dev/nvidiactl, ...), under the same name.
runc_devdir() {
	local d=$1 n t m; shift
	rm -rf "$d" && mkdir -p "$d/shm" || return 1
	for n in null:3 zero:5 full:7 random:8 urandom:9; do mknod -m 666 "$d/${n%:*}" c 1 "${n#*:}" || return 1; done
	ln -s /proc/self/fd "$d/fd" && ln -s /proc/self/fd/0 "$d/stdin" && ln -s /proc/self/fd/1 "$d/stdout" &&
		ln -s /proc/self/fd/2 "$d/stderr" || return 1
	for n in "$@"; do
		read -r t m < <(stat -c '%t %T' "$n") || return 1
		mknod -m 666 "$d/${n#/dev/}" c $((16#$t)) $((16#$m)) || return 1
	done
}

# A runc container that sees only GPU 0, checkpointed, and restored onto GPU 1 as a new container that sees
# only GPU 1. The container's /dev is a bind mount of a host directory (not runc's tmpfs): CRIU restores a
# tmpfs /dev from the image, with GPU 0's node and without GPU 1's, whatever the restoring config.json says,
# whereas a bind mount is external to CRIU and runc hands it the source named by the restoring config.json.
# So the checkpoint's /dev holds nvidia0 (plus nvidiactl, nvidia-uvm, nvidia-uvm-tools) and the restore's
# holds nvidia1 in its place: the driver, restoring with the GPU pairs, reopens /dev/nvidiaN by the new
# GPU's minor number inside the container, and the process has no use for GPU 0 afterwards, so nvidia0 is
# left out (and denied by the cgroup) to show that nothing still needs it. GPU_TESTS_RUNC_REMAP_KEEP0=1
# keeps nvidia0 there too, to tell a driver that still wants it from other failures.
# The pairs: CUDA_CRIU_DEVICE_MAP=GPU0=GPU1 (UUIDs) in runc's environment, which runc passes to CRIU; with
# GPU_TESTS_RUNC_REMAP=auto no map, so that the plugin pairs GPU 0 with GPU 1 by itself (runc puts CRIU in
# the container's device cgroup: GPU 1 is the only GPU it sees).
test_runc_remap() {
	local name=runc-remap dir=$work/runc-remap runc_bin=$bundle/sbin/runc how=${GPU_TESTS_RUNC_REMAP:-map}
	[ -x "$runc_bin" ] || { skipped $name "no runc in the bundle"; return; }
	with_two_gpus $name || return
	local u0 u1 n common=() devs0 devs1 renv line host_pid at_dump t0 now
	u0=$(gpu_uuid 0); u1=$(gpu_uuid 1)
	for n in /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools; do [ -c "$n" ] && common+=("$n"); done
	[ -c /dev/nvidia0 ] && [ -c /dev/nvidia1 ] || { failed $name "no /dev/nvidia0 or /dev/nvidia1 on this machine"; return; }
	devs0=("${common[@]}" /dev/nvidia0)
	devs1=("${common[@]}" /dev/nvidia1)
	[ -n "${GPU_TESTS_RUNC_REMAP_KEEP0:-}" ] && devs1+=(/dev/nvidia0)
	case "$how" in
	# Only GPU 0's pair: the container's /dev had no nvidia1, so its driver never knew GPU 1 (the dump
	# records no other GPU, and the driver refuses a pair for one the process did not know).
	map) renv="CUDA_CRIU_DEVICE_MAP=$u0=$u1" ;;
	# runc puts CRIU into the container's device cgroup before it restores: CRIU sees GPU 1 only and the
	# plugin pairs GPU 0 of the image with it by itself (CUDA_VISIBLE_DEVICES=1 would hide GPU 1 too).
	auto) renv=CUDA_CRIU_DEVICE_MAP= ;;
	*) failed $name "GPU_TESTS_RUNC_REMAP=$how: want map or auto"; return ;;
	esac
	runc_prepare "$dir" || return
	# The nodes are made under $work: a file system mounted nodev there would make them unusable.
	if findmnt -n -o OPTIONS -T "$dir" | grep -qw nodev; then
		failed $name "$work is on a file system mounted nodev: set GPU_TESTS_WORK to a folder where device nodes work"; return
	fi
	runc_devdir "$dir/dev-gpu0" "${devs0[@]}" || { failed $name "cannot make the device nodes in $dir/dev-gpu0"; return; }
	runc_devdir "$dir/dev-gpu1" "${devs1[@]}" || { failed $name "cannot make the device nodes in $dir/dev-gpu1"; return; }
	RUNC_BINDIR=$bundle/bin runc_config "$dir/gpu0" "$dir" "$dir/dev-gpu0" "${devs0[@]}" &&
		RUNC_BINDIR=$bundle/bin runc_config "$dir/gpu1" "$dir" "$dir/dev-gpu1" "${devs1[@]}" ||
		{ failed $name "cannot write config.json"; return; }
	"$runc_bin" --version | head -n1 | sed 's/^/  /'

	# The process's environment is config.json's: CUDA_VISIBLE_DEVICES is unset, GPU 0 is all it can open.
	rc_ run -d --bundle "$dir/gpu0" ct-gpu0 </dev/null >/dev/null 2>&1 || { ct_fail "runc run failed (runc.log below)"; return; }
	wait_state "$dir/state/one" 120 1 || { ct_fail "in the container: $why"; return; }
	host_pid=$(ct_state ct-gpu0 pid)
	echo "  $name: container ct-gpu0, host pid $host_pid holds $(gpu_nodes_of "$host_pid"), on $(gpus_of "$host_pid") (GPU 0 is $u0)"
	[ "$(gpus_of "$host_pid")" = "$u0" ] || { ct_fail "before the checkpoint the workload is on '$(gpus_of "$host_pid")', not GPU 0 ($u0)"; return; }
	ct_checkpoint ct-gpu0 "$host_pid" || return

	echo "  $name: restoring as ct-gpu1 (/dev with ${devs1[*]}) with $renv"
	t0=$(now)
	# shellcheck disable=SC2163 # renv is NAME=VALUE
	(export "$renv" && rc_ restore -d --bundle "$dir/gpu1" --image-path "$dir/img" --work-path "$dir/work-restore" ct-gpu1) \
		</dev/null >/dev/null 2>&1 ||
		{ ct_fail "runc restore as ct-gpu1 with $renv failed" "$dir/work-restore/restore.log"; return; }
	restore_s=$(since "$t0")
	line=$(plugin_line "$dir/work-restore/restore.log" 'restoring with GPU pairs')
	echo "  ${line:-no 'restoring with GPU pairs' line in restore.log}"
	[ "$(ct_state ct-gpu1 status)" = running ] || { ct_fail "ct-gpu1 is $(ct_state ct-gpu1 status) after the restore" "$dir/work-restore/restore.log"; return; }
	advance 60 "$dir/state/one" "$at_dump" || { ct_fail "ct-gpu1 after the restore: $why" "$dir/work-restore/restore.log"; return; }
	now=$(state_value "$dir/state/one" iterations)
	host_pid=$(ct_state ct-gpu1 pid)
	echo "  $name: restored as ct-gpu1 in $restore_s s, host pid $host_pid holds $(gpu_nodes_of "$host_pid"), iterations $at_dump -> $now, data verified"
	plugin_line "$dir/work-restore/restore.log" restore | sed 's/^/  /'
	nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader 2>&1 | sed 's/^/  nvidia-smi | /'
	if [ -z "$line" ]; then
		ct_fail "the plugin did not restore with GPU pairs (no 'restoring with GPU pairs' line)" "$dir/work-restore/restore.log"; return
	fi
	expect_on $name "$host_pid" 1 || { ct_cleanup; return; }
	ct_cleanup
	passed $name "checkpoint on GPU 0 $dump_s s, image $(gib "$img_bytes") GiB; restored as ct-gpu1 with only /dev/nvidia1 onto GPU 1 ($how) in $restore_s s, data intact"
	rm -rf "$dir/img"
}

dump() {
	local dir=$1 pid=$2; shift 2
	local t0 rc
	mkdir -p "$dir/img"
	t0=$(now)
	timeout -k 10 "$criu_timeout" "${criu_cmd[@]}" dump -t "$pid" -D "$dir/img" -L "$bundle/plugin" -v4 -o "$dir/dump.log" "$@"
	rc=$?
	dump_s=$(since "$t0")
	img_bytes=$(du -sb "$dir/img" | cut -f1)
	[ "$rc" = 124 ] && { why="criu dump did not finish within $criu_timeout s (killed)"; return 1; }
	[ "$rc" = 0 ] || { why="criu dump exited with $rc after $dump_s s"; return 1; }
}

# restore DIR: sets restore_s; why on failure.
restore() {
	local dir=$1 t0 rc
	t0=$(now)
	timeout -k 10 "$criu_timeout" env ${RESTORE_ENV:-} "${criu_cmd[@]}" restore -D "$dir/img" -d -L "$bundle/plugin" -v4 \
		-o "$dir/restore.log"
	rc=$?
	restore_s=$(since "$t0")
	[ "$rc" = 124 ] && { why="criu restore did not finish within $criu_timeout s (killed)"; return 1; }
	[ "$rc" = 0 ] || { why="criu restore exited with $rc after $restore_s s"; return 1; }
}

# dump_restore_test NAME DIR STARTUP_S STATE_FILE...: the workload is already started in DIR; its root pid
# is in the first state file. Dump it, restore it, check that every state file advances.
dump_restore_test() {
	local name=$1 dir=$2 startup=$3; shift 3
	local files=("$@") f root pids gpu gpu_after frozen=() args=()
	for f in "${files[@]}"; do
		wait_state "$f" "$startup" 1 || { failed "$name" "before the dump: $why"; show_workload "$dir"; return; }
	done
	root=$(state_value "${files[0]}" pid)
	mapfile -t pids < <(tree_pids "$root")
	started+=("${pids[@]}")
	gpu=$(gpu_gib "${pids[@]}")
	echo "  $name: ${#pids[@]} process(es) (${pids[*]}), $gpu GiB on the GPU, dumping"

	if ! dump "$dir" "$root"; then
		local left="the tree is gone"
		alive "${pids[@]}" && left="the tree still runs, status=$(state_value "${files[0]}" status)"
		failed "$name" "$why; $left"
		show_log "$dir/dump.log"
		kill_pids "${pids[@]}"
		return
	fi
	wait_gone 30 "${pids[@]}" || { failed "$name" "pids ${pids[*]} still exist 30 s after the dump"; kill_pids "${pids[@]}"; return; }
	for f in "${files[@]}"; do frozen+=("$(state_value "$f" iterations)"); done

	if ! restore "$dir"; then
		failed "$name" "$why (dump $dump_s s, image $(gib "$img_bytes") GiB, GPU $gpu GiB)"
		show_log "$dir/restore.log"
		kill_tree "$root"
		return
	fi
	if ! alive "${pids[@]}"; then
		failed "$name" "criu restore succeeded but not all of ${pids[*]} are alive ($(for p in "${pids[@]}"; do [ -d /proc/$p ] || echo -n "$p gone "; done))"
		show_log "$dir/restore.log"; show_workload "$dir"
		kill_tree "$root"
		return
	fi
	for f in "${!files[@]}"; do args+=("${files[$f]}" "${frozen[$f]}"); done
	if ! advance 60 "${args[@]}"; then
		failed "$name" "after restore: $why (dump $dump_s s, restore $restore_s s)"
		show_log "$dir/restore.log"; show_workload "$dir"
		kill_tree "$root"
		return
	fi
	gpu_after=$(gpu_gib "${pids[@]}")
	passed "$name" "dump $dump_s s, restore $restore_s s, image $(gib "$img_bytes") GiB, GPU $gpu GiB (after restore $gpu_after GiB), iterations $after"
	f=$(plugin_line "$dir/dump.log" dump); echo "  ${f:-no 'cuda_plugin: dump:' line in dump.log}"
	f=$(plugin_line "$dir/restore.log" restore); echo "  ${f:-no 'cuda_plugin: restore:' line in restore.log}"
	[ -n "${KEEP_RUNNING:-}" ] || kill_pids "${pids[@]}"
	rm -rf "$dir/img"
}

test_memcheck_4g() {
	local dir=$work/memcheck-4g
	start "$dir" "$bundle/bin/cuda_memcheck" --mb "$memcheck_mb" --state "$dir/state" --interval-ms 100
	dump_restore_test memcheck-4g "$dir" 120 "$dir/state"
}

test_torch() {
	local dir=$work/torch
	if ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
		skipped torch "$python has no PyTorch with CUDA"
		return
	fi
	start "$dir" "$python" -u "$bundle/torch_workload.py" --gb "$torch_gb" --state "$dir/state" --interval-ms 100
	dump_restore_test torch "$dir" 240 "$dir/state"
}

# The GPU image the plugin writes itself (docs/gpu-image.md), on a real GPU: 1 GiB of data and 2 GiB of
# zeroed device memory. The dump leaves the zeros out; a flipped byte in a data file is refused before the
# driver's restore with nothing left running; the intact copy restores, once written back by the plugin
# (CUDA_CRIU_MAP_IMAGE=off) and once mapped from the plugin's files.
test_gpu_image() {
	local name=gpu-image dir=$work/gpu-image pid pids line f base
	start "$dir" "$bundle/bin/cuda_memcheck" --mb 1024 --zero-mb 2048 --state "$dir/state" --interval-ms 100
	wait_state "$dir/state" 120 1 || { failed $name "before the dump: $why"; show_workload "$dir"; return; }
	pid=$(state_value "$dir/state" pid)
	mapfile -t pids < <(tree_pids "$pid")
	started+=("${pids[@]}")
	dump "$dir" "$pid" || { failed $name "$why"; show_log "$dir/dump.log"; kill_pids "${pids[@]}"; return; }
	wait_gone 30 "${pids[@]}" || { failed $name "pid $pid still exists after the dump"; return; }
	line=$(grep -o 'cuda_plugin: GPU image: .*' "$dir/dump.log" | tail -n1)
	[ -n "$line" ] || { failed $name "no GPU image line in dump.log"; show_log "$dir/dump.log"; return; }
	cp -a "$dir/img" "$dir/pristine"
	f=$(ls -S "$dir/img"/cuda-gpu-[0-9]*.img | head -n1)
	printf '\125' | dd of="$f" bs=1 seek=$((4096 + 777777)) conv=notrunc status=none
	if restore "$dir"; then
		failed $name "a flipped byte in $(basename "$f") restored"; kill_tree "$pid"; return
	fi
	grep -q "fails its checksum" "$dir/restore.log" || { failed $name "the damaged restore does not name the checksum"; show_log "$dir/restore.log"; return; }
	wait_gone 30 "$pid" || { failed $name "pid $pid runs after a refused restore"; kill_tree "$pid"; return; }
	local written mapped
	for mode in off auto; do
		rm -rf "$dir/img"; cp -a "$dir/pristine" "$dir/img"
		base=$(state_value "$dir/state" iterations)
		RESTORE_ENV=CUDA_CRIU_MAP_IMAGE=$mode restore "$dir" || { failed $name "map-image=$mode: $why"; show_log "$dir/restore.log"; return; }
		advance 60 "$dir/state" "$base" || { failed $name "map-image=$mode: after restore: $why"; show_workload "$dir"; kill_tree "$pid"; return; }
		[ $mode = off ] && written=$restore_s || mapped=$restore_s
		kill_tree "$pid"; wait_gone 30 "$pid"
	done
	passed $name "flipped byte refused; restore ${written} s written back, ${mapped} s mapped"
	echo "  ${line#cuda_plugin: }"
	f=$(plugin_line "$dir/restore.log" restore); echo "  ${f:-no restore line}"
	rm -rf "$dir/pristine"
}

test_tree() {
	local dir=$work/tree
	start "$dir" "$bundle/bin/cuda_memcheck" --mb "$tree_mb" --children 1 --plain-children 1 --state "$dir/state"
	# The root writes state, its CUDA child state.0; the plain child writes nothing but must come back too.
	dump_restore_test tree "$dir" 120 "$dir/state" "$dir/state.0"
}

test_leave_running() {
	local name=leave-running dir=$work/leave-running pid pids gpu base line f
	start "$dir" "$bundle/bin/cuda_memcheck" --mb "$leave_mb" --state "$dir/state"
	wait_state "$dir/state" 120 1 || { failed $name "before the dump: $why"; show_workload "$dir"; return; }
	pid=$(state_value "$dir/state" pid)
	mapfile -t pids < <(tree_pids "$pid")
	started+=("${pids[@]}")
	gpu=$(gpu_gib "${pids[@]}")
	if ! dump "$dir" "$pid" -R; then
		failed $name "$why; the workload is $(alive "$pid" && echo alive || echo gone)"
		show_log "$dir/dump.log"; kill_pids "${pids[@]}"
		return
	fi
	alive "$pid" || { failed $name "pid $pid is gone after criu dump -R"; show_log "$dir/dump.log"; show_workload "$dir"; return; }
	base=$(state_value "$dir/state" iterations)
	if ! advance 30 "$dir/state" "$base"; then
		failed $name "after the dump: $why"
		show_log "$dir/dump.log"; show_workload "$dir"; kill_pids "${pids[@]}"
		return
	fi
	line=$(grep -E 'cuda_plugin: .*(back as they were found|returned to|returning [0-9]+ CUDA)' "$dir/dump.log" | tail -n1)
	if [ -z "$line" ]; then
		failed $name "the workload runs on, but cuda_plugin did not log that it returned the processes to their state"
		show_log "$dir/dump.log"; kill_pids "${pids[@]}"
		return
	fi
	passed $name "dump $dump_s s, image $(gib "$img_bytes") GiB, GPU $gpu GiB, iterations $after"
	echo "  ${line#*) }"
	f=$(plugin_line "$dir/dump.log" dump); echo "  ${f:-no 'cuda_plugin: dump:' line in dump.log}"
	kill_pids "${pids[@]}"
	rm -rf "$dir/img"
}

# Managed memory (cuMemAllocManaged): the driver refuses to checkpoint it. The dump must fail within 5 s,
# say why in words, and leave the process running with its data.
test_managed_refused() {
	local name=managed-refused dir=$work/managed-refused pid base line t0 secs
	start "$dir" "$bundle/bin/cuda_memcheck" --mb 256 --managed-mb 4 --state "$dir/state" --interval-ms 100
	wait_state "$dir/state" 120 1 || { failed $name "before the dump: $why"; show_workload "$dir"; return; }
	pid=$(state_value "$dir/state" pid)
	started+=("$pid")
	t0=$(now)
	if dump "$dir" "$pid"; then
		failed $name "criu dump succeeded on a process with managed memory"; kill_pids "$pid"; return
	fi
	secs=$(since "$t0")
	line=$(grep -o 'Error (cuda_plugin):.*managed memory.*' "$dir/dump.log" | head -n1)
	[ -n "$line" ] || { failed $name "no plugin error naming managed memory"; show_log "$dir/dump.log"; kill_pids "$pid"; return; }
	awk -v s="$secs" 'BEGIN { exit !(s <= 5) }' || { failed $name "refused after $secs s (more than 5 s)"; kill_pids "$pid"; return; }
	base=$(state_value "$dir/state" iterations)
	advance 30 "$dir/state" "$base" || { failed $name "after the refused dump: $why"; show_workload "$dir"; kill_pids "$pid"; return; }
	passed $name "dump refused in $secs s, the process runs on and verifies its data, iterations $after"
	echo "  $line"
	kill_pids "$pid"
}

# Progress lines of a large checkpoint and restore (PROGRESS_MB, default 16 GiB).
test_progress_16g() {
	local name=progress-16g dir=$work/progress-16g f
	start "$dir" "$bundle/bin/cuda_memcheck" --mb "${PROGRESS_MB:-16384}" --state "$dir/state" --interval-ms 100
	dump_restore_test $name "$dir" 300 "$dir/state"
	for f in dump restore; do
		if ! grep -qE 'cuda_plugin: (checkpoint|restore): .* [MG]B/s' "$dir/$f.log"; then
			failed $name "no progress line in $f.log"; show_log "$dir/$f.log"; continue
		fi
		grep -oE 'cuda_plugin: (checkpoint|restore): .*' "$dir/$f.log" | sed 's/^/  /'
	done
}

# A workload in a memory cgroup whose limit is below its GPU state: the dump is refused before any lock,
# naming the cgroup; once the limit is raised the same process dumps and restores.
test_cgroup_limit() {
	local name=cgroup-limit dir=$work/cgroup-limit cg pid base line usage limit_file usage_file procs
	if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
		cg=/sys/fs/cgroup/cuda-criu-gpu-test limit_file=memory.max usage_file=memory.current
		grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
	elif [ -d /sys/fs/cgroup/memory ]; then
		cg=/sys/fs/cgroup/memory/cuda-criu-gpu-test limit_file=memory.limit_in_bytes usage_file=memory.usage_in_bytes
	else
		skipped $name "no memory cgroup controller"; return
	fi
	mkdir -p "$cg" && [ -f "$cg/$limit_file" ] || { skipped $name "cannot create a memory cgroup at $cg"; return; }
	mkdir -p "$dir"
	(echo $BASHPID >"$cg/cgroup.procs" && exec setsid -f "$bundle/bin/cuda_memcheck" --mb 2048 --state "$dir/state" \
		--interval-ms 100 >"$dir/stdout" 2>"$dir/stderr" </dev/null)
	wait_state "$dir/state" 120 1 || { failed $name "before the dump: $why"; show_workload "$dir"; return; }
	pid=$(state_value "$dir/state" pid)
	started+=("$pid")
	usage=$(cat "$cg/$usage_file")
	echo $((usage + 512 * 1024 * 1024)) >"$cg/$limit_file"
	if dump "$dir" "$pid"; then
		failed $name "criu dump succeeded with the cgroup limit below the GPU state"; kill_pids "$pid"; rmdir "$cg" 2>/dev/null; return
	fi
	line=$(grep -o 'Error (cuda_plugin):.*not enough memory.*' "$dir/dump.log" | head -n1)
	[ -n "$line" ] || { failed $name "no plugin error about memory"; show_log "$dir/dump.log"; kill_pids "$pid"; return; }
	grep -q 'cuda_plugin: .*lock' "$dir/dump.log" && grep -qE 'pid [0-9]+: running, restore thread' "$dir/dump.log" &&
		{ failed $name "the process was locked before the refusal"; kill_pids "$pid"; return; }
	base=$(state_value "$dir/state" iterations)
	advance 30 "$dir/state" "$base" || { failed $name "after the refused dump: $why"; kill_pids "$pid"; return; }
	echo "  refused: ${line#*): }"
	if [ "$limit_file" = memory.max ]; then echo max >"$cg/$limit_file"; else echo -1 >"$cg/$limit_file"; fi
	rm -rf "$dir/img"
	dump_restore_test $name "$dir" 60 "$dir/state"
	procs=$(cat "$cg/cgroup.procs" 2>/dev/null | xargs)
	[ -z "$procs" ] || kill -9 $procs 2>/dev/null
	sleep 0.5; rmdir "$cg" 2>/dev/null
}

# torch-dataloader / torch-forkpool: a deterministic training loop (torch_fork_train.py) whose data processes
# were forked after CUDA started (DataLoader workers, fork start method; a multiprocessing fork pool). They
# inherit the driver's device files and mappings, which the plugin restores as placeholders. The losses
# logged by a run dumped and restored mid-training must equal, bit for bit, those of an uninterrupted run.
fork_steps=${FORK_STEPS:-400}
test_torch_fork() { # NAME MODE
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
	start "$dir" "${train[@]}" --log "$dir/run.log" --state "$dir/state" --step-delay-ms 25
	wait_state "$dir/state" 240 $((fork_steps / 4)) || { failed $name "before the dump: $why"; show_workload "$dir"; return; }
	root=$(state_value "$dir/state" pid)
	mapfile -t pids < <(tree_pids "$root")
	started+=("${pids[@]}")
	[ ${#pids[@]} -ge 3 ] || { failed $name "expected the trainer and 2 forked workers, found pids ${pids[*]}"; kill_pids "${pids[@]}"; return; }
	if ! dump "$dir" "$root"; then
		failed $name "$why; the tree $(alive "${pids[@]}" && echo still runs || echo is gone)"
		show_log "$dir/dump.log"; kill_pids "${pids[@]}"
		return
	fi
	n=$(state_value "$dir/state" iterations)
	wait_gone 30 "${pids[@]}" || { failed $name "pids ${pids[*]} still exist 30 s after the dump"; kill_pids "${pids[@]}"; return; }
	if ! restore "$dir"; then
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

# Workloads still running in a folder of ours (also those that never wrote their pid).
pids_in() {
	local p cwd
	for p in /proc/[0-9]*; do
		cwd=$(readlink "$p/cwd" 2>/dev/null) || continue
		case "$cwd" in "$1" | "$1"/*) echo "${p#/proc/}" ;; esac
	done
}

cleanup() {
	local p left=()
	for p in "${started[@]}" $(pids_in "$work"); do
		[ "$p" != $$ ] && [ -d "/proc/$p" ] && left+=("$p")
	done
	[ ${#left[@]} -eq 0 ] || kill -9 "${left[@]}" 2>/dev/null
	rm -rf "$work"/*/img
}
trap cleanup EXIT
trap 'exit 130' INT TERM # the EXIT trap kills the workloads

# ---------------------------------------------------------------------------------------------------------
echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) $(hostname) $(uname -r); bundle $bundle"
sed -n 's/^\(built\|source\)=/  bundle \1: /p' "$bundle/bundle-info.txt" 2>/dev/null
[ "$(id -u)" = 0 ] || echo "warning: not root: criu dump/restore will fail"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>/dev/null |
	sed 's/^/  GPU: /' | grep . || echo "  GPU: nvidia-smi does not answer"
"$python" -c 'import torch; print("  torch", torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null || echo "  torch: not importable"
echo "== criu --version"
criu --version 2>&1 | sed 's/^/  /'
echo "== criu check"
criu check >"$work/criu-check.txt" 2>&1
check_rc=$?
sed 's/^/  /' "$work/criu-check.txt" | tail -n 20
echo "  (criu check exit status $check_rc)"

[ $# -gt 0 ] || set -- "${all_tests[@]}"
for t in "$@"; do
	case "$t" in
	memcheck-4g) test_memcheck_4g ;;
	torch) test_torch ;;
	tree) test_tree ;;
	leave-running) test_leave_running ;;
	managed-refused) test_managed_refused ;;
	progress-16g) test_progress_16g ;;
	cgroup-limit) test_cgroup_limit ;;
	remap-self) test_remap_self ;;
	remap-gpu1) test_remap_gpu1 ;;
	tree-2gpu) test_tree_2gpu ;;
	torch-2gpu) test_torch_2gpu ;;
	refuse-map) test_refuse_map ;;
	auto-remap) test_auto_remap ;;
	remap-visible) test_remap_visible ;;
	refuse-free) test_refuse_free ;;
	refuse-driver) test_refuse_driver ;;
	cli-steps) test_cli_steps ;;
	roundtrip-torch) test_roundtrip_torch ;;
	runc) test_runc ;;
	runc-remap) test_runc_remap ;;
	load) test_load ;;
	torch-dataloader) test_torch_fork torch-dataloader dataloader ;;
	torch-forkpool) test_torch_fork torch-forkpool forkpool ;;
	jax | cupy | transformers) test_framework "$t" ;;
	gpu-image) test_gpu_image ;;
	*) failed "$t" "no such test (known: ${all_tests[*]})"; continue ;;
	esac
	mapfile -t left < <(pids_in "$work/$t") # whatever a failed test left running
	kill_pids "${left[@]}"
	rm -rf "$work/$t/img"
done
echo "== $failures test(s) failed"
[ "$failures" = 0 ]
