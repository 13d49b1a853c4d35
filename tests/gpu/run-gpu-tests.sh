#!/usr/bin/env bash
# Checkpoint/restore tests on a real NVIDIA GPU, run from the root of the bundle that scripts/gpu-bundle.sh
# builds (CRIU, its libraries, the plugin, the workloads):
#
#   bash build/gpu-bundle/run-gpu-tests.sh [TEST...]      (as root; default: all tests)
#   bash build/gpu-bundle/run-gpu-tests.sh --list | --help  (the test names | this text; touch nothing)
#
# Tests: --list names them (those for 2 GPUs skip on one). The test NAME is the function test_NAME (with _
# for -) of a group file NN-GROUP.sh next to this script (lib.sh holds their helpers); all run in file and
# then definition order. Each prints one line, "PASS name (figures)", "FAIL name: why" or "SKIP name: why"; the exit status is 1 when any test failed. Only criu runs with the bundle's lib/ in
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
#   SERVER_MB, LLM_KV_MB  server-tcp's device memory (1024 MiB) and llm-server-tcp's KV-cache arena (2048 MiB)
#   GPU_TESTS_ANSWER_S  seconds a server test waits for one answer (120)
#   GPU_TESTS_RUNC_REMAP  how runc-remap pairs the GPUs: map (CUDA_CRIU_DEVICE_MAP, default) or auto (no map)
#   GPU_TESTS_JAX_GPUS  CUDA_VISIBLE_DEVICES of the jax test's workload (default 0; all: every GPU)
#   GPU_TESTS_RUNC_REMAP_KEEP0  if set, runc-remap's restored container keeps /dev/nvidia0 beside nvidia1
#   GPU_TESTS_RUNC_WORKLOAD  what runc and runc-remap run in the container: memcheck (cuda_memcheck on 1 GiB,
#                    default) or torch (torch_workload.py on 2 GiB, with the host's python and PyTorch)
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bundle=$here
# The helpers shared with the other shell tests: next to this script in the bundle, in tests/lib/ in the
# source tree.
for common in "$here/common.sh" "$here/../lib/common.sh" ""; do [ -f "$common" ] && break; done
[ -n "$common" ] || { echo "no common.sh next to $0 nor in $here/../lib: rebuild the bundle (scripts/gpu-bundle.sh)" >&2; exit 2; }
source "$common"
source "$here/lib.sh"
test_files=("$here"/[0-9][0-9]-*.sh)
for f in "${test_files[@]}"; do source "$f"; done
mapfile -t all_tests < <(sed -n 's/^test_\([a-z0-9_]*\)() {.*/\1/p' "${test_files[@]}" | tr _ -)
work=${GPU_TESTS_WORK:-/var/tmp/cuda-criu-gpu-tests}
python=${GPU_TESTS_PYTHON:-python3}
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

on_exit kill_workloads
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
	if [[ " ${all_tests[*]} " != *" $t "* ]]; then
		failed "$t" "no such test (known: ${all_tests[*]})"
		continue
	fi
	"test_${t//-/_}"
	mapfile -t left < <(pids_in "$work/$t") # whatever a failed test left running
	kill_pids "${left[@]}"
	rm -rf "$work/$t/img"
done
echo "== $failures test(s) failed"
[ "$failures" = 0 ]
