#!/usr/bin/env bash
# Builds the folder that the real-GPU tests need on a machine that has the NVIDIA driver but neither CRIU
# nor its libraries (see docs/gpu-results.md):
#
#   scripts/gpu-bundle.sh [--podman] [--cri]  -> build/gpu-bundle/
#
#   gpu-bundle/
#     run-gpu-tests.sh, lib.sh, NN-GROUP.sh, ... the scripts from tests/gpu/: the runner, its helpers, the test
#                                                 groups, the workloads (torch_workload.py, ...)
#     common.sh                                   the shell helpers they share with the other tests (tests/lib/)
#     sbin/criu                                   CRIU 4.2.1 (scripts/build-criu.sh)
#     lib/                                        the shared libraries criu and the plugins need, but glibc's
#     plugin/cuda_plugin.so                       this project's plugin (the only .so there: CRIU's --libdir)
#     intree/cuda_plugin.so                       CRIU's own CUDA plugin, for comparison
#     bin/cuda_memcheck, bin/cuda_server          the driver-API test workloads (cuda_server: 80-serving.sh)
#     bin/cuda-criu, bin/cuda-checkpoint          the CLI, and its cuda-checkpoint-compatible name
#     bin/thp_populate                            the checkpoint buffer's populate, fragmented memory or not
#     sbin/runc                                   this machine's runc, when installed (the container test)
#     bench.py                                    the benchmark (benchmarks/bench.py)
#     podman-kit.tar.xz                           with --podman: podman, conmon and docker-registry as this
#                                                 machine has them (Debian's), with the libraries they need
#                                                 (bin/, lib/ with RUNPATHs), for bench.py --registry;
#                                                 compressed (~16 MiB) to fit the GPU machine's transfer
#     cri-kit.tar.xz                              with --cri: containerd 2.1 and its runc shim (from
#                                                 test-containers/containerd2-setup.sh), a static busybox, the
#                                                 CRI client (cri.py, its messages' code generated from the
#                                                 CRI's api.proto) with the pure-Python packages it needs
#                                                 (Debian's h2, hpack, hyperframe, protobuf), for bench.py
#                                                 --cri (~17 MiB)
#     bundle-info.txt                             what went in, and from which sources
#
# Everything bundled finds its libraries in lib/ through its own RUNPATH, set on the bundled copies: criu,
# cuda-criu and the plugins $ORIGIN/../lib, each library in lib/ $ORIGIN. Each object needs its own, as a
# RUNPATH serves only the object's direct dependencies (criu's would not reach libunistring, which
# libgnutls needs). So they run from the bundle as they are, without LD_LIBRARY_PATH, and the script checks
# that every library the bundle ships resolves from lib/ (ldd). The workloads use the target's own
# libraries, libcuda.so.1 above all. lib/ holds no libcuda, so a RUNPATH never hides the target's driver. The folder is rebuilt from scratch each time (a few MB of
# copies), so a second run costs only the up-to-date checks of CRIU and of the CMake build.
#
# Environment: BUILD_DIR (default: build), JOBS (default: nproc), BUNDLE_DIR (default: $BUILD_DIR/gpu-bundle).
set -euo pipefail

podman_kit="" cri_kit=""
for a in "$@"; do
	case "$a" in
	--podman) podman_kit=1 ;;
	--cri) cri_kit=1 ;;
	*) echo "usage: $0 [--podman] [--cri]" >&2; exit 2 ;;
	esac
done

top=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$top/build}
jobs=${JOBS:-$(nproc)}
criu_ver=4.2.1
out=${BUNDLE_DIR:-$build/gpu-bundle}
max_mb=64 # what the GPU machine's file transfer takes

log() { printf '[gpu-bundle] %s\n' "$*" >&2; }
die() { printf '[gpu-bundle] error: %s\n' "$*" >&2; exit 1; }

# glibc's own libraries come from the target (Ubuntu 24.04 has glibc 2.39, newer than ours). libstdc++ and
# libgcc_s too: the target's are newer and backward compatible, an older copy first in the search path could
# only break things. linux-vdso has no file.
is_system_lib() {
	case "$(basename "$1")" in
	libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | ld-linux*.so.* | \
		libstdc++.so.* | libgcc_s.so.* | linux-vdso.so.*) return 0 ;;
	esac
	return 1
}

# The resolved paths of the shared libraries one ELF file needs (recursively, as ldd reports them).
needed_libs() {
	local line
	ldd "$1" | while read -r line; do
		case "$line" in
		*"not found"*) die "$1 needs a library that is missing here: $line" ;;
		*"=> /"*) line=${line#*=> }; echo "${line%% (*}" ;;
		esac
	done
}

# No RPATH/RUNPATH may point into this build tree: on the target the system loader must find the real
# libcuda.so.1 (and never a stub or the fake one from tests/fakegpu).
check_rpath() {
	local f=$1 rp
	rp=$(readelf -d "$f" | sed -n 's/.*(\(RPATH\|RUNPATH\)).*\[\(.*\)\]/\2/p')
	[ -z "$rp" ] && return 0
	log "$(basename "$f") carries an RPATH/RUNPATH ($rp): removing it from the bundled copy"
	command -v patchelf >/dev/null || die "patchelf is needed to remove it (apt-get install patchelf)"
	patchelf --remove-rpath "$f"
	[ -z "$(readelf -d "$f" | grep -E 'R(UN)?PATH')" ] || die "could not remove the RPATH of $f"
}

# set_runpath FILE DIR: FILE finds its libraries in DIR ('$ORIGIN/../lib' for a file in a folder beside
# lib/, '$ORIGIN' for one in lib/) wherever the bundle lies. RUNPATH, not LD_LIBRARY_PATH: what the program
# starts (criu from cuda-criu, the workloads) keeps the target's libraries.
set_runpath() {
	patchelf --set-rpath "$2" "$1"
	[ "$(readelf -d "$1" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')" = "$2" ] || die "could not set the RUNPATH of $1 to $2"
}

# check_resolved FILE...: every library each FILE needs that lib/ holds is loaded from lib/, by the loader's
# own search (ldd, with no LD_LIBRARY_PATH), not found on this machine's /lib where the target has none.
check_resolved() {
	local f name path
	for f in "$@"; do
		env -u LD_LIBRARY_PATH ldd "$f" | while read -r name _ path _; do
			[ -f "$tmp/lib/$name" ] || continue
			[ "$(realpath "$path")" = "$tmp/lib/$name" ] || die "$(basename "$f") loads $name from $path, not from the bundle's lib/"
		done
	done
}

# 1. CRIU (does nothing when it is up to date).
command -v patchelf >/dev/null || die "patchelf is needed (scripts/install-deps.sh or apt-get install patchelf)"
"$top/scripts/build-criu.sh" "$criu_ver"
criu_root=$build/criu/$criu_ver/install
[ -x "$criu_root/sbin/criu" ] || die "no criu in $criu_root/sbin"
[ -f "$criu_root/lib/criu-intree/cuda_plugin.so" ] || die "CRIU's in-tree CUDA plugin is missing in $criu_root"

# 2. The plugin and the workload.
if [ ! -f "$build/CMakeCache.txt" ]; then
	log "configuring $build"
	cmake -S "$top" -B "$build" >/dev/null
fi
targets=(cuda_plugin cuda_memcheck cuda_server cuda-criu thp_populate)
has_target() { cmake --build "$build" --target help 2>/dev/null | grep -w "$1" >/dev/null; }
for w in cuda_memcheck cuda_server; do
	has_target $w && continue
	[ -f "$top/tests/workloads/$w.c" ] || die "tests/workloads/$w.c is missing: the bundle needs the $w workload"
	log "re-running CMake: the $w target is not known to $build yet"
	cmake -S "$top" -B "$build" >/dev/null
	has_target $w || die "no $w target after configuring (is tests/workloads in the CMake tree?)"
done
log "building ${targets[*]}"
cmake --build "$build" --target "${targets[@]}" -j"$jobs" >"$build/gpu-bundle.build.log" 2>&1 ||
	{ tail -n 30 "$build/gpu-bundle.build.log" >&2; die "build failed (log: $build/gpu-bundle.build.log)"; }
plugin=$build/plugin/cuda_plugin.so
memcheck=$build/tests/workloads/cuda_memcheck
server=$build/tests/workloads/cuda_server
[ -f "$plugin" ] || die "no $plugin after the build"
[ -x "$memcheck" ] || die "no $memcheck after the build"
[ -x "$server" ] || die "no $server after the build"
cli=$build/bin/cuda-criu
[ -x "$cli" ] || die "no $cli after the build"

# 3. Assemble in a fresh folder next to the old one, then swap: an interrupted run never leaves half a bundle.
tmp=$out.tmp
rm -rf "$tmp"
mkdir -p "$tmp"/{sbin,lib,plugin,intree,bin}
install -m 755 "$criu_root/sbin/criu" "$tmp/sbin/criu"
install -m 644 "$criu_root/lib/criu-intree/cuda_plugin.so" "$tmp/intree/cuda_plugin.so"
install -m 644 "$plugin" "$tmp/plugin/cuda_plugin.so"
install -m 755 "$memcheck" "$tmp/bin/cuda_memcheck"
install -m 755 "$server" "$tmp/bin/cuda_server"
install -m 755 "$cli" "$tmp/bin/cuda-criu"
install -m 755 "$build/bin/thp_populate" "$tmp/bin/thp_populate"
# CRIU's in-tree plugin runs `cuda-checkpoint` from PATH: ours answers that command line (benchmarks).
ln -s cuda-criu "$tmp/bin/cuda-checkpoint"
install -m 755 "$top/benchmarks/bench.py" "$tmp/bench.py"
install -m 644 "$top"/benchmarks/bench_*.py "$tmp/"
install -m 644 "$top/benchmarks/driver_restore_uffd.py" "$tmp/"
runc=$(command -v runc || true)
if [ -n "$runc" ]; then
	install -m 755 "$runc" "$tmp/sbin/runc"
else
	log "note: no runc here (test-containers/setup.sh installs it): the bundle's container test will skip"
fi
strip --strip-debug "$tmp/sbin/criu" "$tmp/intree/cuda_plugin.so" "$tmp/plugin/cuda_plugin.so" "$tmp/bin/cuda_memcheck" \
	"$tmp/bin/cuda_server" "$tmp/bin/cuda-criu" "$tmp/bin/thp_populate"

for f in "$tmp/sbin/criu" "$tmp/intree/cuda_plugin.so" "$tmp/plugin/cuda_plugin.so" "$tmp/bin/cuda-criu" \
	"$tmp/bin/thp_populate" ${runc:+"$tmp/sbin/runc"}; do
	needed_libs "$f"
done | sort -u | while read -r lib; do
	is_system_lib "$lib" && continue
	cp -L "$lib" "$tmp/lib/$(basename "$lib")"
done
chmod 644 "$tmp"/lib/*
for f in "$tmp"/lib/*; do
	case "$(basename "$f")" in libcuda.* | libnvidia*) die "$f would hide the target's driver" ;; esac
done

for f in "$tmp/sbin/criu" "$tmp/bin/cuda-criu" "$tmp/bin/thp_populate" "$tmp/plugin/cuda_plugin.so" \
	"$tmp/intree/cuda_plugin.so" ${runc:+"$tmp/sbin/runc"}; do
	set_runpath "$f" '$ORIGIN/../lib'
done
for f in "$tmp"/lib/*; do set_runpath "$f" '$ORIGIN'; done
check_resolved "$tmp/sbin/criu" "$tmp/bin/cuda-criu" "$tmp/bin/thp_populate" "$tmp/plugin/cuda_plugin.so" "$tmp/intree/cuda_plugin.so" \
	${runc:+"$tmp/sbin/runc"} "$tmp"/lib/*

# The workloads must use the target's libcuda.so.1 and nothing of ours.
for f in "$tmp/bin/cuda_memcheck" "$tmp/bin/cuda_server"; do check_rpath "$f"; done
readelf -d "$tmp/bin/cuda_memcheck" | grep -q 'NEEDED.*\[libcuda\.so\.1\]' ||
	log "note: cuda_memcheck does not list libcuda.so.1 as NEEDED (does it dlopen it?)"

for f in "$top"/tests/gpu/*; do
	[ -f "$f" ] || continue
	case "$f" in */CMakeLists.txt | */ctest-gpu.sh) continue ;; esac
	install -m "$([ -x "$f" ] && echo 755 || echo 644)" "$f" "$tmp/"
done
install -m 644 "$top/tests/lib/common.sh" "$tmp/common.sh"

# The podman kit (bench.py --registry): the build machine's podman, conmon and docker-registry with every
# library they need but glibc's, each finding them through its RUNPATH as the bundle's own binaries do; kept
# in the build tree and made again only when one of them is newer.
if [ -n "$podman_kit" ]; then
	kit_tar=$build/podman-kit.tar.xz
	progs=()
	for p in podman conmon docker-registry; do
		f=$(command -v $p || true)
		[ -n "$f" ] || [ $p != conmon ] || f=$(ls /usr/libexec/podman/conmon 2>/dev/null || true)
		[ -n "$f" ] || die "--podman: no $p here (test-containers/setup.sh installs podman and docker-registry)"
		progs+=("$(readlink -f "$f")")
	done
	stale=""
	for f in "${progs[@]}"; do [ "$kit_tar" -nt "$f" ] || stale=1; done
	if [ -n "$stale" ]; then
		log "packing podman, conmon and docker-registry with their libraries into $kit_tar"
		kit=$build/podman-kit
		rm -rf "$kit"
		mkdir -p "$kit/bin" "$kit/lib"
		for f in "${progs[@]}"; do
			install -m 755 "$f" "$kit/bin/$(basename "$f")"
			needed_libs "$f"
		done | sort -u | while read -r lib; do
			is_system_lib "$lib" || cp -L "$lib" "$kit/lib/$(basename "$lib")"
		done
		chmod 644 "$kit"/lib/*
		for f in "$kit"/bin/*; do
			if readelf -d "$f" | grep -q NEEDED; then set_runpath "$f" '$ORIGIN/../lib'; fi
		done
		for f in "$kit"/lib/*; do set_runpath "$f" '$ORIGIN'; done
		env -u LD_LIBRARY_PATH "$kit/bin/podman" --version >/dev/null || die "the kit's podman does not run"
		tar -C "$kit" -cf - bin lib | xz -T0 -6 >"$kit_tar.tmp"
		mv "$kit_tar.tmp" "$kit_tar"
		rm -rf "$kit"
	fi
	install -m 644 "$kit_tar" "$tmp/podman-kit.tar.xz"
fi

# The CRI kit (bench.py --cri, laid out as bench_cri.py reads it): containerd and its shim are static Go
# binaries; the Python packages are pure Python, so any Python 3 runs the client (protobuf's compiled part,
# built for this machine's Python, left out).
if [ -n "$cri_kit" ]; then
	cd2=$build/test-containers/containerd2
	[ -x "$cd2/usr/bin/containerd" ] || CT_OUT=$build/test-containers bash "$top/test-containers/containerd2-setup.sh" ||
		die "--cri: cannot set up containerd 2.1 (test-containers/containerd2-setup.sh)"
	[ -x /bin/busybox ] || die "--cri: no static busybox here (busybox-static)"
	/usr/bin/python3 -c 'import grpc_tools, h2' 2>/dev/null || die "--cri: python3-grpc-tools and python3-h2 are needed"
	kit=$build/cri-kit
	rm -rf "$kit"
	mkdir -p "$kit/bin" "$kit/py"
	install -m 755 "$cd2/usr/bin/containerd" "$cd2/usr/bin/containerd-shim-runc-v2" /bin/busybox "$kit/bin/"
	install -m 644 "$top/test-containers/cri/cri.py" "$kit/py/"
	install -m 644 "$top/test-containers/cri/containerd-node.toml" "$kit/"
	/usr/bin/python3 "$top/test-containers/cri/cri.py" generate \
		"$cd2/usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto" "$kit/py" >/dev/null
	rm "$kit/py/api.proto"
	for m in h2 hpack hyperframe google/protobuf; do
		src=$(/usr/bin/python3 -c "import importlib, os; print(os.path.dirname(importlib.import_module('${m//\//.}').__file__))")
		mkdir -p "$kit/py/$m"
		(cd "$src" && find . -name '*.py' -exec cp --parents {} "$kit/py/$m/" \;)
	done
	# Without the site packages: what it loads comes from the kit.
	PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python /usr/bin/python3 -I -S -c "import sys; sys.path.insert(0, '$kit/py'); import cri, api_pb2, h2.connection" ||
		die "--cri: the kit's CRI client does not load"
	tar -C "$kit" -cf - bin py containerd-node.toml | xz -T0 -6 >"$tmp/cri-kit.tar.xz"
	rm -rf "$kit"
fi

{
	echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME") ($(uname -m))"
	echo "source=$(git -C "$top" describe --always --dirty 2>/dev/null || echo unknown)"
	echo "criu=$("$criu_root/sbin/criu" --version | tr '\n' ' ')"
	echo "criu_patches=$(cat "$build/criu/$criu_ver/stamp" 2>/dev/null || echo unknown)"
	echo "glibc_needed=$(objdump -T "$tmp"/sbin/criu "$tmp"/plugin/*.so "$tmp"/bin/* "$tmp"/lib/* 2>/dev/null |
		grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n1)"
	echo "libs=$(cd "$tmp/lib" && printf '%s ' *)"
	(cd "$tmp" && find . -type f ! -name bundle-info.txt | sort | xargs sha256sum)
} >"$tmp/bundle-info.txt"

rm -rf "$out"
mv "$tmp" "$out"

size=$(du -sb "$out" | cut -f1)
mb=$(( (size + 1048575) / 1048576 ))
[ "$mb" -le "$max_mb" ] || die "$out is $mb MiB, more than the $max_mb MiB the GPU machine's transfer takes"
log "bundle ready: $out ($mb MiB; newest glibc symbol needed: $(sed -n 's/^glibc_needed=//p' "$out/bundle-info.txt"))"
log "on the GPU machine: bash $(realpath --relative-to="$top" "$out" 2>/dev/null || echo "$out")/run-gpu-tests.sh"
