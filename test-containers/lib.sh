# Shared helpers of the container tests: real runtimes (runc, podman), real CRIU, our plugin, the fake GPU.
#
# Each test sources this file and calls ct_setup (root, runtime and root file system checks, a temporary
# directory, the fake GPU). Whatever a test creates - containers, images, runtime state, mounts,
# configuration files, the fake GPU daemon - is removed on exit, also when the test fails: each is
# registered with on_exit (tests/lib/common.sh) as it is made.
#
# The layout a test container sees (see setup.sh): busybox, the host's /lib/x86_64-linux-gnu, the fake
# libcuda.so.1 in /opt/fakegpu, cuda_memcheck in /opt/workloads, the test's state directory in /state and
# the fake GPU daemon's directory $FAKEGPU_DIR at the same path as on the host.
set -euo pipefail

CT_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$CT_SRC/../tests/lib/common.sh"
build_tree_paths
FAIL_LOGS+=('state/*.err' 'work*/*.log')
HEALTHY_SECS=15
# The root file system setup.sh builds (CT_OUT: another place for it than the build tree).
CT_OUT=$(readlink -f "${CT_OUT:-$BUILD_DIR/test-containers}")
ROOTFS=$CT_OUT/rootfs
ROOTFS_TAR=$CT_OUT/rootfs.tar
# Real paths: runc hands bind-mount sources to CRIU as they are written, and CRIU cannot mount through a
# symbolic link.
canon() { readlink -f "$1" 2>/dev/null || echo "$1"; }
CRIU=$(canon "$CRIU") PLUGIN_DIR=$(canon "$PLUGIN_DIR") FAKE_LIB=$(canon "$FAKE_LIB")
FAKE_DAEMON=$(canon "$FAKE_DAEMON") MEMCHECK=$(canon "$MEMCHECK")
# Parent of every test's fake GPU directory; mounted into the containers at the same path.
CT_RUN=/run/cuda-criu-ct

T=""            # this test's temporary directory
DAEMON_PID=""

# ct_setup RUNTIME...: skips (77) unless root and every RUNTIME is installed; builds the root file
# system if missing; creates $T and starts the fake GPU daemon (on the host, in $CT_RUN/<test>: the
# containers reach it through the bind mount). What it creates is removed on exit (on_exit,
# tests/lib/common.sh), after what the test registers there.
# keep_etc FILE...: each FILE as it is now (or its absence), put back when the test exits, whatever became
# of the call that changes it (bench.py puts back what it writes into /etc, unless it is killed).
keep_etc() {
	local f kept
	mkdir -p "$T/etc-kept"
	for f in "$@"; do
		kept=$T/etc-kept/${f//\//_}
		[ ! -e "$f" ] || cp -p "$f" "$kept"
		on_exit "if [ -e '$kept' ]; then cp -p '$kept' '$f'; else rm -f '$f'; fi"
	done
}

ct_setup() {
	TEST_NAME=${TEST_NAME:-$(basename "$0" .sh)}
	[ "$(id -u)" -eq 0 ] || skip "container tests need root (CRIU, runc)"
	local r
	for r in "$@"; do
		command -v "$r" >/dev/null || skip "$r is not installed (test-containers/setup.sh installs it)"
	done
	command -v jq >/dev/null || skip "jq is not installed (test-containers/setup.sh installs it)"
	[ -x "$CRIU" ] || fail "no CRIU at $CRIU: run scripts/build-criu.sh"
	for r in "$PLUGIN_DIR/cuda_plugin.so" "$FAKE_LIB" "$FAKE_DAEMON" "$MEMCHECK"; do
		[ -e "$r" ] || fail "$r is missing: build the project first"
	done
	CT_OUT=$CT_OUT bash "$CT_SRC/setup.sh" --no-install || fail "cannot build the root file system"
	T=$(canon "$(mktemp -d /tmp/cuda-criu-ct.XXXXXX)")
	if [ -z "${KEEP_TMP:-}" ]; then on_exit 'rm -rf "$T"'; else log "temporary files kept in $T"; fi
	on_exit 'rmdir "$CT_RUN"'
	on_exit 'rm -rf "$FAKEGPU_DIR"'
	on_exit 'kill "$DAEMON_PID"; wait "$DAEMON_PID"'
	mkdir -p "$T/state" "$CT_RUN"
	start_watchdog
	start_fake_gpu_daemon "$(mktemp -d "$CT_RUN/XXXXXX")"
}

# expect_still STATE: the workload does not advance for a second (checkpointed, paused or gone).
expect_still() {
	local state=$1 a b
	a=$(state_value "$state" iterations)
	sleep 1
	b=$(state_value "$state" iterations)
	[ "$a" = "$b" ] || fail "$state advanced from $a to $b while it should stand still"
}

# expect_resumed STATE AT-DUMP WHAT: the restored workload writes STATE, runs on healthy (expect_healthy)
# and counts on from AT-DUMP, its iteration when checkpointed (a new process would count from 0).
expect_resumed() {
	local state=$1 at_dump=$2 what=$3 now
	wait_for "the restored workload to write $state" 10 grep -q "^iterations=" "$state"
	expect_healthy "$state"
	now=$(state_value "$state" iterations)
	[ "$now" -ge "$at_dump" ] || fail "$what: iterations went back from $at_dump to $now: not the checkpointed process"
	log "$what: data intact, iteration $at_dump -> $now"
}

# The command line of a workload in a container: cuda_memcheck against the fake GPU, state in /state,
# its stderr into /state/NAME.err (container stdio is /dev/null: CRIU cannot restore a terminal or a
# file outside the container).
memcheck_cmd() { # NAME MB [cuda_memcheck options...]
	local name=$1 mb=$2
	shift 2
	printf '%s' "exec /opt/workloads/cuda_memcheck --mb $mb --state /state/$name --interval-ms 20 $* 2>>/state/$name.err"
}

# ---------------------------------------------------------------------------------------------------
# runc

# Our runc state lives in $T: `runc list` of others is not touched, and cleanup is complete.
RUNC_ROOT=""
runc_() { runc --root "$RUNC_ROOT" --log "$T/runc.log" --criu "$CRIU" "$@"; }

runc_setup() {
	RUNC_ROOT=$T/runc-root
	mkdir -p "$RUNC_ROOT"
	on_exit 'runc_cleanup'
}

runc_cleanup() {
	local id
	for id in $(runc --root "$RUNC_ROOT" list -q 2>/dev/null); do
		runc --root "$RUNC_ROOT" resume "$id"
		runc --root "$RUNC_ROOT" kill "$id" KILL
		runc --root "$RUNC_ROOT" delete -f "$id"
	done
}

# make_bundle DIR SHELL-COMMAND: a hand-written OCI config for a GPU test container: the root file
# system read-only, the fake GPU's pieces bind-mounted, its own pid, mount, ipc, uts and network
# namespaces (the network one has only a loopback: CRIU dumps and restores it).
make_bundle() {
	local dir=$1 cmd=$2
	oci_config "$dir/config.json" --root "$ROOTFS" --hostname cuda-ct --cmd "$cmd" --devpts --netns --rbind \
		--env PATH=/bin --env LD_LIBRARY_PATH=/opt/fakegpu --env "FAKEGPU_DIR=$FAKEGPU_DIR" \
		--cap CAP_KILL --cap CAP_AUDIT_WRITE --cap CAP_NET_BIND_SERVICE \
		--bind "$(readlink -f /lib/x86_64-linux-gnu)" /lib/x86_64-linux-gnu ro \
		--bind "$(dirname "$FAKE_LIB")" /opt/fakegpu ro --bind "$(dirname "$MEMCHECK")" /opt/workloads ro \
		--bind "$T/state" /state rw --bind "$CT_RUN" "$CT_RUN" rw
}

# The environment CRIU gets from runc: our plugin's directory, the fake driver for the plugin, and the
# fake GPU daemon's directory for that driver.
criu_env() (
	export CRIU_LIBS_DIR=$PLUGIN_DIR CUDA_CRIU_LIBCUDA=$FAKE_LIB FAKEGPU_DIR=$FAKEGPU_DIR
	"$@"
)

runc_start() { # ID BUNDLE
	# The container's stdio is runc's: /dev/null (CRIU cannot restore a file outside the container).
	runc_ run -d --bundle "$2" "$1" </dev/null >/dev/null 2>&1 || fail "runc run $1 failed"
}

# runc_start_memcheck ID MB: a container running one cuda_memcheck of MB MiB (state in $T/state/one,
# bundle in $T/bundle), started and verifying its device memory.
runc_start_memcheck() {
	make_bundle "$T/bundle" "$(memcheck_cmd one "$2")"
	runc_start "$1" "$T/bundle"
	wait_for "the workload to fill its device memory" 20 test -f "$T/state/one"
	expect_healthy "$T/state/one"
}

runc_status() { runc_ state "$1" 2>/dev/null | jq -r .status; }
runc_pid() { runc_ state "$1" 2>/dev/null | jq -r .pid; }

# runc_checkpoint ID IMAGES [runc checkpoint options...]: the CRIU log goes to $T/work-ID-dump/dump.log.
runc_checkpoint() {
	local id=$1 img=$2
	shift 2
	local work=$T/work-$id-dump
	mkdir -p "$img" "$work"
	local rc=0
	criu_env runc_ checkpoint --image-path "$img" --work-path "$work" \
		"$@" "$id" </dev/null >"$T/checkpoint-$id.log" 2>&1 || rc=$?
	cp "$work/dump.log" "$T/dump.log" 2>/dev/null || true
	return $rc
}

# runc_restore ID BUNDLE IMAGES [runc restore options...]: the CRIU log goes to $T/restore.log.
runc_restore() {
	local id=$1 bundle=$2 img=$3
	shift 3
	local work=$T/work-$id-restore
	mkdir -p "$work"
	local rc=0
	criu_env runc_ restore -d --bundle "$bundle" --image-path "$img" \
		--work-path "$work" "$@" "$id" </dev/null >/dev/null 2>&1 || rc=$?
	cp "$work/restore.log" "$T/restore.log" 2>/dev/null || true
	return $rc
}

runc_remove() { # ID
	runc_ kill "$1" KILL 2>/dev/null || true
	wait_for "container $1 to stop" 10 sh -c "[ \"\$(runc --root $RUNC_ROOT state $1 2>/dev/null | jq -r .status)\" != running ]"
	runc_ delete -f "$1" 2>/dev/null || true
}

# ---------------------------------------------------------------------------------------------------
# A "second host" for a podman test: the test script run again (on_second_host) in a private mount
# namespace in which podman's and runc's directories (/var/lib/containers/storage,
# /run/containers/storage, /run/libpod, /run/runc) are empty ones, so that podman there has a store of
# its own at the usual paths. There the script's function second_host runs; the daemon, $FAKEGPU_DIR, $T
# and the registry ($REGISTRY, registry_start) stay the first part's.

on_second_host() {
	CT_T=$T CT_REGISTRY=$REGISTRY FAKEGPU_DIR=$FAKEGPU_DIR CT_OUT=$CT_OUT PLUGIN_DIR=$PLUGIN_DIR CRIU=$CRIU \
		unshare -m --propagation private bash "$0" --second-host || fail "the second host failed"
}

# second_host_part "$@": called by the script before its own part; with --second-host (on_second_host),
# runs second_host and exits.
second_host_part() {
	[ "${1:-}" = --second-host ] || return 0
	TEST_NAME=$(basename "$0" .sh)/second-host
	T=${CT_T:?} # with the daemon and $FAKEGPU_DIR, the first part's: removed by it, not here
	REGISTRY=${CT_REGISTRY:-} # likewise: reached on the loopback, which both parts share
	local d
	for d in /var/lib/containers/storage /run/containers/storage /run/libpod /run/runc; do
		mkdir -p "$T/host2$d" "$d"
		mount --bind "$T/host2$d" "$d"
	done
	second_host
	exit 0
}

# ---------------------------------------------------------------------------------------------------
# podman (with runc)
#
# podman runs CRIU through runc, but passes neither its environment nor a CRIU path to it: the plugin is
# enabled as a user would, with `libdir` in /etc/criu/runc.conf, and its options in
# /etc/criu/cuda_plugin.conf (both written for the test and removed after it; existing ones are kept
# aside and put back). Two things only the test needs go through a wrapper named runc (podman checks
# that the runtime is called runc or crun): our CRIU (`runc --criu`) and FAKEGPU_DIR for the fake
# libcuda that the plugin loads inside CRIU. podman itself looks for `criu` in PATH.
POD_IMAGE=localhost/cuda-criu-ct:test
POD_OPTS=()   # global podman options (a second store for the "second host")

pod() { PATH=$T/bin:$PATH podman ${POD_OPTS[@]+"${POD_OPTS[@]}"} "$@"; }

# on_pod_exit ARGS...: `pod ARGS...` (with the current store) at exit.
on_pod_exit() {
	local cmd="PATH=$T/bin:\$PATH podman" a
	for a in ${POD_OPTS[@]+"${POD_OPTS[@]}"} "$@"; do cmd+=" $(printf '%q' "$a")"; done
	on_exit "$cmd"
}

podman_setup() {
	mkdir -p "$T/bin"
	ln -s "$CRIU" "$T/bin/criu"
	# The sanitizer options of a sanitized CRIU (scripts/test-sanitized.sh) must reach it too.
	cat >"$T/bin/runc" <<EOR
#!/bin/sh
export FAKEGPU_DIR=$FAKEGPU_DIR
${ASAN_OPTIONS:+export ASAN_OPTIONS='$ASAN_OPTIONS'}
${UBSAN_OPTIONS:+export UBSAN_OPTIONS='$UBSAN_OPTIONS'}
exec $(command -v runc) --criu $CRIU "\$@"
EOR
	chmod +x "$T/bin/runc"
	criu_conf_setup
	pod_import_image
}

# pod_runtime_conf: podman's runtime runc is our wrapper, in a containers.conf of the test's. Needed where
# podman picks the runtime itself: `podman container restore IMAGE` takes the one the image names.
pod_runtime_conf() {
	printf '[engine]\nruntime = "runc"\n[engine.runtimes]\nrunc = ["%s"]\n' "$T/bin/runc" >"$T/containers.conf"
	export CONTAINERS_CONF=$T/containers.conf
}

# criu_conf_setup: our plugin through CRIU's configuration, as runc has CRIU read it under any runtime:
# `libdir` in /etc/criu/runc.conf, the plugin's options in /etc/criu/cuda_plugin.conf. Files there are
# kept aside and put back at exit.
criu_conf_setup() {
	if [ ! -d /etc/criu ]; then
		mkdir /etc/criu
		on_exit 'rmdir /etc/criu' # runs after the files below are removed
	fi
	local f
	for f in runc.conf cuda_plugin.conf; do
		if [ -e "/etc/criu/$f" ]; then
			mv "/etc/criu/$f" "$T/saved-$f"
			on_exit "mv '$T/saved-$f' '/etc/criu/$f'"
		fi
		on_exit "rm -f '/etc/criu/$f'"
	done
	echo "libdir $PLUGIN_DIR" >/etc/criu/runc.conf
	echo "libcuda=$FAKE_LIB" >/etc/criu/cuda_plugin.conf
}

# The busybox image, imported from setup.sh's tarball into the current store (no registry here).
pod_import_image() {
	pod import "$ROOTFS_TAR" "$POD_IMAGE" >"$T/import.log" 2>&1 || fail "podman import failed: $(cat "$T/import.log")"
	on_pod_exit rmi -f "$POD_IMAGE"
}

# pod_run NAME SHELL-COMMAND [podman run options...]: a GPU test container (fake GPU).
pod_run() {
	local name=$1 cmd=$2
	shift 2
	on_pod_exit rm -f -t 0 "$name"
	# stdio: /dev/null (podman -d gives the container none of the caller's), no network but a loopback
	# (CRIU dumps that namespace), the ulimits CRIU needs to restore here.
	pod run -d --name "$name" --runtime "$T/bin/runc" --network none \
		--ulimit nofile=20000:20000 --ulimit nproc=32768:32768 \
		-v "$(readlink -f /lib/x86_64-linux-gnu)":/lib/x86_64-linux-gnu:ro \
		-v "$(dirname "$MEMCHECK")":/opt/workloads:ro \
		-v "$T/state":/state \
		"$@" "$POD_IMAGE" /bin/sh -c "$cmd" </dev/null >"$T/run-$name.log" 2>&1 ||
		fail "podman run $name failed: $(cat "$T/run-$name.log")"
}

# The fake GPU the plain way: the library directory and the daemon's directory bind-mounted.
POD_FAKEGPU=()
pod_fakegpu_mounts() {
	POD_FAKEGPU=(-v "$(dirname "$FAKE_LIB")":/opt/fakegpu:ro -v "$CT_RUN:$CT_RUN"
		-e LD_LIBRARY_PATH=/opt/fakegpu -e "FAKEGPU_DIR=$FAKEGPU_DIR")
}

pod_status() { pod inspect -f '{{.State.Status}}' "$1" 2>/dev/null; }
pod_pid() { pod inspect -f '{{.State.Pid}}' "$1" 2>/dev/null; }
pod_userdata() { echo "$(pod inspect -f '{{.StaticDir}}' "$1" 2>/dev/null)"; }

# Copies CRIU's log of a container's last checkpoint or restore to $T/dump.log or $T/restore.log
# (podman keeps them only with --keep).
pod_log() { # NAME dump|restore
	local dir
	dir=$(pod_userdata "$1")
	rm -f "$T/$2.log"
	if [ -n "$dir" ]; then cp "$dir/$2.log" "$T/$2.log" 2>/dev/null || true; fi
	[ -f "$T/$2.log" ] || fail "no CRIU $2.log of $1 (in '$dir')"
}

# ---------------------------------------------------------------------------------------------------
# A registry for checkpoint images: Debian's docker-registry (distribution 2.8) run by the test, on
# 127.0.0.1 only, plain HTTP (podman push/pull --tls-verify=false), its configuration and storage in $T.
# The test runs it itself, not through the package's service: the test machine may have no systemd.
REGISTRY=""       # HOST:PORT of the test's registry (registry_start)
REGISTRY_PID=""

# free_port: a TCP port of 127.0.0.1 on which nothing listens now.
free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# registry_start: the registry on a free port, in its own session, its log in $T/registry.log, stopped
# at exit; sets REGISTRY once it accepts connections (10 s at most). A test that calls it names
# docker-registry to ct_setup, which skips where it is not installed.
registry_start() {
	local port
	port=$(free_port)
	mkdir -p "$T/registry"
	cat >"$T/registry/config.yml" <<EOC
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: $T/registry/data
http:
  addr: 127.0.0.1:$port
EOC
	setsid docker-registry serve "$T/registry/config.yml" </dev/null >"$T/registry.log" 2>&1 &
	REGISTRY_PID=$!
	on_exit 'kill "$REGISTRY_PID"; wait "$REGISTRY_PID"'
	# Up when its port accepts a connection (bash's /dev/tcp); a registry that exited fails at once.
	timeout 10 bash -c "until (: </dev/tcp/127.0.0.1/$port) 2>/dev/null; do kill -0 $REGISTRY_PID 2>/dev/null || exit; sleep 0.1; done" ||
		fail "docker-registry is not listening on 127.0.0.1:$port: it exited, or 10 s passed (config $T/registry/config.yml)"
	REGISTRY=127.0.0.1:$port
}

# bench_bundle DIR: a bundle laid out as scripts/gpu-bundle.sh lays it out, for a dry run of bench.py (fake
# GPU): CRIU, the plugin, the CUDA workload, the benchmark's scripts, the stand-in server (serving_workload.py,
# with the real server's HTTP front as serving_front.py: STANDIN_FRONT).
bench_bundle() {
	local b=$1 top
	top=$(cd "$CT_SRC/.." && pwd)
	mkdir -p "$b/sbin" "$b/plugin" "$b/intree" "$b/bin"
	ln -s "$CRIU" "$b/sbin/criu"
	ln -s "$PLUGIN_DIR/cuda_plugin.so" "$b/plugin/cuda_plugin.so"
	cp "$MEMCHECK" "$b/bin/cuda_memcheck" # a copy: the containers see the bundle, not the build tree
	cp "$top"/benchmarks/bench*.py "$b/"
	cp "$top/tests/e2e/serving_standin.py" "$b/serving_workload.py"
	cp "$top/tests/gpu/serving_workload.py" "$b/serving_front.py"
}

# expect_bench_options LOGS PATH BENCH-LOG: a dry run of bench.py --PATH (registry, cri) with ours and
# ours-zstd: ours-zstd's dump of 1g compressed (compress=zstd reached the plugin through
# /etc/criu/cuda_plugin.conf), ours's did not; the run's figures of each path logged.
expect_bench_options() {
	local logs=$1 path=$2 bench_log=$3 line
	expect_log "$logs/1g-ours-zstd-$path-dump.log" "compressed \(zstd-1\)" \
		"ours-zstd's dump did not compress: compress=zstd did not reach the plugin through /etc/criu/cuda_plugin.conf"
	if grep -q "compressed (zstd" "$logs/1g-ours-$path-dump.log"; then fail "ours's dump compressed"; fi
	grep "s from the pull, data verified" "$bench_log" | sed 's/^\[bench [0-9:]*\] //' | while read -r line; do log "$line"; done
}

# oci_image_tar OUT NAME CMD...: an OCI archive of setup.sh's root file system as the only layer, with CMD
# as its command, whose image is called NAME (ctr images import).
oci_image_tar() {
	local out=$1 name=$2 o=$T/oci layer cfg man
	shift 2
	rm -rf "$o"
	mkdir -p "$o/blobs/sha256"
	layer=$(sha256sum "$ROOTFS_TAR" | cut -d' ' -f1)
	cp "$ROOTFS_TAR" "$o/blobs/sha256/$layer"
	jq -cn --arg l "sha256:$layer" --args '{architecture: "amd64", os: "linux",
		config: {Env: ["PATH=/bin"], Cmd: $ARGS.positional}, rootfs: {type: "layers", diff_ids: [$l]}}' "$@" >"$o/config.json"
	cfg=$(sha256sum "$o/config.json" | cut -d' ' -f1)
	mv "$o/config.json" "$o/blobs/sha256/$cfg"
	jq -cn --arg c "sha256:$cfg" --argjson cs "$(stat -c %s "$o/blobs/sha256/$cfg")" \
		--arg l "sha256:$layer" --argjson ls "$(stat -c %s "$ROOTFS_TAR")" '{schemaVersion: 2,
		mediaType: "application/vnd.oci.image.manifest.v1+json",
		config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $c, size: $cs},
		layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar", digest: $l, size: $ls}]}' >"$o/manifest.json"
	man=$(sha256sum "$o/manifest.json" | cut -d' ' -f1)
	jq -cn --arg m "sha256:$man" --argjson ms "$(stat -c %s "$o/manifest.json")" --arg name "$name" \
		'{schemaVersion: 2, manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json",
		digest: $m, size: $ms, platform: {architecture: "amd64", os: "linux"},
		annotations: {"io.containerd.image.name": $name}}]}' >"$o/index.json"
	mv "$o/manifest.json" "$o/blobs/sha256/$man"
	echo '{"imageLayoutVersion": "1.0.0"}' >"$o/oci-layout"
	tar -C "$o" -cf "$out" oci-layout index.json blobs
	rm -rf "$o"
}
