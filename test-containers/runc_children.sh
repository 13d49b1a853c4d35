#!/usr/bin/env bash
# runc: a container with several CUDA processes (the workload as pid 1 and two CUDA children, plus a
# child that never touches CUDA) is checkpointed in one batch, removed and restored; every process's
# device memory is verified after the restore.
source "$(dirname "$0")/lib.sh"
ct_setup runc
runc_setup

make_bundle "$T/bundle" "$(memcheck_cmd tree 32 --children 2 --plain-children 1)"
runc_start ct-tree "$T/bundle"
for f in tree tree.0 tree.1; do
	wait_for "$f to fill its device memory" 20 test -f "$T/state/$f"
done
for f in tree tree.0 tree.1; do expect_healthy "$T/state/$f"; done
host_pids=$(runc_ ps ct-tree 2>/dev/null | awk 'NR > 1 {print $2}' | xargs)
[ "$(echo "$host_pids" | wc -w)" -eq 4 ] || fail "expected 4 processes in the container, found: $host_pids"

runc_checkpoint ct-tree "$T/img" || fail "runc checkpoint failed"
expect_log "$T/dump.log" "checkpointing 3 CUDA process\(es\) in parallel" "the 3 CUDA processes were not checkpointed in one batch"
expect_summary "$T/dump.log" dump 3 "no dump summary for 3 processes"
[ -z "$(plugin_errors "$T/dump.log")" ] || fail "plugin errors in the dump log"
for p in $host_pids; do wait_for "pid $p to exit" 10 test ! -e "/proc/$p"; done
runc_ delete -f ct-tree 2>/dev/null || true
declare -A at_dump
for f in tree tree.0 tree.1; do at_dump[$f]=$(state_value "$T/state/$f" iterations); done
log "checkpointed: ${at_dump[*]}"

runc_restore ct-tree "$T/bundle" "$T/img" || fail "runc restore failed"
expect_summary "$T/restore.log" restore 3 "no restore summary for 3 processes"
[ "$(runc_ ps ct-tree 2>/dev/null | awk 'NR > 1' | wc -l)" -eq 4 ] || fail "not 4 processes after restore"
for f in tree tree.0 tree.1; do expect_resumed "$T/state/$f" "${at_dump[$f]}" "$f"; done
runc_remove ct-tree
log "3 CUDA processes and a plain one restored, data intact"
log PASS
