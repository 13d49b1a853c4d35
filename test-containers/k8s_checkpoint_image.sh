#!/usr/bin/env bash
# Kubernetes checkpoint images: a podman checkpoint archive of a container running a CUDA workload (fake
# GPU) - the same kind of archive the kubelet's checkpoint API writes - is wrapped into an OCI checkpoint
# image the way Kubernetes' documentation does it (buildah from scratch, the archive added, the
# annotation io.kubernetes.cri-o.annotations.checkpoint.name), pushed to the test's registry
# (docker-registry on 127.0.0.1, lib.sh's registry_start) and removed here; that image is pulled from the
# registry and restored with `podman container restore IMAGE` on a "second host": a private mount
# namespace in which podman's and runc's directories are empty ones (a store with only the base image and
# the checkpoint images). The workload verifies its device memory after the restore and counts on from
# where it was checkpointed. Our plugin is enabled only through /etc/criu/runc.conf and
# /etc/criu/cuda_plugin.conf (lib.sh's podman_setup).
source "$(dirname "$0")/lib.sh"

# The checkpoint archive as an image in the test's registry: tag k8s as Kubernetes builds it, tag podman
# with podman's own annotation too.
CKPT_REPO=cuda-criu-ct/pk-one

ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }

# restore_image IMAGE: `podman container restore IMAGE` on the second host, the workload checked.
restore_image() {
	local img=$1 t0
	on_pod_exit rm -f -t 0 pk-one
	blank_state "$T/state/one"
	t0=$(date +%s%N)
	pod container restore --keep "$img" >"$T/restore-cmd.log" 2>&1 || return 1
	log "restored $img in $(ms_since "$t0") ms"
	pod_log pk-one restore
	expect_summary "$T/restore.log" restore 1 "no restore summary on the second host"
	[ "$(pod_status pk-one)" = running ] || fail "the container restored from $img is $(pod_status pk-one)"
	expect_resumed "$T/state/one" "$(cat "$T/at_dump")" "$img restored on a second host"
	pod rm -f -t 0 pk-one >/dev/null
}

second_host() {
	local k8s=$REGISTRY/$CKPT_REPO:k8s podman=$REGISTRY/$CKPT_REPO:podman img
	pod_runtime_conf
	[ -z "$(pod ps -aq)" ] || fail "the second host's store is not empty"
	pod_import_image
	for img in "$k8s" "$podman"; do
		on_pod_exit rmi -f "$img"
		pod pull --tls-verify=false "$img" >"$T/pull.log" 2>&1 || fail "podman pull $img failed: $(cat "$T/pull.log")"
	done
	[ "$(pod image inspect -f '{{index .Annotations "io.kubernetes.cri-o.annotations.checkpoint.name"}}' "$k8s")" = pk-one ] ||
		fail "the checkpoint image $k8s lost its annotation io.kubernetes.cri-o.annotations.checkpoint.name"

	# 1. The image as Kubernetes builds it.
	if restore_image "$k8s"; then
		echo ok >"$T/k8s_image_restored"
	else
		# podman finds its checkpoint images by its own annotation only (podman 4.3: "image is not a
		# checkpoint"); anything else is a failure.
		grep -q "image is not a checkpoint" "$T/restore-cmd.log" ||
			fail "podman container restore $k8s failed: $(cat "$T/restore-cmd.log")"
		log "podman refuses the Kubernetes checkpoint image: $(cat "$T/restore-cmd.log")"
	fi
	# 2. The same archive as an image with podman's annotation: the GPU state in a checkpoint image, restored.
	restore_image "$podman" || fail "podman container restore $podman failed: $(cat "$T/restore-cmd.log")"
	pod rmi -f "$k8s" "$podman" "$POD_IMAGE" >/dev/null
}
second_host_part "$@"

ct_setup runc podman buildah docker-registry
log "$(podman --version), $(buildah --version)"
podman_setup
pod_fakegpu_mounts
registry_start

pod_run pk-one "$(memcheck_cmd one 64)" "${POD_FAKEGPU[@]}"
wait_for "the workload to fill its device memory" 20 test -f "$T/state/one"
expect_healthy "$T/state/one"

# The checkpoint archive, uncompressed like the kubelet's.
t0=$(date +%s%N)
pod container checkpoint --keep --compress none --export "$T/pk-one.tar" pk-one >"$T/checkpoint.log" 2>&1 ||
	{ pod_log pk-one dump; fail "podman container checkpoint --export failed: $(cat "$T/checkpoint.log")"; }
log "checkpointed to an archive in $(ms_since "$t0") ms"
pod_log pk-one dump
expect_summary "$T/dump.log" dump 1 "no dump summary: is the plugin loaded through /etc/criu/runc.conf?"
tar -tf "$T/pk-one.tar" >"$T/export.list"
grep -q 'checkpoint/cuda-plugin.img' "$T/export.list" || fail "the archive has no checkpoint/cuda-plugin.img"
pod rm -f pk-one >/dev/null || fail "podman rm failed"
state_value "$T/state/one" iterations >"$T/at_dump"

# checkpoint_image TAG [ANNOTATION...]: the archive as an image, built as Kubernetes' documentation
# does, pushed to the test's registry as $CKPT_REPO:TAG (with podman: the watchdog bounds podman's calls,
# not buildah's) and removed here.
checkpoint_image() {
	local img=$REGISTRY/$CKPT_REPO:$1 a t0
	shift
	t0=$(date +%s%N)
	bctr=$(buildah from scratch 2>"$T/buildah.log") || fail "buildah from scratch failed: $(cat "$T/buildah.log")"
	on_exit "buildah rm $bctr"
	buildah add "$bctr" "$T/pk-one.tar" / >>"$T/buildah.log" 2>&1 || fail "buildah add failed: $(cat "$T/buildah.log")"
	for a in io.kubernetes.cri-o.annotations.checkpoint.name=pk-one "$@"; do
		buildah config --annotation="$a" "$bctr" >>"$T/buildah.log" 2>&1 || fail "buildah config --annotation=$a failed: $(cat "$T/buildah.log")"
	done
	on_pod_exit rmi -f "$img"
	buildah commit -q "$bctr" "$img" >>"$T/buildah.log" 2>&1 || fail "buildah commit failed: $(cat "$T/buildah.log")"
	buildah rm "$bctr" >/dev/null 2>&1
	pod push --tls-verify=false "$img" >"$T/push.log" 2>&1 || fail "podman push $img failed: $(cat "$T/push.log")"
	pod rmi "$img" >/dev/null || fail "podman rmi $img failed"
	log "checkpoint image $img built and pushed in $(ms_since "$t0") ms"
}
checkpoint_image k8s
# podman restores only images that name the runtime they need, in its own annotation.
checkpoint_image podman io.podman.annotations.checkpoint.runtime.name=runc

on_second_host
[ -f "$T/k8s_image_restored" ] ||
	skip "podman $(podman --version | awk '{print $3}') restores only checkpoint images it made itself (annotation io.podman.annotations.checkpoint.runtime.name), not a Kubernetes one (io.kubernetes.cri-o.annotations.checkpoint.name only): restoring that needs CRI-O (or containerd 2.x); the same archive with podman's annotation restored"
log PASS
