#!/usr/bin/env bash
# Kubernetes' own path through containerd 2.1's CRI, with the calls the kubelet makes (our CRI client,
# cri/cri.py): on node 1 a pod sandbox and a GPU container (fake GPU) running a CUDA workload;
# CheckpointContainer to an archive; the archive turned into a checkpoint image (buildah, with the
# annotation containerd looks for) and pushed to the test's registry; on node 2 (another containerd with
# its own store: it pulls the checkpoint image and the base image) a new pod sandbox, CreateContainer from
# the checkpoint image and StartContainer, which restores it: the workload verifies its device memory and
# counts on from where it was checkpointed. Then 3 pods restored from that image at once, each verified,
# and a fourth whose GPU state no longer fits on node 2's GPU (the fake NVML's FAKENVML_TOTAL), refused
# by the plugin while the 3 run on. Last, a pod sharing its PID namespace (shareProcessNamespace),
# checkpointed and restored into another.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/cri_lib.sh"
ct_setup runc
cri_setup
cri_node node1
log "$(cri node1 version)"

# cuda-criu check pointed at node 1's containerd, by its socket and by its configuration file: containerd
# 2.1, whose CRI restores from checkpoint images, and the CRIU under it loads our plugin (runc.conf).
for target in "$T/node1/containerd.sock" "$T/node1/config.toml"; do
	"$BUILD_DIR/bin/cuda-criu" check --criu "$CRIU" --runtimes none --containerd "$target" >"$T/check.txt" 2>&1 || true
	expect_log "$T/check.txt" "^ok +runtime-containerd +containerd 2\.1\.[0-9].*its CRI checkpoints for the kubelet and restores from checkpoint images.* loads $PLUGIN_DIR/cuda_plugin.so \(libdir in /etc/criu/runc.conf\)" \
		"cuda-criu check --containerd $target: $(grep -A1 runtime-containerd "$T/check.txt")"
done

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

# 2. CheckpointContainer to an archive: the container runs on. The archive holds CRIU's images with the
# GPU state (checkpoint/cuda-plugin.img) and CRIU's dump.log (CRIU's work directory is archived).
before=$(state_value "$T/state/src/one" iterations)
t0=$(date +%s%N)
cri node1 checkpoint "$ctr" "$T/ckpt.tar" 2>"$T/checkpoint.log" || fail "CheckpointContainer: $(cat "$T/checkpoint.log")"
log "CheckpointContainer wrote $(du -m "$T/ckpt.tar" | cut -f1) MiB in $(ms_since "$t0") ms"
tar -tf "$T/ckpt.tar" >"$T/ckpt.list"
for f in checkpoint/cuda-plugin.img config.dump spec.dump status.dump dump.log; do
	grep -qx "$f" "$T/ckpt.list" || fail "the checkpoint archive has no $f"
done
tar -xOf "$T/ckpt.tar" dump.log >"$T/dump.log"
expect_summary "$T/dump.log" dump 1 "no dump summary from the plugin: is it loaded through /etc/criu/runc.conf?"
[ -z "$(plugin_errors "$T/dump.log")" ] || fail "plugin errors in the dump log"
[ "$(cri_state node1 "$ctr")" = CONTAINER_RUNNING ] || fail "after the checkpoint the container is $(cri_state node1 "$ctr")"
expect_healthy "$T/state/src/one"
# The pod has moved: node 1 stops and removes it (its GPU memory is then free again).
cri node1 stopp "$pod" && cri node1 rmp "$pod" || fail "cannot remove the source pod"

# 3. The checkpoint image, as for containerd: the archive as the only layer, the annotation
# org.criu.checkpoint.container.name (containerd's CRI restores an image that has it), pushed.
CKPT_IMAGE=$REGISTRY/cuda-criu-ct/gpu-checkpoint:1
checkpoint_image "$T/ckpt.tar" "$CKPT_IMAGE"

# 4. Node 2 (the fake GPU there has GPU_MIB of memory, the fake NVML's FAKENVML_TOTAL): the kubelet pulls
# the checkpoint image, runs a new pod sandbox, creates the container from that image (containerd pulls
# the base image the checkpoint names) and starts it, which restores it.
state_mib=$(grep -oE "dump: 1 CUDA process\(es\), [0-9.]+ MiB of GPU state" "$T/dump.log" | grep -oE "[0-9.]+ MiB" | cut -d' ' -f1)
GPU_MIB=$(awk -v m="$state_mib" 'BEGIN { printf "%d", m * 6 }')
cri_node node2 LD_LIBRARY_PATH="$BUILD_DIR/tests/fakegpu/nvml" FAKENVML_TOTAL=$((GPU_MIB << 20))
t0=$(date +%s%N)
cri node2 pull "$CKPT_IMAGE" >"$T/pull.log" 2>&1 || fail "PullImage of the checkpoint image on node2: $(cat "$T/pull.log")"
log "node2 pulled the checkpoint image in $(ms_since "$t0") ms"

# restore_pod NAME: a pod sandbox NAME on node 2 with a container created from the checkpoint image,
# its /state in $T/state/NAME: the workload's files as it holds them open (CRIU reopens them by path and
# checks their size), the state file blanked for the restored workload to write again;
# sets POD and CTR. StartContainer is left to the caller.
restore_pod() {
	local name=$1
	mkdir -p "$T/state/$name"
	cp "$T/state/src/one.err" "$T/state/$name/one.err"
	blank_state "$T/state/$name/one"
	cri_pod_json node2 "$name"
	POD=$(cri node2 runp "$T/node2/$name-pod.json" 2>"$T/runp.log") || fail "RunPodSandbox $name: $(cat "$T/runp.log")"
	cri_ctr_json node2 "$name" "$CKPT_IMAGE" "$T/state/$name" "not run: restored"
	CTR=$(cri node2 create "$POD" "$T/node2/$name-ctr.json" "$T/node2/$name-pod.json" 2>"$T/create.log") ||
		fail "CreateContainer $name from the checkpoint image: $(cat "$T/create.log")"
}

# restored_ok NAME ID [STATE-DIR]: the container runs, its restore log has the plugin's clean summary, its
# workload (its state in STATE-DIR, default $T/state/NAME) verifies its data and counts on from the
# checkpoint, as pid 1 of its container (not checked with a STATE-DIR: a pod's shared PID namespace).
restored_ok() {
	local name=$1 id=$2 state=${3:-} rlog
	[ "$(cri_state node2 "$id")" = CONTAINER_RUNNING ] || fail "$name: the restored container is $(cri_state node2 "$id")"
	rlog=$(cri_restore_log node2 "$id")
	[ -f "$rlog" ] || fail "$name: no CRIU restore.log of container $id"
	cp "$rlog" "$T/restore-$name.log"
	expect_summary "$T/restore-$name.log" restore 1 "$name: no restore summary from the plugin"
	[ -z "$(plugin_errors "$T/restore-$name.log")" ] || fail "$name: plugin errors in the restore log"
	if [ -n "$state" ]; then
		expect_resumed "$state/one" "$before" "$name restored on node2"
		return
	fi
	expect_resumed "$T/state/$name/one" "$before" "$name restored on node2"
	[ "$(state_value "$T/state/$name/one" pid)" = 1 ] || fail "$name: the workload is not pid 1 of its container"
}

restore_pod dst
t0=$(date +%s%N)
cri node2 start "$CTR" 2>"$T/start.log" || fail "StartContainer (the restore) of dst: $(cat "$T/start.log")"
log "StartContainer restored dst in $(ms_since "$t0") ms"
restored_ok dst "$CTR"
cri node2 inspect "$CTR" | jq -e '.annotations.restored == "true"' >/dev/null ||
	fail "containerd does not mark the container as restored"
cri node2 stopp "$POD" && cri node2 rmp "$POD" || fail "cannot remove pod dst"

# 5. Three pods restored from the one checkpoint image at once (their StartContainer calls in parallel).
pods=() ctrs=() starts=()
for i in 1 2 3; do
	restore_pod "r$i"
	pods+=("$POD") ctrs+=("$CTR")
done
t0=$(date +%s%N)
for i in 0 1 2; do
	cri node2 start "${ctrs[$i]}" 2>"$T/start-r$((i + 1)).log" &
	starts+=($!)
done
for i in 0 1 2; do
	wait "${starts[$i]}" || fail "StartContainer of r$((i + 1)) failed: $(cat "$T/start-r$((i + 1)).log")"
done
log "3 pods restored at once in $(ms_since "$t0") ms"
for i in 0 1 2; do restored_ok "r$((i + 1))" "${ctrs[$i]}"; done

# 6. Another pod takes most of what is left of the GPU's memory; a fourth restore no longer fits: the
# plugin refuses it before any driver call, StartContainer fails, and the three run on.
hog_mib=$(awk -v g="$GPU_MIB" -v m="$state_mib" 'BEGIN { printf "%d", g - 3.5 * m }')
mkdir -p "$T/state/hog"
cri node2 pull "$BASE_IMAGE" >"$T/pull.log" 2>&1 || fail "PullImage on node2: $(cat "$T/pull.log")"
cri_pod_json node2 hog
hog_pod=$(cri node2 runp "$T/node2/hog-pod.json" 2>"$T/runp.log") || fail "RunPodSandbox hog: $(cat "$T/runp.log")"
cri_ctr_json node2 hog "$BASE_IMAGE" "$T/state/hog" "$(memcheck_cmd one "$hog_mib")"
hog=$(cri node2 create "$hog_pod" "$T/node2/hog-ctr.json" "$T/node2/hog-pod.json" 2>"$T/create.log") ||
	fail "CreateContainer hog: $(cat "$T/create.log")"
cri node2 start "$hog" 2>"$T/start.log" || fail "StartContainer hog: $(cat "$T/start.log")"
wait_for "the hog to fill its device memory" 20 test -f "$T/state/hog/one"
expect_healthy "$T/state/hog/one"
restore_pod r4
cri node2 start "$CTR" 2>"$T/start-r4.log" && fail "the restore of r4 succeeded on a GPU without room for it"
log "StartContainer of r4 failed: $(cat "$T/start-r4.log")"
cri_kept_restore_log "$CTR" "$T/start-r4.log" "$T/restore-r4.log"
expect_log "$T/restore-r4.log" "Error \(cuda_plugin\): .*has [0-9.]+ MiB free now .*need [0-9.]+ MiB" \
	"the plugin did not refuse r4 for want of GPU memory"
[ "$(cri_state node2 "$CTR")" != CONTAINER_RUNNING ] || fail "r4 runs"
log "r4 refused: $(grep -oE "Error \(cuda_plugin\): .*" "$T/restore-r4.log" | head -n1 | cut -c1-200)"
for i in 1 2 3; do
	[ "$(cri_state node2 "${ctrs[$((i - 1))]}")" = CONTAINER_RUNNING ] || fail "r$i stopped when r4 was refused"
	expect_healthy "$T/state/r$i/one"
done
for p in "${pods[@]}" "$POD" "$hog_pod"; do
	cri node2 stopp "$p" && cri node2 rmp "$p" || fail "cannot remove pod $p on node2"
done

# 7. A pod whose containers share its PID namespace (shareProcessNamespace: true): CRIU joins that
# namespace to fork the restored tasks into it, after which the kernel refuses CRIU's process new threads;
# the plugin starts its own (the driver's load, the GPU image's check, the driver's calls) from its own
# namespace. Checkpointed in such a pod on node 1 (the workload is not pid 1 there), restored into another
# on node 2.
cri_pod_json node1 shared-src POD
pod=$(cri node1 runp "$T/node1/shared-src-pod.json" 2>"$T/runp.log") || fail "RunPodSandbox shared-src: $(cat "$T/runp.log")"
mkdir -p "$T/state/shared-src"
cri_ctr_json node1 gpu "$BASE_IMAGE" "$T/state/shared-src" "$(memcheck_cmd one 64)" POD
ctr=$(cri node1 create "$pod" "$T/node1/gpu-ctr.json" "$T/node1/shared-src-pod.json" 2>"$T/create.log") ||
	fail "CreateContainer in shared-src: $(cat "$T/create.log")"
cri node1 start "$ctr" 2>"$T/start.log" || fail "StartContainer in shared-src: $(cat "$T/start.log")"
wait_for "the workload to fill its device memory" 20 test -f "$T/state/shared-src/one"
expect_healthy "$T/state/shared-src/one"
[ "$(state_value "$T/state/shared-src/one" pid)" != 1 ] || fail "the workload is pid 1 in a pod's shared PID namespace"
before=$(state_value "$T/state/shared-src/one" iterations)
cri node1 checkpoint "$ctr" "$T/ckpt-shared.tar" 2>"$T/checkpoint.log" || fail "CheckpointContainer in shared-src: $(cat "$T/checkpoint.log")"
cri node1 stopp "$pod" && cri node1 rmp "$pod" || fail "cannot remove pod shared-src"
SHARED_IMAGE=$REGISTRY/cuda-criu-ct/gpu-checkpoint:shared
checkpoint_image "$T/ckpt-shared.tar" "$SHARED_IMAGE"
cri node2 pull "$SHARED_IMAGE" >"$T/pull.log" 2>&1 || fail "PullImage of $SHARED_IMAGE on node2: $(cat "$T/pull.log")"
mkdir -p "$T/state/shared"
cp "$T/state/shared-src/one.err" "$T/state/shared/one.err"
blank_state "$T/state/shared/one"
cri_pod_json node2 shared POD
pod=$(cri node2 runp "$T/node2/shared-pod.json" 2>"$T/runp.log") || fail "RunPodSandbox shared: $(cat "$T/runp.log")"
cri_ctr_json node2 shared "$SHARED_IMAGE" "$T/state/shared" "not run: restored" POD
ctr=$(cri node2 create "$pod" "$T/node2/shared-ctr.json" "$T/node2/shared-pod.json" 2>"$T/create.log") ||
	fail "CreateContainer shared from the checkpoint image: $(cat "$T/create.log")"
cri node2 start "$ctr" 2>"$T/start.log" || fail "StartContainer (the restore) in a pod's shared PID namespace: $(cat "$T/start.log")"
restored_ok shared "$ctr" "$T/state/shared"
log "restored into a pod's shared PID namespace: running, data verified"
log PASS
