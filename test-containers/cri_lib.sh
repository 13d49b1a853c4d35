# Helpers of the CRI tests (sourced after lib.sh): "nodes" that are containerd 2.1 instances (from
# test-containers/containerd2-setup.sh, beside Debian 12's containerd 1.6), each with its own root, state,
# sockets, content store and runc root under $T/NAME, spoken to through their CRI socket by our own CRI
# client (cri/cri.py, code generated from the CRI's api.proto). Images go through the test's registry
# (lib.sh's registry_start): the base image, the pod sandbox image (pause: busybox sleeping) and the
# checkpoint images; every node pulls what it runs.
#
# Configured as a node: runc as the runtime, criu found in containerd's PATH ($T/bin/criu, our CRIU),
# the plugin enabled only by /etc/criu/runc.conf (libdir) with its options in /etc/criu/cuda_plugin.conf
# (lib.sh's criu_conf_setup). Only the fake GPU's own variables (FAKEGPU_DIR; on a node whose GPU must
# look smaller, the fake NVML's) reach containerd's environment, and through it the shim, runc and CRIU.
# Pods use the host's network (no CNI).

CD2=$CT_OUT/containerd2
CRI_PY=$CT_SRC/cri/cri.py
CRI_GEN=""
BASE_IMAGE=""  # $REGISTRY/cuda-criu-ct/base:test (cri_setup)
PAUSE_IMAGE="" # $REGISTRY/cuda-criu-ct/pause:test

# cri NODE COMMAND ARGS...: our CRI client against NODE's containerd (cri/cri.py gives the commands).
cri() {
	local node=$1
	shift
	/usr/bin/python3 "$CRI_PY" --gen "$CRI_GEN" --socket "$T/$node/containerd.sock" "$@"
}

# cri_setup: containerd 2.1, the CRI's api.proto, grpc_tools, h2, buildah and docker-registry installed (a
# failure where they are not: test-containers/setup.sh installs them); the client's code generated into
# $T; the registry started, with the base and pause images in it.
cri_setup() {
	[ -x "$CD2/usr/bin/containerd" ] ||
		fail "no containerd 2.1 in $CD2: run test-containers/setup.sh (test-containers/containerd2-setup.sh)"
	local proto=$CD2/usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto
	[ -f "$proto" ] || fail "no CRI api.proto in $CD2: run test-containers/containerd2-setup.sh"
	/usr/bin/python3 -c 'import grpc_tools, h2' 2>/dev/null ||
		fail "python3-grpc-tools or python3-h2 is not installed (test-containers/setup.sh installs them)"
	local t
	for t in buildah docker-registry; do
		command -v $t >/dev/null || fail "$t is not installed (test-containers/setup.sh installs it)"
	done
	CRI_GEN=$T/cri-gen
	/usr/bin/python3 "$CRI_PY" generate "$proto" "$CRI_GEN" >"$T/cri-gen.log" 2>&1 ||
		fail "cannot generate the CRI client: $(cat "$T/cri-gen.log")"
	mkdir -p "$T/bin"
	ln -sf "$CRIU" "$T/bin/criu"
	keep_logs_wrapper "$T/bin/runc-keep-logs" "$T/criu-logs"
	criu_conf_setup
	registry_start
	BASE_IMAGE=$REGISTRY/cuda-criu-ct/base:test
	PAUSE_IMAGE=$REGISTRY/cuda-criu-ct/pause:test
	cri_push_images
}

# keep_logs_wrapper FILE DIR: FILE, the runtime binary of the nodes (BinaryName in the runc runtime's
# options): runc, which keeps CRIU's log of a checkpoint or restore that fails as DIR/ID-checkpoint.log or
# DIR/ID-restore.log. containerd's shim removes CRIU's work directory of a failed restore with the task,
# and its error only names that file; docs/containers.md gives the same wrapper for a node.
keep_logs_wrapper() {
	cat >"$1" <<EOW
#!/bin/bash
cmd="" work="" prev="" id=""
for a in "\$@"; do
	[ "\$prev" = --work-path ] && work=\$a
	case "\$a" in checkpoint | restore) [ -n "\$cmd" ] || cmd=\$a ;; esac
	prev=\$a id=\$a
done
rc=0
$(command -v runc) "\$@" || rc=\$?
if [ \$rc != 0 ] && [ -n "\$cmd" ] && [ -n "\$work" ]; then
	log=\$work/dump.log
	[ "\$cmd" = restore ] && log=\$work/restore.log
	mkdir -p "$2" && cp "\$log" "$2/\$id-\$cmd.log"
fi
exit \$rc
EOW
	chmod +x "$1"
}

# cri_node NAME [VAR=VALUE...]: a containerd 2.1 of its own, stopped at exit with all it ran; the
# variables are added to its environment.
cri_node() {
	local name=$1 d=$T/$1
	shift
	mkdir -p "$d/cni" "$d/logs"
	sed -e "s|@NODE@|$d|g" -e "s|@RUNC@|$T/bin/runc-keep-logs|g" -e "s|@PAUSE@|$PAUSE_IMAGE|g" \
		"$CT_SRC/cri/containerd-node.toml" >"$d/config.toml"
	[ -d /run/containerd ] || on_exit 'rmdir /run/containerd/s /run/containerd/fifo /run/containerd'
	env -u CRIU_LIBS_DIR -u CUDA_CRIU_LIBCUDA PATH="$T/bin:$CD2/usr/bin:$PATH" FAKEGPU_DIR="$FAKEGPU_DIR" "$@" \
		setsid "$CD2/usr/bin/containerd" --config "$d/config.toml" --log-level debug </dev/null >"$T/$name.log" 2>&1 &
	eval "CRI_PID_$name=$!"
	on_exit "cri_node_stop $name"
	wait_for "containerd of $name to serve its CRI" 20 eval "cri $name version >/dev/null 2>&1"
}

# At exit: every pod of the node stopped and removed through the CRI (each call bounded), containerd
# stopped, any container, shim or mount of it left removed, then the pods' cgroups.
cri_node_stop() {
	local name=$1 d=$T/$1 id pid m pidvar=CRI_PID_$1
	local c=(timeout 30 /usr/bin/python3 "$CRI_PY" --gen "$CRI_GEN" --socket "$d/containerd.sock" --timeout 20)
	for id in $("${c[@]}" pods 2>/dev/null | awk '{ print $1 }'); do
		"${c[@]}" stopp "$id"
		"${c[@]}" rmp "$id"
	done
	kill "${!pidvar}" 2>/dev/null
	wait "${!pidvar}" 2>/dev/null
	for id in $(runc --root "$d/runc/k8s.io" list -q 2>/dev/null); do
		runc --root "$d/runc/k8s.io" kill "$id" KILL
		runc --root "$d/runc/k8s.io" delete -f "$id"
	done
	for pid in $(ps -e -o pid=,args= | awk -v a="-address $d/containerd.sock" 'index($0, a) { print $1 }'); do
		kill -KILL "$pid"
	done
	for m in $(awk -v d="$d/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r); do
		umount -l "$m"
	done
	rmdir /sys/fs/cgroup/*/cuda-criu-ct/*/ /sys/fs/cgroup/*/cuda-criu-ct
}

# cri_push_images: the base and pause images into the registry, through a containerd of their own.
cri_push_images() {
	cri_node pusher
	local c=(ctr --address "$T/pusher/containerd.sock" --namespace push) img
	oci_image_tar "$T/base.tar" "$BASE_IMAGE" /bin/sh
	oci_image_tar "$T/pause.tar" "$PAUSE_IMAGE" /bin/sleep 2147483647
	for img in base pause; do
		PATH=$CD2/usr/bin:$PATH "${c[@]}" images import --no-unpack "$T/$img.tar" >"$T/push.log" 2>&1 ||
			fail "ctr images import $img failed: $(cat "$T/push.log")"
	done
	for img in "$BASE_IMAGE" "$PAUSE_IMAGE"; do
		PATH=$CD2/usr/bin:$PATH "${c[@]}" images push --plain-http "$img" >"$T/push.log" 2>&1 ||
			fail "ctr images push $img failed: $(cat "$T/push.log")"
	done
}

# cri_pod_json NODE NAME [PID-MODE]: a pod sandbox configuration in $T/NODE/NAME-pod.json: the host's
# network, a PID namespace for each container (CONTAINER, the kubelet's default) or one for the pod (POD:
# shareProcessNamespace).
cri_pod_json() {
	local node=$1 name=$2 pid=${3:-CONTAINER}
	mkdir -p "$T/$node/logs/$name"
	jq -n --arg name "$name" --arg logs "$T/$node/logs/$name" --arg pid "$pid" '{metadata: {name: $name,
		namespace: "cuda-criu-ct", uid: ("uid-" + $name), attempt: 0}, log_directory: $logs,
		linux: {cgroup_parent: "/cuda-criu-ct", security_context: {namespace_options: {network: "NODE", pid: $pid}}}}' \
		>"$T/$node/$name-pod.json"
}

# cri_ctr_json NODE NAME IMAGE STATE-DIR SHELL-COMMAND [PID-MODE]: a GPU container's configuration (fake
# GPU: its library, its daemon's directory with the device files) in $T/NODE/NAME-ctr.json. STATE-DIR is
# its /state; PID-MODE as its pod's (cri_pod_json).
cri_ctr_json() {
	local node=$1 name=$2 image=$3 state=$4 cmd=$5 pid=${6:-CONTAINER}
	jq -n --arg name "$name" --arg image "$image" --arg cmd "$cmd" --arg gpu "$FAKEGPU_DIR" --arg pid "$pid" \
		--arg lib "$(readlink -f /lib/x86_64-linux-gnu)" --arg fake "$(dirname "$FAKE_LIB")" \
		--arg work "$(dirname "$MEMCHECK")" --arg state "$state" --arg run "$CT_RUN" '{
		metadata: {name: $name, attempt: 0}, image: {image: $image},
		command: ["/bin/sh", "-c", $cmd], log_path: ($name + ".log"),
		linux: {security_context: {namespace_options: {network: "NODE", pid: $pid}}},
		envs: [{key: "LD_LIBRARY_PATH", value: ("/opt/fakegpu" | @base64)}, {key: "FAKEGPU_DIR", value: ($gpu | @base64)}],
		mounts: [{container_path: "/lib/x86_64-linux-gnu", host_path: $lib, readonly: true},
			{container_path: "/opt/fakegpu", host_path: $fake, readonly: true},
			{container_path: "/opt/workloads", host_path: $work, readonly: true},
			{container_path: "/state", host_path: $state},
			{container_path: $run, host_path: $run}]}' >"$T/$node/$name-ctr.json"
}

# cri_state NODE ID: the container's CRI state (CONTAINER_RUNNING, CONTAINER_EXITED, ...).
cri_state() { cri "$1" ps | awk -v id="$2" '$1 == id { print $3 }'; }
# cri_pid NODE ID: the host pid of the container's process.
cri_pid() { cat "$T/$1/state/io.containerd.runtime.v2.task/k8s.io/$2/init.pid" 2>/dev/null; }

# cri_restore_log NODE ID: CRIU's restore.log of the container's start from a checkpoint that succeeded
# (in the shim's work directory: removed with the container).
cri_restore_log() { echo "$T/$1/root/io.containerd.runtime.v2.task/k8s.io/$2/restore.log"; }

# cri_kept_restore_log ID START-ERROR OUT: after StartContainer (a restore) of ID failed with START-ERROR:
# the CRI error names CRIU's log, which containerd has removed, and the runc wrapper's copy of it
# (keep_logs_wrapper) goes to OUT.
cri_kept_restore_log() {
	local id=$1 err=$2 out=$3
	expect_log "$err" "^log file: .*/restore.log" "the CRI error does not name CRIU's log"
	[ -f "$T/criu-logs/$id-restore.log" ] || fail "CRIU's restore log of $id was not kept in $T/criu-logs"
	cp "$T/criu-logs/$id-restore.log" "$out"
}

# checkpoint_image ARCHIVE IMAGE: the CRI's checkpoint archive as a checkpoint image for containerd,
# built with buildah as Kubernetes' documentation does (the archive added to an empty image) with the
# annotation containerd's CRI looks for, pushed to the registry and removed here.
checkpoint_image() {
	local archive=$1 img=$2 b t0
	t0=$(date +%s%N)
	b=$(buildah from scratch 2>"$T/buildah.log") || fail "buildah from scratch failed: $(cat "$T/buildah.log")"
	on_exit "buildah rm $b"
	on_exit "buildah rmi -f $img"
	buildah add "$b" "$archive" / >>"$T/buildah.log" 2>&1 || fail "buildah add failed: $(cat "$T/buildah.log")"
	buildah config --annotation=org.criu.checkpoint.container.name=gpu "$b" >>"$T/buildah.log" 2>&1 ||
		fail "buildah config failed: $(cat "$T/buildah.log")"
	buildah commit -q "$b" "$img" >>"$T/buildah.log" 2>&1 || fail "buildah commit failed: $(cat "$T/buildah.log")"
	buildah push --tls-verify=false "$img" >>"$T/buildah.log" 2>&1 || fail "buildah push $img failed: $(cat "$T/buildah.log")"
	buildah rm "$b" >/dev/null 2>&1
	buildah rmi -f "$img" >/dev/null 2>&1
	log "checkpoint image $img built and pushed in $(($(($(date +%s%N) - t0)) / 1000000)) ms"
}
