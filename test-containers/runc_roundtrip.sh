#!/usr/bin/env bash
# runc: a container running a CUDA workload (fake GPU) is checkpointed with our plugin, removed, and
# restored from the image under its own name and then under a new name; its device memory is verified
# by the workload after each restore, and it carries on counting from where it was checkpointed.
source "$(dirname "$0")/lib.sh"
ct_setup runc
runc_setup

runc_start_memcheck ct-one 64
host_pid=$(runc_pid ct-one)

# 1. Checkpoint: the container is gone afterwards (runc's default), the workload stands still.
runc_checkpoint ct-one "$T/img" || fail "runc checkpoint failed"
expect_summary "$T/dump.log" dump 1 "no dump summary from the plugin"
[ -z "$(plugin_errors "$T/dump.log")" ] || fail "plugin errors in the dump log"
[ -f "$T/img/cuda-plugin.img" ] || fail "no cuda-plugin.img in the checkpoint"
wait_for "pid $host_pid to exit" 10 test ! -e "/proc/$host_pid"
runc_ delete -f ct-one 2>/dev/null || true
[ -z "$(runc_ list -q)" ] || fail "containers left after checkpoint and delete: $(runc_ list -q)"
at_dump=$(state_value "$T/state/one" iterations)
expect_still "$T/state/one"
log "checkpointed at iteration $at_dump, container removed"

# 2. Restore under the same name.
# The driver loads slowly in CRIU (1.5 s): the plugin's warm-up thread still runs while CRIU enters the
# restored mount namespace, which fails (EINVAL) if that thread shares CRIU's fs_struct.
FAKEGPU_INIT_MS=1500 runc_restore ct-one "$T/bundle" "$T/img" || fail "runc restore failed"
expect_summary "$T/restore.log" restore 1 "no restore summary"
[ "$(runc_status ct-one)" = running ] || fail "restored container is $(runc_status ct-one)"
[ "$(runc_pid ct-one)" != "$host_pid" ] || log "note: the restored container got the same host pid"
expect_resumed "$T/state/one" "$at_dump" "restored as ct-one"
[ "$(state_value "$T/state/one" pid)" = 1 ] || fail "the workload is not pid 1 of the container"
runc_remove ct-one

# 3. The same image restored under a new container name.
blank_state "$T/state/one"
runc_restore ct-new "$T/bundle" "$T/img" || fail "runc restore under a new name failed"
expect_summary "$T/restore.log" restore 1 "no restore summary (new name)"
[ "$(runc_status ct-new)" = running ] || fail "ct-new is $(runc_status ct-new)"
expect_resumed "$T/state/one" "$at_dump" "restored as ct-new"
runc_remove ct-new
log PASS
