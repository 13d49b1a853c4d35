# Real-GPU tests of servers that keep their clients across a checkpoint (sourced by run-gpu-tests.sh:
# test_server_tcp is the test server-tcp, test_llm_server_tcp llm-server-tcp). CRIU's --tcp-established
# dumps the established connections and keeps them locked (iptables, else CRIU's nftables lock) from the
# dump to the end of the restore; the clients are this shell's, outside the dumped tree. A request sent
# while the server is dumped is answered after the restore, as TCP retransmits it; every answer after the
# restore must equal the one before.

# serve_lock_options: CRIU's network-lock options for this machine in serve_lock (none: iptables); why and
# 1 when it has neither iptables nor CRIU's nftables lock.
serve_lock_options() {
	serve_lock=()
	command -v iptables >/dev/null && return 0
	if criu check --feature network_lock_nftables >/dev/null 2>&1; then
		serve_lock=(--network-lock nftables)
		return 0
	fi
	why="CRIU's network lock needs iptables (apt-get install iptables) or CRIU built with nftables"
	return 1
}

serve_free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# serve_first_answer PORT REQUEST STATE TIMEOUT_S: until a new connection to PORT answers REQUEST (the answer
# in answer); why and 1 when TIMEOUT_S pass first or STATE says the workload failed.
serve_first_answer() {
	local port=$1 req=$2 state=$3 deadline=$(($(date +%s) + $4)) st
	while [ "$(date +%s)" -lt "$deadline" ]; do
		answer=$( (exec 5<>"/dev/tcp/127.0.0.1/$port" && printf '%s\n' "$req" >&5 && read -r -t 600 a <&5 &&
			printf '%s' "$a") 2>/dev/null) && [ -n "$answer" ] && return 0
		st=$(state_value "$state" status)
		[ -z "$st" ] || [ "$st" = ok ] || { why="$(basename "$state") says status=$st"; return 1; }
		sleep 0.05
	done
	why="no answer to '$req' on 127.0.0.1:$port within $4 s"
	return 1
}

# serve_ask FD REQUEST: REQUEST's one-line answer on connection FD in answer (GPU_TESTS_ANSWER_S, default
# 120 s, at most); why and 1 on no answer or an error answer.
serve_ask() {
	{ printf '%s\n' "$2" >&"$1"; } 2>/dev/null || { why="cannot send '$2' on fd $1"; return 1; }
	read -r -t "${GPU_TESTS_ANSWER_S:-120}" answer <&"$1" || { why="no answer to '$2' on fd $1 (read exit status $?)"; return 1; }
	[[ "$answer" != error* ]] || { why="'$2' answered '$answer'"; return 1; }
}

# serve_roundtrip DIR PORT STATE REQUEST...: the server started in DIR (its pid in STATE) keeps two client
# connections across criu dump and restore --tcp-established. REQUEST... are asked on both before; the
# first is sent again while the server is dumped; its answer, and all of them again on both connections
# after the restore, must equal those before. Sets dump_s, restore_s, first_s (restore start to the answer
# in flight), served (that answer) and after (iterations); why and 1 on failure (the server then killed).
serve_roundtrip() {
	local c1 c2 rc
	exec {c1}<>"/dev/tcp/127.0.0.1/$2" 2>/dev/null || { why="cannot connect to 127.0.0.1:$2"; return 1; }
	if ! exec {c2}<>"/dev/tcp/127.0.0.1/$2" 2>/dev/null; then
		exec {c1}>&-
		why="cannot open a second connection to 127.0.0.1:$2"
		return 1
	fi
	serve_roundtrip_on "$c1" "$c2" "$@"
	rc=$?
	exec {c1}>&- {c2}>&-
	[ $rc = 0 ] || kill_tree "$(state_value "$5" pid)"
	return $rc
}

serve_roundtrip_on() {
	local c1=$1 c2=$2 dir=$3 port=$4 state=$5
	shift 5
	local reqs=("$@") before=() i fd pid base t1 rc line
	for i in "${!reqs[@]}"; do
		serve_ask "$c1" "${reqs[$i]}" || return 1
		before[i]=$answer
		serve_ask "$c2" "${reqs[$i]}" || return 1
		[ "$answer" = "${before[i]}" ] || { why="the connections disagree on '${reqs[$i]}': '${before[i]}', '$answer'"; return 1; }
	done
	pid=$(state_value "$state" pid)
	started+=("$pid")
	# CRIU gets neither client connection: they are this shell's.
	criu_dump "$dir" "$pid" --tcp-established "${serve_lock[@]}" {c1}>&- {c2}>&- || { show_log "$dir/dump.log"; return 1; }
	gone_within 30 "$pid" || { why="pid $pid still exists after the dump"; return 1; }
	grep -q "Dumping TCP connection" "$dir/dump.log" || { why="dump.log shows no TCP connection dumped"; return 1; }
	line=$(plugin_line "$dir/dump.log" dump)
	[[ "$line" == "cuda_plugin: dump: 1 CUDA process(es)"* ]] || { why="dump summary: '${line:-none}'"; return 1; }
	base=$(state_value "$state" iterations)

	printf '%s\n' "${reqs[0]}" >&"$c1" || { why="cannot send while the server is dumped"; return 1; }
	rc=0
	read -r -t 1 answer <&"$c1" || rc=$?
	[ $rc -gt 128 ] || { why="while the server is dumped its connection read exit status $rc ('$answer'), not a timeout"; return 1; }
	t1=$(now)
	# No --network-lock here: the restore takes the dump's method (and warns that the option is ignored).
	criu_restore "$dir" --tcp-established {c1}>&- {c2}>&- || { show_log "$dir/restore.log"; return 1; }
	read -r -t "${GPU_TESTS_ANSWER_S:-120}" answer <&"$c1" || { why="the request in flight: no answer (read exit status $?)"; return 1; }
	first_s=$(since "$t1")
	served=$answer
	[ "$answer" = "${before[0]}" ] || { why="the request in flight answered '$answer', before the dump '${before[0]}'"; return 1; }
	line=$(plugin_line "$dir/restore.log" restore)
	[[ "$line" == "cuda_plugin: restore: 1 CUDA process(es), 0 failed"* ]] || { why="restore summary: '${line:-none}'"; return 1; }
	for i in "${!reqs[@]}"; do
		for fd in "$c1" "$c2"; do
			serve_ask "$fd" "${reqs[$i]}" || return 1
			[ "$answer" = "${before[i]}" ] || { why="'${reqs[$i]}' after the restore: '$answer', before '${before[i]}'"; return 1; }
		done
	done
	advance 60 "$state" "$base" || { show_workload "$dir"; return 1; }
}

# cuda_server (tests/workloads) with SERVER_MB MiB (default 1024) on the GPU: answers to chunk requests
# (hashes of device memory) before and after, one of them in flight during the restore.
test_server_tcp() {
	local name=server-tcp dir=$work/server-tcp mb=${SERVER_MB:-1024} port t0 cold pid
	serve_lock_options || { skipped $name "$why"; return; }
	port=$(serve_free_port)
	t0=$(now)
	start_in "$dir" "$bundle/bin/cuda_server" --mb "$mb" --port "$port" --state "$dir/state" --interval-ms 100
	serve_first_answer "$port" ping "$dir/state" 120 || { failed $name "cold start: $why"; show_workload "$dir"; return; }
	cold=$(since "$t0")
	wait_state "$dir/state" 60 1 || { failed $name "before the dump: $why"; show_workload "$dir"; return; }
	pid=$(state_value "$dir/state" pid)
	serve_roundtrip "$dir" "$port" "$dir/state" "chunk 7" "chunk 0" "chunk $((mb - 1))" ping ||
		{ failed $name "$why"; return; }
	passed $name "restore to first answer $first_s s (restore $restore_s s), cold start to first answer $cold s;\
 $mb MiB, dump $dump_s s, iterations $after"
	echo "  $(plugin_line "$dir/restore.log" restore)"
	kill_tree "$pid"
}

# framework_workload.py transformers --config gpt2 --kv-mb LLM_KV_MB (default 2048) --serve: 'generate'
# answered with the same greedy generation, logits and KV-cache checks before and after, one in flight.
test_llm_server_tcp() {
	local name=llm-server-tcp dir=$work/llm-server-tcp port t0 cold pid
	serve_lock_options || { skipped $name "$why"; return; }
	"$python" -c "import torch, transformers" 2>/dev/null || { skipped $name "$python has no torch or transformers"; return; }
	port=$(serve_free_port)
	t0=$(now)
	start_in "$dir" env -u LD_LIBRARY_PATH "$python" -u "$bundle/framework_workload.py" transformers --config gpt2 \
		--kv-mb "${LLM_KV_MB:-2048}" --serve "$port" --state "$dir/state"
	serve_first_answer "$port" generate "$dir/state" 600 || { failed $name "cold start: $why"; show_workload "$dir"; return; }
	cold=$(since "$t0")
	wait_state "$dir/state" 60 1 || { failed $name "before the dump: $why"; show_workload "$dir"; return; }
	pid=$(state_value "$dir/state" pid)
	serve_roundtrip "$dir" "$port" "$dir/state" generate ping || { failed $name "$why"; return; }
	passed $name "restore to first answer $first_s s (restore $restore_s s), cold start to first answer $cold s\
 (process start to the first generate); dump $dump_s s, image $(gib "$img_bytes") GiB, iterations $after"
	echo "  generate: ${served:0:160}"
	echo "  $(plugin_line "$dir/restore.log" restore)"
	kill_tree "$pid"
}

# serve_get PORT PATH [TIMEOUT_S]: the one-line body of GET http://127.0.0.1:PORT/PATH in answer; 1 when the
# server does not answer.
serve_get() {
	answer=$(python3 -c 'import sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/{sys.argv[2]}", timeout=float(sys.argv[3])) as r:
    print(r.read().decode().strip())' "$1" "$2" "${3:-${GPU_TESTS_ANSWER_S:-120}}" 2>/dev/null) && [ -n "$answer" ]
}

# serve_get_first PORT STATE TIMEOUT_S: until the server on PORT answers batch 1 (in answer); why and 1 when
# TIMEOUT_S pass first or STATE says the server failed.
serve_get_first() {
	local deadline=$(($(date +%s) + $3)) st
	while [ "$(date +%s)" -lt "$deadline" ]; do
		serve_get "$1" "generate?batch=1" && return 0
		st=$(state_value "$2" status)
		[ -z "$st" ] || [ "$st" = ok ] || { why="$(basename "$2") says status=$st"; return 1; }
		sleep 0.05
	done
	why="no answer on 127.0.0.1:$1 within $3 s"
	return 1
}

# The two-process server of serving_workload.py as vLLM V1 and SGLang run theirs (--processes 2: an HTTP
# front without CUDA starts the engine, which loads the weights, makes a KV arena of SERVE2_KV_GB (4) GiB of
# zeros, compiles with torch.compile and captures CUDA graphs; a Unix socket pair and a token-id ring in
# /dev/shm between them), as the process tree of a runc container on the host's network: checkpointed, the
# container removed, restored under a new name; every batch size's answer after the restore must equal the
# one before. Timed: the cold start (runc run to the first answer) and the restore (runc restore to the
# first answer). The weights are the benchmark's (SERVE_WEIGHTS, default
# /var/tmp/cuda-criu-serve-weights-6, written when missing); the container compiles with a copy of the
# benchmark's torch.compile cache where there is one (a machine that ran bench.py serve).
test_runc_serve2() {
	local name=runc-serve2 dir=$work/runc-serve2 runc_bin=$bundle/sbin/runc n devs=() port b t0 cold first host_pid
	local weights=${SERVE_WEIGHTS:-/var/tmp/cuda-criu-serve-weights-6} cache=/var/tmp/cuda-criu-bench/inductor-cache
	local tree=() engine="" p at RUNC_BINDS RUNC_WORKLOAD
	local -A before=()
	[ -x "$runc_bin" ] || { skipped $name "no runc in the bundle"; return; }
	"$python" -c 'import torch, transformers, safetensors' 2>/dev/null ||
		{ skipped $name "$python lacks torch, transformers or safetensors"; return; }
	GPU_TESTS_RUNC_WORKLOAD=torch runc_prepare "$dir" || return
	if [ ! -f "$weights/config.json" ]; then
		echo "  $name: writing the serving model's weights into $weights"
		env -u LD_LIBRARY_PATH "$python" "$bundle/serving_workload.py" make --dir "$weights" --size 6 >"$dir/make.out" 2>&1 ||
			{ failed $name "serving_workload.py make failed: $(tail -n 2 "$dir/make.out")"; return; }
	fi
	mkdir -p "$dir/state/home" "$dir/state/inductor-cache" "$dir/rootfs$weights"
	[ -d "$cache" ] && cp -a "$cache/." "$dir/state/inductor-cache/"
	cp "$bundle/serving_workload.py" "$dir/state/" || { failed $name "cannot copy serving_workload.py"; return; }
	port=$(serve_free_port)
	export RUNC_BINDS=${RUNC_BINDS:+$RUNC_BINDS:}$weights
	export RUNC_WORKLOAD="env HOME=/state/home HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TORCHINDUCTOR_CACHE_DIR=/state/inductor-cache\
 TRITON_CACHE_DIR=/state/inductor-cache/triton TORCHINDUCTOR_COMPILE_THREADS=1 $(command -v "$python") -u\
 /state/serving_workload.py serve --dir $weights --port $port --kv-gb ${SERVE2_KV_GB:-4} --state /state/one --processes 2"
	for n in /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia[0-9]*; do [ -c "$n" ] && devs+=("$n"); done
	RUNC_BINDIR=$bundle/bin runc_config "$dir" "$dir" "" "${devs[@]}" || { failed $name "cannot write config.json"; return; }
	t0=$(now)
	rc_ run -d --bundle "$dir" ct-serve2 </dev/null >/dev/null 2>&1 || { rc_fail "runc run failed (runc.log below)"; return; }
	serve_get_first "$port" "$dir/state/one" 900 || { rc_fail "cold start: $why"; return; }
	cold=$(since "$t0")
	host_pid=$(rc_state ct-serve2 pid)
	mapfile -t tree < <(tree_pids "$host_pid")
	for p in "${tree[@]}"; do [ "$p" != "$host_pid" ] && [ "$(gpu_gib "$p")" != 0.00 ] && engine=$p; done
	echo "  $name: container ct-serve2 answered $cold s after runc run: front host pid $host_pid ($(gpu_gib "$host_pid") GiB on the GPU), engine ${engine:-none} ($(gpu_gib "${engine:-0}") GiB), ${#tree[@]} processes"
	[ -n "$engine" ] && [ "$(gpu_gib "$host_pid")" = 0.00 ] ||
		{ rc_fail "want a front without GPU memory and an engine with it"; return; }
	for b in 1 2 4 8; do
		serve_get "$port" "generate?batch=$b" || { rc_fail "before the checkpoint: no answer for batch $b"; return; }
		before[$b]=$answer
	done
	echo "  batch 1: ${before[1]:0:160}"
	rc_checkpoint ct-serve2 "$host_pid" || return
	gone_within 30 "${tree[@]}" || { rc_fail "pids ${tree[*]} still exist after the checkpoint"; return; }
	t0=$(now)
	rc_ restore -d --bundle "$dir" --image-path "$dir/img" --work-path "$dir/work-restore" ct-serve2-new </dev/null >/dev/null 2>&1 ||
		{ rc_fail "runc restore as ct-serve2-new failed" "$dir/work-restore/restore.log"; return; }
	restore_s=$(since "$t0")
	serve_get_first "$port" "$dir/state/one" 120 || { rc_fail "after the restore: $why" "$dir/work-restore/restore.log"; return; }
	first=$(since "$t0")
	for b in 1 2 4 8; do
		serve_get "$port" "generate?batch=$b" || { rc_fail "after the restore: no answer for batch $b" "$dir/work-restore/restore.log"; return; }
		[ "$answer" = "${before[$b]}" ] ||
			{ rc_fail "batch $b after the restore: '${answer:0:200}', before '${before[$b]:0:200}'"; return; }
	done
	host_pid=$(rc_state ct-serve2-new pid)
	at=$(tree_pids "$host_pid" | wc -l)
	[ "$at" = "${#tree[@]}" ] || { rc_fail "ct-serve2-new has $at processes, ${#tree[@]} were checkpointed"; return; }
	plugin_line "$dir/work-restore/restore.log" restore | sed 's/^/  /'
	rc_remove_all
	passed $name "front + engine in a container: cold start to first answer $cold s; checkpoint $dump_s s, image\
 $(gib "$img_bytes") GiB; restored as ct-serve2-new, first answer $first s after runc restore began (restore\
 $restore_s s); the answers for batches 1, 2, 4, 8 equal"
	rm -rf "$dir/img"
}
