#!/usr/bin/env bash
# Sets everything up and runs the main job: a CUDA workload that checks its GPU memory every iteration is
# dumped with CRIU and our plugin, killed, restored, and seen carrying on with its data intact.
# On a machine with an NVIDIA GPU it runs on the GPU; elsewhere on the fake GPU the tests use.
#   scripts/demo.sh [MiB of GPU memory, default 256]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
mb=${1:-256}

scripts/setup.sh

b=$top/build
criu=$b/criu/4.2.1/install/sbin/criu
work=$(mktemp -d /tmp/cuda-criu-demo.XXXXXX)
pid="" daemon=""
cleanup() {
	set +e
	[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
	[ -n "$daemon" ] && kill "$daemon" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
say() { printf '\n== %s\n' "$*"; }
value() { sed -n "s/^$2=//p" "$1"; }
wait_until() { # SECONDS CMD...
	local end=$((SECONDS + $1)); shift
	until "$@" 2>/dev/null; do [ $SECONDS -lt $end ] || { echo "timed out: $*" >&2; exit 1; }; sleep 0.1; done
}

if [ -n "$(ls /proc/driver/nvidia/gpus 2>/dev/null)" ]; then
	say "NVIDIA GPU found: the workload runs on it"
	run_env=()
else
	say "no NVIDIA GPU here: the workload runs on the fake GPU (tests/fakegpu)"
	export FAKEGPU_DIR=$work/fakegpu CUDA_CRIU_LIBCUDA=$b/tests/fakegpu/libcuda.so.1
	mkdir -p "$FAKEGPU_DIR"
	setsid "$b/tests/fakegpu/fakegpu-daemon" --dir "$FAKEGPU_DIR" </dev/null >"$work/daemon.log" 2>&1 &
	daemon=$!
	wait_until 10 test -S "$FAKEGPU_DIR/daemon.sock"
	run_env=(env LD_LIBRARY_PATH="$b/tests/fakegpu")
fi

say "start: cuda_memcheck with $mb MiB of device memory"
setsid "${run_env[@]}" "$b/tests/workloads/cuda_memcheck" --mb "$mb" --state "$work/state" --interval-ms 50 \
	</dev/null >"$work/workload.out" 2>&1 &
disown
wait_until 120 test -f "$work/state"
pid=$(value "$work/state" pid)
sleep 1
echo "pid $pid, iterations so far: $(value "$work/state" iterations)"

say "criu dump -t $pid (plugin: build/plugin/cuda_plugin.so)"
mkdir -p "$work/img"
t0=$(date +%s.%N)
"$criu" dump -t "$pid" -D "$work/img" -L "$b/plugin" -v4 -o dump.log 2>/dev/null ||
	{ grep -E "Error|cuda_plugin" "$work/img/dump.log" | tail -20; exit 1; }
t1=$(date +%s.%N)
grep "cuda_plugin: dump:" "$work/img/dump.log" | sed 's/^([0-9. ]*) //'
printf 'dump took %.2f s; image: %s\n' "$(awk "BEGIN {print $t1 - $t0}")" "$(du -sh "$work/img" | cut -f1)"
at_dump=$(value "$work/state" iterations)
wait_until 30 sh -c "! [ -e /proc/$pid ]"
"$b/bin/cuda-criu" inspect "$work/img"

say "criu restore"
t0=$(date +%s.%N)
"$criu" restore -D "$work/img" -d -L "$b/plugin" -v4 -o restore.log 2>/dev/null ||
	{ grep -E "Error|cuda_plugin" "$work/img/restore.log" | tail -20; exit 1; }
t1=$(date +%s.%N)
grep "cuda_plugin: restore:" "$work/img/restore.log" | sed 's/^([0-9. ]*) //'
printf 'restore took %.2f s\n' "$(awk "BEGIN {print $t1 - $t0}")"

say "after the restore"
wait_until 60 sh -c "[ \$(sed -n 's/^iterations=//p' $work/state) -gt $((at_dump + 2)) ]"
[ "$(value "$work/state" status)" = ok ] || { cat "$work/state"; exit 1; }
echo "pid $pid is running again: iterations $at_dump at the dump, now $(value "$work/state" iterations); every" \
	"iteration verified all $mb MiB of device memory: status=$(value "$work/state" status)"
say "demo passed"
