# Real-GPU tests, one process or one tree dumped and restored (sourced by run-gpu-tests.sh: each test_NAME
# function is the test NAME, with - for _): plain CUDA, PyTorch, a tree, --leave-running, the refusals of
# managed memory and of a memory cgroup too small, progress lines, a stopped process, replicas.

test_memcheck_4g() {
	local dir=$work/memcheck-4g
	start_in "$dir" "$bundle/bin/cuda_memcheck" --mb "$memcheck_mb" --state "$dir/state" --interval-ms 100
	dump_restore_test memcheck-4g "$dir" 120 "$dir/state"
}

test_torch() {
	local dir=$work/torch
	if ! "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
		skipped torch "$python has no PyTorch with CUDA"
		return
	fi
	start_in "$dir" "$python" -u "$bundle/torch_workload.py" --gb "$torch_gb" --state "$dir/state" --interval-ms 100
	dump_restore_test torch "$dir" 240 "$dir/state"
}

test_tree() {
	local dir=$work/tree
	start_in "$dir" "$bundle/bin/cuda_memcheck" --mb "$tree_mb" --children 1 --plain-children 1 --state "$dir/state"
	# The root writes state, its CUDA child state.0; the plain child writes nothing but must come back too.
	dump_restore_test tree "$dir" 120 "$dir/state" "$dir/state.0"
}

test_leave_running() {
	local name=leave-running dir=$work/leave-running pid pids gpu base line f
	start_in "$dir" "$bundle/bin/cuda_memcheck" --mb "$leave_mb" --state "$dir/state"
	wait_state "$dir/state" 120 1 || { failed $name "before the dump: $why"; show_workload "$dir"; return; }
	pid=$(state_value "$dir/state" pid)
	mapfile -t pids < <(tree_pids "$pid")
	started+=("${pids[@]}")
	gpu=$(gpu_gib "${pids[@]}")
	if ! criu_dump "$dir" "$pid" -R; then
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
	start_in "$dir" "$bundle/bin/cuda_memcheck" --mb 256 --managed-mb 4 --state "$dir/state" --interval-ms 100
	wait_state "$dir/state" 120 1 || { failed $name "before the dump: $why"; show_workload "$dir"; return; }
	pid=$(state_value "$dir/state" pid)
	started+=("$pid")
	t0=$(now)
	if criu_dump "$dir" "$pid"; then
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
	start_in "$dir" "$bundle/bin/cuda_memcheck" --mb "${PROGRESS_MB:-16384}" --state "$dir/state" --interval-ms 100
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
	local name=cgroup-limit dir=$work/cgroup-limit cg pid line usage limit_file usage_file procs
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
	dump_refused_for_memory "$dir" "$pid" 30 ||
		{ failed $name "with the cgroup limit below the GPU state: $why"; kill_pids "$pid"; rmdir "$cg" 2>/dev/null; return; }
	echo "  refused: ${line#*): }"
	if [ "$limit_file" = memory.max ]; then echo max >"$cg/$limit_file"; else echo -1 >"$cg/$limit_file"; fi
	rm -rf "$dir/img"
	dump_restore_test $name "$dir" 60 "$dir/state"
	procs=$(cat "$cg/cgroup.procs" 2>/dev/null | xargs)
	[ -z "$procs" ] || kill -9 $procs 2>/dev/null
	sleep 0.5; rmdir "$cg" 2>/dev/null
}

is_stopped_pid() { [ "$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null)" = T ]; }

# A stopped CUDA process is refused at once, named, and stays stopped; then a dump and a restore with
# --leave-stopped: CRIU queues SIGSTOP before the device hook, the GPU state comes back all the same, the
# process is left stopped and goes on with its data at SIGCONT.
test_stopped() {
	local name=stopped dir=$work/stopped pid base t0 i
	start_in "$dir" "$bundle/bin/cuda_memcheck" --mb 256 --state "$dir/state" --interval-ms 100
	wait_state "$dir/state" 120 1 || { failed $name "before the dump: $why"; show_workload "$dir"; return; }
	pid=$(state_value "$dir/state" pid)
	started+=("$pid")
	kill -STOP "$pid"
	t0=$(now)
	if criu_dump "$dir" "$pid"; then failed $name "the dump of a stopped CUDA process succeeded"; kill_pids "$pid"; return; fi
	grep -q "pid $pid is stopped (SIGSTOP or a terminal stop)" "$dir/dump.log" ||
		{ failed $name "refused without saying the process is stopped: $why"; show_log "$dir/dump.log"; kill_pids "$pid"; return; }
	is_stopped_pid "$pid" || { failed $name "pid $pid is no longer stopped after the refusal"; kill_pids "$pid"; return; }
	echo "  stopped process refused in $(since "$t0") s"
	kill -CONT "$pid"
	rm -rf "$dir/img"
	criu_dump "$dir" "$pid" || { failed $name "dump: $why"; show_log "$dir/dump.log"; kill_pids "$pid"; return; }
	gone_within 30 "$pid" || { failed $name "pid $pid still exists after the dump"; kill_pids "$pid"; return; }
	base=$(state_value "$dir/state" iterations)
	criu_restore "$dir" --leave-stopped || { failed $name "restore --leave-stopped: $why"; show_log "$dir/restore.log"; kill_pids "$pid"; return; }
	for i in $(seq 50); do is_stopped_pid "$pid" && break; sleep 0.1; done
	is_stopped_pid "$pid" || { failed $name "pid $pid not stopped after restore --leave-stopped"; kill_pids "$pid"; return; }
	kill -CONT "$pid"
	advance 30 "$dir/state" "$base" || { failed $name "after SIGCONT: $why"; show_workload "$dir"; kill_pids "$pid"; return; }
	local restored_after=$after
	# criu dump --leave-stopped: the GPU state returned, the process left stopped, on again at SIGCONT.
	rm -rf "$dir/img"
	criu_dump "$dir" "$pid" --leave-stopped || { failed $name "dump --leave-stopped: $why"; show_log "$dir/dump.log"; kill_pids "$pid"; return; }
	is_stopped_pid "$pid" || { failed $name "pid $pid not stopped after dump --leave-stopped"; kill_pids "$pid"; return; }
	base=$(state_value "$dir/state" iterations)
	kill -CONT "$pid"
	advance 30 "$dir/state" "$base" || { failed $name "after dump --leave-stopped and SIGCONT: $why"; kill_pids "$pid"; return; }
	passed $name "a stopped process refused at once; restore --leave-stopped in $restore_s s, stopped, then on with its data (iterations $restored_after); dump --leave-stopped in $dump_s s, stopped, then on (iterations $after)"
	kill_pids "$pid"
	rm -rf "$dir/img"
}

# ns_dumped NAME DIR STARTUP_S CMD...: CMD started in DIR by ns_exec (pid 1 of its own pid, mount and network
# namespaces, with its own /proc; its state file DIR/state), then dumped into DIR/img with ns_criu_opts; sets
# pid, mib (its GPU memory, MiB, before the dump), base (its iterations when dumped) and restore_opts. Fails
# the test NAME and returns 1 when a step fails.
ns_dumped() {
	local name=$1 dir=$2 startup=$3 p dump_opts
	shift 3
	mkdir -p "$dir"
	(cd "$dir" && ns_exec "$@" </dev/null >/dev/null 2>&1 &)
	wait_state "$dir/state" "$startup" 1 || { failed "$name" "before the dump: $why"; show_workload "$dir"; return 1; }
	pid=$(for p in $(pids_in "$dir"); do grep -q "^NSpid:.*[[:space:]]1$" "/proc/$p/status" && echo "$p"; done)
	[ -n "$pid" ] || { failed "$name" "no workload that is pid 1 of its pid namespace"; return 1; }
	started+=("$pid")
	mib=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', *' -v p="$pid" '$1 == p { print $2 }')
	ns_criu_opts "$pid" "$dir"
	mapfile -t dump_opts <"$dir/dump.opts"
	mapfile -t restore_opts <"$dir/restore.opts"
	criu_dump "$dir" "$pid" "${dump_opts[@]}" || { failed "$name" "dump: $why"; show_log "$dir/dump.log"; kill_pids "$pid"; return 1; }
	gone_within 30 "$pid" || { failed "$name" "pid $pid still exists after the dump"; kill_pids "$pid"; return 1; }
	base=$(state_value "$dir/state" iterations)
}

# ns_restores DIR N: N restores of DIR/img at once, in the background, each in new namespaces (restore_opts),
# logs DIR/restore-I.log; their pids in restores.
ns_restores() {
	local dir=$1 i
	restores=()
	for i in $(seq "$2"); do
		timeout -k 10 "$criu_timeout" "${criu_cmd[@]}" restore -D "$dir/img" -d -L "$bundle/plugin" -v4 \
			-o "$dir/restore-$i.log" "${restore_opts[@]}" </dev/null >/dev/null 2>&1 &
		restores+=($!)
	done
}

# One image, several replicas with plain CRIU: a CUDA process that is pid 1 of its own pid, mount and network
# namespaces, with its own /proc (ns_exec, common.sh: as in a container), is dumped, then its image restored
# three times at once, each restore in new namespaces (ns_criu_opts: the driver's mounts and the others it
# inherited external, --empty-ns net), as container runtimes start replicas of one checkpoint. Each replica must be its own CUDA process, running, with its
# own device memory; they share the state file the image names, and each verifies its device data at every
# iteration (a mismatch writes status=FAIL and ends it), so all alive and the file advancing with status=ok
# is all of them verified.
test_replicas() {
	local name=replicas dir=$work/replicas n=3 pid mib p i t0 base failed_restores="" gpu
	local -a restores=() replicas=() restore_opts=()
	ns_dumped $name "$dir" 120 "$bundle/bin/cuda_memcheck" --mb 1024 --state "$dir/state" --interval-ms 100 || return
	t0=$(now)
	ns_restores "$dir" $n
	for i in $(seq $n); do
		wait "${restores[$((i - 1))]}" || failed_restores+=" $i (exit $?)"
	done
	local restored_s
	restored_s=$(since "$t0")
	mapfile -t replicas < <(pids_in "$dir")
	started+=("${replicas[@]}")
	if [ -n "$failed_restores" ]; then
		failed $name "$n restores at once from one image: replica(s)$failed_restores failed; ${#replicas[@]} running"
		for i in $(seq $n); do show_log "$dir/restore-$i.log"; done
		kill_pids "${replicas[@]}"
		return
	fi
	[ ${#replicas[@]} -eq $n ] || { failed $name "${#replicas[@]} replicas run, expected $n"; kill_pids "${replicas[@]}"; return; }
	[ "$(for p in "${replicas[@]}"; do readlink "/proc/$p/ns/pid" "/proc/$p/ns/mnt" "/proc/$p/ns/net"; done | sort -u | wc -l)" -eq $((3 * n)) ] ||
		{ failed $name "the replicas share namespaces"; kill_pids "${replicas[@]}"; return; }
	for p in "${replicas[@]}"; do
		[ "$(cli status "$p" 2>&1 | awk '{print $2}')" = running ] ||
			{ failed $name "replica $p: $(cli status "$p" 2>&1)"; kill_pids "${replicas[@]}"; return; }
	done
	advance 30 "$dir/state" "$base" || { failed $name "after the restores: $why"; kill_pids "${replicas[@]}"; return; }
	for p in "${replicas[@]}"; do
		[ -d "/proc/$p" ] || { failed $name "replica $p ended (state: $(state_value "$dir/state" status))"; kill_pids "${replicas[@]}"; return; }
	done
	gpu=$(gpu_gib "${replicas[@]}")
	passed $name "$n restores at once from one image in $restored_s s; $n CUDA processes, each pid 1 of its own pid, mount and network namespaces, running, data verified (iterations $after), $gpu GiB on the GPU together"
	kill_pids "${replicas[@]}"
	rm -rf "$dir/img"
}

# Replicas that no longer fit: a CUDA process of REPLICAS_FIT_GB (24, about what the serve scenario holds)
# GiB on the GPU (cuda_memcheck: 1 GiB of data, the rest zeros), pid 1 of its own namespaces as in
# test_replicas, is dumped; its image is then restored at once one time more than the GPU's free memory
# holds by its size. Every restore that does not fit must be refused by the plugin before any driver call,
# naming the GPU (the restores in progress reserve their GPU state in a ledger every CRIU on the machine
# reads); those that fit run on, each verifying its device data.
test_replicas_fit() {
	local name=replicas-fit dir=$work/replicas-fit gb=${REPLICAS_FIT_GB:-24} pid p i t0 base mib free_mib n fit
	local ok=0 refused=0 other="" why="" restored_s
	local -a restores=() replicas=() restore_opts=()
	ns_dumped $name "$dir" 180 "$bundle/bin/cuda_memcheck" --mb 1024 --zero-mb $((gb * 1024 - 1024)) --state "$dir/state" \
		--interval-ms 100 || return
	free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i 0)
	[ -n "$mib" ] && [ "$mib" -gt 0 ] || { failed $name "nvidia-smi shows no GPU memory for pid $pid"; return; }
	fit=$((free_mib / mib)) n=$((free_mib / mib + 1))
	echo "  $name: $mib MiB on the GPU per replica (image $(gib "$img_bytes") GiB, dump $dump_s s), $free_mib MiB free: $fit should fit; $n restores at once"
	t0=$(now)
	ns_restores "$dir" $n
	for i in $(seq $n); do
		if wait "${restores[$((i - 1))]}"; then
			ok=$((ok + 1))
		elif grep -q "Error (cuda_plugin): .*cannot restore the image's GPU state on this machine" "$dir/restore-$i.log"; then
			refused=$((refused + 1))
			why=$(grep -o -m1 "Error (cuda_plugin): .*" "$dir/restore-$i.log" | cut -c1-400)
		else
			other+=" $i"
		fi
	done
	restored_s=$(since "$t0")
	mapfile -t replicas < <(pids_in "$dir")
	started+=("${replicas[@]}")
	echo "  $name: $ok restored, $refused refused in $restored_s s${why:+; refused: $why}"
	if [ -n "$other" ]; then
		failed $name "restore(s)$other failed other than by the plugin's refusal"
		for i in $other; do show_log "$dir/restore-$i.log"; done
		kill_pids "${replicas[@]}"; return
	fi
	[ "$refused" -ge 1 ] || { failed $name "all $n restores fit: $ok of $mib MiB in $free_mib MiB free"; kill_pids "${replicas[@]}"; return; }
	[ ${#replicas[@]} -eq "$ok" ] || { failed $name "${#replicas[@]} replicas run, $ok restores succeeded"; kill_pids "${replicas[@]}"; return; }
	advance 60 "$dir/state" "$base" || { failed $name "after the restores: $why"; kill_pids "${replicas[@]}"; return; }
	for p in "${replicas[@]}"; do
		[ -d "/proc/$p" ] || { failed $name "replica $p ended (state: $(state_value "$dir/state" status))"; kill_pids "${replicas[@]}"; return; }
	done
	passed $name "$ok of $n restores at once of a $mib MiB process fit in $free_mib MiB ($restored_s s), running with their data\
 verified (iterations $after), $(gpu_gib "${replicas[@]}") GiB on the GPU; $refused refused by the plugin by name"
	kill_pids "${replicas[@]}"
	rm -rf "$dir/img"
}
