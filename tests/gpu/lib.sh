# The helpers of the real-GPU tests (tests/gpu/run-gpu-tests.sh, which sources this file after
# tests/lib/common.sh; both lie next to it in the GPU bundle). A test goes on after another fails: these
# helpers say why a step failed in $why and return 1, and a test reports with passed, failed or skipped,
# never with fail. Uses bundle, work, python and criu_timeout of the runner.

failures=0
started=() # every workload pid we saw, killed on exit

criu_cmd=(env -u LD_LIBRARY_PATH "$bundle/sbin/criu") # as users run it: the bundle finds its own libraries
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

# gone_within TIMEOUT_S PID...: every PID gone within TIMEOUT_S (a restore needs the pids free again).
gone_within() {
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
	gone_within 20 "$@" || echo "  warning: pids $* still exist after SIGKILL"
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

# start_in DIR CMD...: the workload in its own session, not a child of this shell, stdio to files.
start_in() {
	local dir=$1; shift
	mkdir -p "$dir"
	(cd "$dir" && exec setsid -f "$@" >"$dir/stdout" 2>"$dir/stderr" </dev/null)
}

cli() { env -u LD_LIBRARY_PATH "$bundle/bin/cuda-criu" "$@"; }

# criu_dump DIR PID [criu options...]: CRIU dumps PID into DIR/img (its log DIR/dump.log); sets dump_s,
# img_bytes; why on failure.
criu_dump() {
	local dir=$1 pid=$2; shift 2
	local t0 rc
	mkdir -p "$dir/img"
	t0=$(now)
	# shellcheck disable=SC2086 # DUMP_OPTS: words for CRIU's command line
	timeout -k 10 "$criu_timeout" "${criu_cmd[@]}" dump -t "$pid" -D "$dir/img" -L "$bundle/plugin" -v4 -o "$dir/dump.log" \
		${DUMP_OPTS:-} "$@"
	rc=$?
	dump_s=$(since "$t0")
	img_bytes=$(du -sb "$dir/img" | cut -f1)
	[ "$rc" = 124 ] && { why="criu dump did not finish within $criu_timeout s (killed)"; return 1; }
	[ "$rc" = 0 ] || { why="criu dump exited with $rc after $dump_s s"; return 1; }
}

# criu_restore DIR [criu options...]: CRIU restores DIR/img (its log DIR/restore.log, RESTORE_ENV its
# environment); sets restore_s; why on failure.
criu_restore() {
	local dir=$1 t0 rc
	shift
	t0=$(now)
	# shellcheck disable=SC2086 # RESTORE_OPTS: words for CRIU's command line
	timeout -k 10 "$criu_timeout" env ${RESTORE_ENV:-} "${criu_cmd[@]}" restore -D "$dir/img" -d -L "$bundle/plugin" -v4 \
		-o "$dir/restore.log" ${RESTORE_OPTS:-} "$@"
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

	if ! criu_dump "$dir" "$root"; then
		local left="the tree is gone"
		alive "${pids[@]}" && left="the tree still runs, status=$(state_value "${files[0]}" status)"
		failed "$name" "$why; $left"
		show_log "$dir/dump.log"
		kill_pids "${pids[@]}"
		return
	fi
	gone_within 30 "${pids[@]}" || { failed "$name" "pids ${pids[*]} still exist 30 s after the dump"; kill_pids "${pids[@]}"; return; }
	for f in "${files[@]}"; do frozen+=("$(state_value "$f" iterations)"); done

	if ! criu_restore "$dir"; then
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

# dumped NAME DIR MB: cuda_memcheck with MB MiB started in DIR, dumped, and gone; sets pid, and base (its
# iterations when dumped). Fails the test NAME, returning 1, when a step fails.
dumped() {
	local name=$1 dir=$2 mb=$3
	start_in "$dir" "$bundle/bin/cuda_memcheck" --mb "$mb" --state "$dir/state" --interval-ms 100
	wait_state "$dir/state" 120 1 || { failed "$name" "before the dump: $why"; return 1; }
	pid=$(state_value "$dir/state" pid)
	started+=("$pid")
	criu_dump "$dir" "$pid" || { failed "$name" "$why"; show_log "$dir/dump.log"; return 1; }
	gone_within 30 "$pid" || { failed "$name" "pid $pid still exists after the dump"; return 1; }
	base=$(state_value "$dir/state" iterations)
}

# The UUIDs of the GPUs the given pids hold, as nvidia-smi sees them.
gpu_uuids_of() {
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
	local got want; got=$(gpu_uuids_of "$2"); want=$(gpu_uuid "$3")
	if [ "$got" != "$want" ]; then
		failed "$1" "pid $2 is on '$got' after the restore, expected GPU $3 ($want)"
		return 1
	fi
	echo "  pid $2 runs on GPU $3 ($want) after the restore"
}

# Workloads still running in a folder of ours (also those that never wrote their pid).
pids_in() {
	local p cwd
	for p in /proc/[0-9]*; do
		cwd=$(readlink "$p/cwd" 2>/dev/null) || continue
		case "$cwd" in "$1" | "$1"/*) echo "${p#/proc/}" ;; esac
	done
}

# kill_workloads: at exit (on_exit), whatever the tests started.
kill_workloads() {
	local p left=()
	for p in "${started[@]}" $(pids_in "$work"); do
		[ "$p" != $$ ] && [ -d "/proc/$p" ] && left+=("$p")
	done
	[ ${#left[@]} -eq 0 ] || kill -9 "${left[@]}" 2>/dev/null
	rm -rf "$work"/*/img
}

# dump_refused_for_memory DIR PID ADVANCE_S: criu dump of PID must fail with the plugin's memory
# preflight error before any lock, and the process must run on verified (ADVANCE_S to do an iteration);
# the error in line. Sets why and returns 1 otherwise (PID left to the caller).
dump_refused_for_memory() {
	local dir=$1 pid=$2 base
	if criu_dump "$dir" "$pid"; then why="criu dump succeeded"; return 1; fi
	line=$(grep -o 'Error (cuda_plugin):.*not enough memory.*' "$dir/dump.log" | head -n1)
	[ -n "$line" ] || { why="no plugin error about memory"; show_log "$dir/dump.log"; return 1; }
	grep -q 'cuda_plugin: .*lock' "$dir/dump.log" && grep -qE 'pid [0-9]+: running, restore thread' "$dir/dump.log" &&
		{ why="the process was locked before the refusal"; return 1; }
	base=$(state_value "$dir/state" iterations)
	advance "$3" "$dir/state" "$base" || { why="after the refused dump: $why"; return 1; }
}
