# Real-GPU tests of cuda-criu (sourced by run-gpu-tests.sh: each test_NAME function is the test NAME, with
# - for _): the driver steps by hand and inspect, roundtrip against PyTorch.

# cuda-criu on a real GPU: each driver step by hand (lock, checkpoint, restore, unlock), the state after
# each, the GPU memory freed while checkpointed; then `inspect` (text and JSON) of a CRIU image.
test_cli_steps() {
	local name=cli-steps dir=$work/cli-steps pid st gpu step
	start_in "$dir" "$bundle/bin/cuda_memcheck" --mb 1024 --state "$dir/state" --interval-ms 100
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
	criu_dump "$dir" "$pid" || { failed $name "$why"; show_log "$dir/dump.log"; kill_pids "$pid"; return; }
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
	# No --criu, --libdir nor LD_LIBRARY_PATH: the bundle's cuda-criu finds its criu and plugin, as users run it.
	local common=(--require-cuda --health-cmd "$health" --start-timeout 240)
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
