#!/usr/bin/env bash
# Faults on Kubernetes' path through containerd 2.1's CRI (cri_lib.sh's nodes, our CRI client), and where
# a user finds the plugin's reason:
#   1. CheckpointContainer of a GPU container holding CUDA managed memory (the fake GPU refuses it as the
#      r580 driver does) fails; the container runs on with its data. The CRI error names CRIU's log
#      (criu-dump.log in the container's bundle, kept while the container exists), which has the reason.
#   2. The same for a container whose two CUDA processes share GPU memory through legacy CUDA IPC: refused
#      before anything is locked, naming both processes by their host pids and the file.
#   3. A damaged checkpoint image (its cuda-plugin.img cut short), pulled on node 2: CreateContainer from
#      it succeeds, StartContainer (the restore) fails and nothing of the container runs; the CRI error
#      names CRIU's restore.log, which containerd removes with the task: the runc wrapper of the node keeps
#      it (cri_lib.sh's keep_logs_wrapper), with the plugin's reason. Once the kubelet's clean-up calls
#      remove the container and its pod sandbox, nothing of them is left (ListContainers, ListPodSandbox,
#      processes, mounts).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/cri_lib.sh"
ct_setup runc
cri_setup
cri_node node1
cri node1 pull "$BASE_IMAGE" >"$T/pull.log" 2>&1 || fail "PullImage on node1: $(cat "$T/pull.log")"

# run_pod NAME SHELL-COMMAND: a pod NAME on node 1 with one GPU container running the command, its /state
# in $T/state/NAME; sets CTR.
run_pod() {
	local name=$1 pod
	mkdir -p "$T/state/$name"
	cri_pod_json node1 "$name"
	pod=$(cri node1 runp "$T/node1/$name-pod.json" 2>"$T/runp.log") || fail "RunPodSandbox $name: $(cat "$T/runp.log")"
	cri_ctr_json node1 "$name" "$BASE_IMAGE" "$T/state/$name" "$2"
	CTR=$(cri node1 create "$pod" "$T/node1/$name-ctr.json" "$T/node1/$name-pod.json" 2>"$T/create.log") ||
		fail "CreateContainer $name: $(cat "$T/create.log")"
	cri node1 start "$CTR" 2>"$T/start.log" || fail "StartContainer $name: $(cat "$T/start.log")"
}

# refused_checkpoint NAME ID PATTERN: CheckpointContainer of ID fails, its error names CRIU's log, which
# holds a plugin error matching PATTERN; the container runs on.
refused_checkpoint() {
	local name=$1 id=$2 pattern=$3 dlog
	cri node1 checkpoint "$id" "$T/$name.tar" 2>"$T/checkpoint-$name.log" &&
		fail "CheckpointContainer of $name succeeded"
	dlog=$(grep -oE "path= [^ :]+/criu-dump.log" "$T/checkpoint-$name.log" | cut -d' ' -f2)
	[ -n "$dlog" ] || fail "the CRI error does not name CRIU's log: $(cat "$T/checkpoint-$name.log")"
	[ -f "$dlog" ] || fail "CRIU's log $dlog, named by the CRI error, is not there"
	cp "$dlog" "$T/dump-$name.log"
	expect_log "$T/dump-$name.log" "Error \(cuda_plugin\): .*$pattern" "$name: no plugin error matching '$pattern' in CRIU's log"
	[ "$(cri_state node1 "$id")" = CONTAINER_RUNNING ] || fail "after the refused checkpoint $name is $(cri_state node1 "$id")"
	log "$name: CheckpointContainer refused: $(head -n1 "$T/checkpoint-$name.log" | cut -c1-160)"
	log "$name: CRIU's log $dlog says: $(grep -oE "Error \(cuda_plugin\): .*" "$T/dump-$name.log" | head -n1 | cut -c1-200)"
}

# 1. Managed memory.
run_pod managed "$(memcheck_cmd one 16 --managed-mb 4)"
managed=$CTR
wait_for "the managed-memory workload to fill its memory" 20 test -f "$T/state/managed/one"
expect_healthy "$T/state/managed/one"
refused_checkpoint managed "$managed" "uses CUDA managed memory"
expect_healthy "$T/state/managed/one"

# 2. Legacy CUDA IPC (the fake's FAKEGPU_LEGACY_IPC, as test-containers/runc_legacy_ipc.sh).
exporter_cmd="FAKEGPU_LEGACY_IPC=export $(memcheck_cmd exporter 16 | sed 's/^exec //') &"
wait_file='f=/dev/shm/cuda.shm.0.$(printf %x $!).1; while [ ! -e $f ]; do sleep 0.05; done;'
run_pod ipc "$exporter_cmd $wait_file FAKEGPU_LEGACY_IPC=import:\$! $(memcheck_cmd importer 16)"
ipc=$CTR
for f in exporter importer; do
	wait_for "$f to fill its device memory" 20 test -f "$T/state/ipc/$f"
	expect_healthy "$T/state/ipc/$f"
done
importer=$(cri_pid node1 "$ipc")
exporter=$(ps -o pid= --ppid "$importer" | xargs)
[ -n "$exporter" ] || fail "no exporter in the container"
file=/dev/shm/cuda.shm.0.$(printf %x "$(awk '/^NSpid:/ {print $NF}' "/proc/$exporter/status")").1
refused_checkpoint ipc "$ipc" "pid $importer maps $file, the legacy CUDA IPC file of pid $exporter"
grep -q "lock pid" "$T/dump-ipc.log" && fail "ipc: a lock was tried"
for f in exporter importer; do expect_healthy "$T/state/ipc/$f"; done

# 3. A damaged checkpoint image. The archive of a healthy container, its cuda-plugin.img cut short.
run_pod src "$(memcheck_cmd one 16)"
wait_for "the workload to fill its device memory" 20 test -f "$T/state/src/one"
expect_healthy "$T/state/src/one"
cri node1 checkpoint "$CTR" "$T/ckpt.tar" 2>"$T/checkpoint.log" || fail "CheckpointContainer: $(cat "$T/checkpoint.log")"
mkdir "$T/damaged"
tar -xf "$T/ckpt.tar" -C "$T/damaged"
img=$T/damaged/checkpoint/cuda-plugin.img
[ -f "$img" ] || fail "the checkpoint archive has no checkpoint/cuda-plugin.img"
head -c 60 "$img" >"$img.short" && mv "$img.short" "$img"
tar -C "$T/damaged" -cf "$T/damaged.tar" .
DAMAGED=$REGISTRY/cuda-criu-ct/gpu-checkpoint:damaged
checkpoint_image "$T/damaged.tar" "$DAMAGED"

cri_node node2
cri node2 pull "$DAMAGED" >"$T/pull.log" 2>&1 || fail "PullImage of $DAMAGED on node2: $(cat "$T/pull.log")"
mkdir -p "$T/state/dst"
cp "$T/state/src/one.err" "$T/state/dst/one.err"
blank_state "$T/state/dst/one"
cri_pod_json node2 dst
pod=$(cri node2 runp "$T/node2/dst-pod.json" 2>"$T/runp.log") || fail "RunPodSandbox dst: $(cat "$T/runp.log")"
cri_ctr_json node2 dst "$DAMAGED" "$T/state/dst" "not run: restored"
ctr=$(cri node2 create "$pod" "$T/node2/dst-ctr.json" "$T/node2/dst-pod.json" 2>"$T/create.log") ||
	fail "CreateContainer from $DAMAGED: $(cat "$T/create.log")"
cri node2 start "$ctr" 2>"$T/start-dst.log" && fail "the restore from the damaged image succeeded"
log "StartContainer from the damaged image failed: $(head -n1 "$T/start-dst.log")"
cri_kept_restore_log "$ctr" "$T/start-dst.log" "$T/restore-dst.log"
expect_log "$T/restore-dst.log" "Error \(cuda_plugin\): .*truncated or padded image" "no plugin error naming the damage"
log "the kept restore log says: $(grep -oE "Error \(cuda_plugin\): .*" "$T/restore-dst.log" | head -n1 | cut -c1-200)"
state=$(cri_state node2 "$ctr")
[ "$state" != CONTAINER_RUNNING ] || fail "the container restored from the damaged image runs"
runc --root "$T/node2/runc/k8s.io" list -q 2>/dev/null | grep -qx "$ctr" && fail "runc still has the failed container"
sleep 1
[ -z "$(state_value "$T/state/dst/one" iterations)" ] || fail "a workload of the failed restore runs: $(cat "$T/state/dst/one")"
# The kubelet's clean-up: the container, then the pod sandbox.
cri node2 rm "$ctr" 2>"$T/rm.log" || fail "RemoveContainer of the failed container: $(cat "$T/rm.log")"
cri node2 stopp "$pod" 2>"$T/rm.log" && cri node2 rmp "$pod" 2>"$T/rm.log" || fail "cannot remove the pod: $(cat "$T/rm.log")"
[ -z "$(cri node2 ps)" ] || fail "containers left on node2: $(cri node2 ps)"
[ -z "$(cri node2 pods)" ] || fail "pod sandboxes left on node2: $(cri node2 pods)"
! grep -q "$ctr" /proc/self/mountinfo || fail "mounts of the failed container left: $(grep "$ctr" /proc/self/mountinfo)"
[ -z "$(runc --root "$T/node2/runc/k8s.io" list -q 2>/dev/null)" ] || fail "runc containers left on node2"
log "the failed container was $state; after RemoveContainer and RemovePodSandbox nothing of it is left"
log PASS
