#!/usr/bin/env bash
# --leave-running, and processes the dump finds already locked or checkpointed: each is dumped and, with
# --leave-running, left exactly in the state it was found in.
source "$(dirname "$0")/lib.sh"
e2e_setup
start_fake_gpu

# 1. --leave-running: the process runs on, back on its GPU, and the image restores later.
start_memcheck lr 32
pid=$LAST_PID
dump "$pid" "$T/img1" -R || fail "dump -R failed"
alive "$pid" || fail "process gone after dump -R"
[ "$(cuda_state "$pid")" = running ] || fail "state after dump -R: $(cuda_state "$pid")"
expect_log "$T/dump.log" "all CUDA processes are back as they were found" "no rollback line"
healthy_then_gone
restore "$T/img1" || fail "restore of a --leave-running image failed"
healthy_then_gone
log "leave-running: ok"

# 2. Already locked: dumped, and left locked by --leave-running.
start_memcheck locked 16
pid=$LAST_PID
cuda_criu lock "$pid" || fail "cuda-criu lock failed"
dump "$pid" "$T/img2" -R || fail "dump -R of a locked process failed"
expect_log "$T/dump.log" "pid $pid was already locked" "locked state not noticed"
[ "$(cuda_state "$pid")" = locked ] || fail "a locked process came out $(cuda_state "$pid")"
cuda_criu unlock "$pid" || fail "unlock failed"
expect_healthy "$STATE"
log "already locked: ok"

# 3. Already checkpointed: dumped as it is, left checkpointed; its image restores to running.
cuda_criu lock "$pid" && cuda_criu checkpoint "$pid" || fail "cuda-criu checkpoint failed"
dump "$pid" "$T/img3" -R || fail "dump -R of a checkpointed process failed"
[ "$(cuda_state "$pid")" = checkpointed ] || fail "a checkpointed process came out $(cuda_state "$pid")"
dump "$pid" "$T/img4" || fail "dump of a checkpointed process failed"
wait_gone "$pid"
restore "$T/img4" || fail "restore failed"
[ "$(cuda_state "$pid")" = running ] || fail "restored process is $(cuda_state "$pid")"
expect_healthy "$STATE"
log "already checkpointed: ok"
log PASS
