#!/usr/bin/env bash
# Legacy CUDA IPC as the r580 driver leaves it in /dev/shm (the fake's FAKEGPU_LEGACY_IPC): an exporter
# maps /dev/shm/cuda.shm.0.<its pid in hex>.1, an importer maps the exporter's file. The driver would
# checkpoint both but cannot restore the importer, so while both live a dump of either (also with
# --leave-running), cuda-criu suspend and checkpoint are refused before anything is locked, naming both pids
# and the file, and both run on with their data; cuda-criu check PID and ps say so beforehand. Once the
# importer is gone, the exporter alone is dumped and restored with its data. An exporter in a pid namespace
# of its own, numbered there as its importer is on the host, is told from that importer by the file it
# holds open: the importer is refused naming the exporter's host pid, also once the exporter has exited.
source "$(dirname "$0")/lib.sh"
e2e_setup
start_fake_gpu

FAKEGPU_LEGACY_IPC=export start_memcheck ipc-exporter 16
exporter=$LAST_PID exporter_state=$STATE
file=/dev/shm/cuda.shm.0.$(printf %x "$exporter").1
on_exit "rm -f $file"
wait_for "the exporter's IPC file" 10 grep -q "$file" "/proc/$exporter/maps"
FAKEGPU_LEGACY_IPC=import:$exporter start_memcheck ipc-importer 16
importer=$LAST_PID importer_state=$STATE
wait_for "the importer to map $file" 10 grep -q "$file" "/proc/$importer/maps"

importer_says="pid $importer maps $file, the legacy CUDA IPC file of pid $exporter: it opened GPU memory or an event that pid $exporter exported"
exporter_says="pid $exporter exported GPU memory or an event through legacy CUDA IPC .* and pid $importer maps its IPC file $file"

# both_run_on WHAT: neither process is locked or stopped, and both go on with their data.
both_run_on() {
	local p
	for p in "$exporter" "$importer"; do
		is_running "$p" || fail "$1: pid $p is $(cuda_state "$p")"
	done
	expect_healthy "$exporter_state"
	expect_healthy "$importer_state"
}

# 1. CRIU: a dump of either, with and without --leave-running, refused before the lock.
for opts in "" --leave-running; do
	dump "$exporter" "$T/img-exporter" $opts 2>/dev/null && fail "the dump $opts of an exporter whose file pid $importer maps succeeded"
	expect_log "$T/dump.log" "$exporter_says" "the dump $opts of the exporter was refused without naming the importer"
	dump "$importer" "$T/img-importer" $opts 2>/dev/null && fail "the dump $opts of an IPC importer succeeded"
	expect_log "$T/dump.log" "$importer_says" "the dump $opts of the importer was refused without naming the exporter"
	expect_log "$T/dump.log" "driver r610" "the refusal does not say what to do"
	grep -q "lock pid" "$T/dump.log" && fail "a lock was tried"
	both_run_on "dump $opts"
done
log "criu dump (and --leave-running) of the exporter and of the importer: refused before the lock, both named; both run on"

# 2. cuda-criu: check PID and ps tell beforehand; suspend and checkpoint refuse.
cuda_criu check --runtimes none "$importer" "$exporter" >"$T/check.out" 2>&1 && fail "cuda-criu check passed an IPC pair"
grep -qE "^fail +pid-$importer +pid $importer cannot be checkpointed: $importer_says" "$T/check.out" ||
	fail "cuda-criu check does not name the importer: $(grep pid- "$T/check.out")"
grep -qE "^fail +pid-$exporter +pid $exporter cannot be checkpointed" "$T/check.out" ||
	fail "cuda-criu check does not name the exporter: $(grep pid- "$T/check.out")"
cuda_criu ps >"$T/ps.out" || fail "cuda-criu ps failed"
grep -qE "^ +cannot be checkpointed: $importer_says" "$T/ps.out" || fail "cuda-criu ps: $(cat "$T/ps.out")"
cuda_criu ps --json | py "
p = {x['pid']: x for x in d['processes']}
assert 'legacy CUDA IPC file of pid $exporter' in p[$importer]['checkpoint_refused'], p[$importer]
assert p[$exporter]['checkpoint_refused'], p[$exporter]" || fail "cuda-criu ps --json has no checkpoint_refused"
for action in suspend checkpoint; do
	cuda_criu "$action" "$importer" >"$T/$action.out" 2>&1 && fail "cuda-criu $action of an IPC importer succeeded"
	grep -q "$action pid $importer: $importer_says" "$T/$action.out" || fail "cuda-criu $action: $(cat "$T/$action.out")"
done
both_run_on "cuda-criu suspend"
log "cuda-criu check and ps name the pair; suspend and checkpoint refuse it; both run on"

# 3. The importer gone, the exporter alone is dumped as any process and restored with its data.
kill -9 "$importer"
wait_gone "$importer"
cuda_criu check --runtimes none "$exporter" >"$T/check.out" 2>&1 || true # (other checks may fail here)
grep -qE "^ok +pid-$exporter " "$T/check.out" || fail "cuda-criu check of a lone exporter: $(grep pid- "$T/check.out")"
dump "$exporter" "$T/img-alone" || fail "the dump of an exporter alone failed: $(plugin_errors "$T/dump.log")"
expect_log "$T/dump.log" "pid $exporter exported GPU memory or an event through legacy CUDA IPC \($file\), but no other process maps it" \
	"the dump did not say why it let the exporter through"
wait_gone "$exporter"
restore "$T/img-alone" || fail "the restore of an exporter alone failed"
expect_summary "$T/restore.log" restore 1 "no restore summary"
grep -q "$file" "/proc/$exporter/maps" || fail "the restored exporter does not map $file"
expect_healthy "$exporter_state"
log "an exporter alone: dumped, restored with its data and its IPC file"

# 4. The exporter in a pid namespace of its own, where its pid is the importer's host pid X: the file
# /dev/shm/cuda.shm.0.<X in hex>.1 names it there. The importer starts first and waits (before its cuInit)
# for the exporter's file; the exporter is made pid X of its namespace through that namespace's ns_last_pid.
go=$T/ns-exporter-ready
start_cuda ns-importer bash -c 'until [ -e "$1" ]; do sleep 0.05; done
	export FAKEGPU_LEGACY_IPC=import:$$; exec "${@:2}"' ns-importer "$go" \
	"$MEMCHECK" --mb 16 --state "$T/ns-importer.state" --interval-ms 20
importer=$LAST_PID importer_state=$T/ns-importer.state
file=/dev/shm/cuda.shm.0.$(printf %x "$importer").1
rm -f "$file"
on_exit "rm -f $file"
start_cuda ns-exporter unshare --pid --fork --mount-proc bash -c 'echo $(($1 - 1)) >/proc/sys/kernel/ns_last_pid &&
	{ FAKEGPU_LEGACY_IPC=export "${@:2}" & wait; }' ns-exporter "$importer" \
	"$MEMCHECK" --mb 16 --state "$T/ns-exporter.state" --interval-ms 20
exporter_state=$T/ns-exporter.state
wait_for "the exporter in its pid namespace to fill its device memory" 20 test -f "$exporter_state"
ns_init=$(ps -o pid= --ppid "$LAST_PID" | xargs)
exporter=$(ps -o pid= --ppid "$ns_init" | xargs)
[ -n "$exporter" ] || fail "no exporter in its pid namespace"
PIDS+=("$exporter")
[ "$(awk '/^NSpid:/ {print $NF}' "/proc/$exporter/status")" = "$importer" ] ||
	fail "the exporter (host pid $exporter) is not pid $importer in its namespace: $(grep NSpid "/proc/$exporter/status")"
pidns=$(readlink "/proc/$exporter/ns/pid")
[ "$pidns" != "$(readlink /proc/self/ns/pid)" ] || fail "the exporter is in the host's pid namespace"
grep -q "$file" "/proc/$exporter/maps" || fail "the exporter does not map $file"
touch "$go"
wait_for "the importer to fill its device memory" 20 test -f "$importer_state"
wait_for "the importer to map $file" 10 grep -q "$file" "/proc/$importer/maps"

pidns_re=${pidns//[/\\[} pidns_re=${pidns_re//]/\\]}
importer_says="pid $importer maps $file, the legacy CUDA IPC file of pid $exporter \(pid $importer in pid namespace $pidns_re\): it opened GPU memory or an event that pid $exporter exported"
for opts in "" --leave-running; do
	dump "$importer" "$T/img-ns-importer" $opts 2>/dev/null && fail "the dump $opts of an importer whose host pid the exporter's file carries succeeded"
	expect_log "$T/dump.log" "$importer_says" "the dump $opts of the importer did not name the exporter in its pid namespace"
	grep -q "lock pid" "$T/dump.log" && fail "a lock was tried"
	is_running "$importer" || fail "dump $opts: pid $importer is $(cuda_state "$importer")"
	expect_healthy "$exporter_state"
	expect_healthy "$importer_state"
done
log "an importer whose host pid is its exporter's pid in another pid namespace: refused naming pid $exporter ($pidns), both run on"

kill -9 "$exporter"
wait_gone "$exporter"
dump "$importer" "$T/img-ns-importer" 2>/dev/null && fail "the dump of an importer whose exporter exited succeeded"
expect_log "$T/dump.log" "pid $importer maps $file, the legacy CUDA IPC file of pid $importer as its own pid namespace numbered it, which has exited" \
	"the dump of the importer did not say that its exporter exited"
is_running "$importer" || fail "pid $importer is $(cuda_state "$importer")"
expect_healthy "$importer_state"
log "the same importer once its exporter exited: still refused, the exporter named as its namespace numbered it"
log PASS
