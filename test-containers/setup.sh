#!/usr/bin/env bash
# Prepares the container tests: installs (with apt, only what is missing) the container runtimes and
# tools they use, containerd 2.1 for the CRI tests (containerd2-setup.sh: Debian's unstable package,
# unpacked into $CT_OUT/containerd2), and builds a small busybox root file system for the test containers.
#
#   test-containers/setup.sh [--no-install]        (as root)
#
# The root file system goes to $CT_OUT/rootfs and, packed for `podman import`, $CT_OUT/rootfs.tar; CT_OUT
# defaults to $BUILD_DIR/test-containers, BUILD_DIR to build/ of this checkout.
# With --no-install nothing is installed (the tests call it that way to build a missing root file system).
#
# The root file system holds only busybox (static) and empty mount points. Everything else is bind-mounted
# at run time by the tests, read-only:
#   /lib/x86_64-linux-gnu        the host's C library and loader (the workloads are linked against glibc)
#   /opt/fakegpu                 $BUILD_DIR/tests/fakegpu: the fake libcuda.so.1
#   /opt/workloads               $BUILD_DIR/tests/workloads: cuda_memcheck
#   /state                       a directory of the test (read-write): the workloads' state files
#   /run/cuda-criu-ct            holds the fake GPU daemon's directory of each test (socket, client FIFOs,
#                                dev/nvidia*), at the same path as on the host: the daemon runs on the
#                                host, and the fake library in CRIU recognises a client by its FIFO's path
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$top/build}
install=1
[ "${1:-}" = --no-install ] && install=0

setup_log() { echo "[test-containers/setup] $*" >&2; }

if [ $install = 1 ]; then
	# runc and podman (podman brings conmon and the CNI plugins), containerd (its ctr client; the tests
	# start a containerd of their own), crun (Debian's is built without CRIU: its test says so and
	# skips), buildah (Kubernetes checkpoint images), docker-registry (the registry the checkpoint images
	# go through: the tests run their own, lib.sh's registry_start), a static busybox for the root file
	# system, iptables for CRIU's network lock, jq to read runtimes' JSON, python3-grpc-tools and
	# python3-h2 for the CRI tests' client (its code generated from the CRI's api.proto, its calls over h2).
	pkgs=(runc podman containerd crun buildah docker-registry busybox-static iptables jq python3-grpc-tools python3-h2)
	missing=()
	for p in "${pkgs[@]}"; do
		dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || missing+=("$p")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		[ "$(id -u)" -eq 0 ] || { setup_log "run as root to install: ${missing[*]}"; exit 1; }
		setup_log "installing: ${missing[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	fi
	# containerd 2.1 (and the CRI's api.proto) for the CRI tests, in a prefix of its own beside Debian
	# 12's containerd 1.6.
	BUILD_DIR=$BUILD_DIR "$top/test-containers/containerd2-setup.sh"
fi

out=${CT_OUT:-$BUILD_DIR/test-containers}
rootfs=$out/rootfs
# A static busybox (busybox-static): the root file system has no libraries of its own.
busybox=""
for b in /bin/busybox /usr/bin/busybox $(command -v busybox || true); do
	if [ -x "$b" ] && ! LC_ALL=C readelf -l "$b" 2>/dev/null | grep -q 'program interpreter'; then
		busybox=$b
		break
	fi
done
[ -n "$busybox" ] || { setup_log "no static busybox: install busybox-static"; exit 1; }

# Rebuilt when missing, damaged or older than this script.
if [ -f "$out/rootfs.tar" ] && [ "$out/rootfs.tar" -nt "$0" ] && [ -x "$rootfs/bin/sh" ]; then
	exit 0
fi
setup_log "building the busybox root file system in $rootfs"
rm -rf "$rootfs" "$out/rootfs.tar"
mkdir -p "$rootfs"/{bin,dev,proc,sys,tmp,etc,root,state,opt/fakegpu,opt/workloads,run/cuda-criu-ct}
mkdir -p "$rootfs"/lib/x86_64-linux-gnu "$rootfs"/lib64
chmod 1777 "$rootfs/tmp"
cp "$busybox" "$rootfs/bin/busybox"
for applet in $("$rootfs/bin/busybox" --list); do
	[ "$applet" = busybox ] || ln -sf busybox "$rootfs/bin/$applet"
done
# The loader the workloads name (/lib64/ld-linux-x86-64.so.2) is found in the bind-mounted library dir.
ln -s /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$rootfs/lib64/ld-linux-x86-64.so.2"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
printf 'cuda-criu-ct\n' >"$rootfs/etc/hostname"
tar -C "$rootfs" -cf "$out/rootfs.tar.tmp" .
mv "$out/rootfs.tar.tmp" "$out/rootfs.tar"
setup_log "ready: $rootfs ($(du -sh "$rootfs" | cut -f1)), $out/rootfs.tar"
