#!/usr/bin/env bash
# Makes the release files of this version (CMake's project(VERSION), the one place it is kept) into
# build/release/ (docs/packaging.md):
#
#   scripts/release.sh            -> build/release/
#
#   cuda-criu_VERSION_amd64.deb              the plugin, the CLI, the man pages, a commented
#                                            /etc/criu/cuda_plugin.conf, the docs (CPack, packaging/)
#   cuda-criu-criu_VERSION_amd64.deb         CRIU 4.2.1 with our patches, in /usr/lib/cuda-criu/sbin/criu
#   cuda-criu-VERSION-x86_64.tar.gz          the GPU bundle (scripts/gpu-bundle.sh) in a folder of that
#                                            name, with a README.md: runs where it is unpacked
#   cuda-criu-VERSION-x86_64.tar.gz.sha256   its checksum, for `sha256sum -c`
#
# It builds what is missing in the build tree first (scripts/setup.sh sets it up). tests/release/check.sh
# checks the result.
#
# Environment: BUILD_DIR (default: build), SOURCE_DATE_EPOCH (the time stamp of the files in the tarball
# and of the man pages; default: the last commit's).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$top/build}
out=$build/release

log() { printf '[release] %s\n' "$*" >&2; }
die() { printf '[release] error: %s\n' "$*" >&2; exit 1; }

[ -f "$build/CMakeCache.txt" ] || die "$build is not configured: run scripts/setup.sh first"
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
[ -n "$version" ] || die "no project version in $build/CMakeCache.txt"
arch=$(uname -m)
name=cuda-criu-$version-$arch
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$top" log -1 --format=%ct 2>/dev/null || date +%s)}
export SOURCE_DATE_EPOCH

rm -rf "$out"
mkdir -p "$out"

# 1. The Debian packages. cpack builds what is out of date first.
log "Debian packages of $version (cpack)"
(cd "$build" && cpack -G DEB -B "$out") >"$build/release.cpack.log" 2>&1 ||
	{ tail -n 30 "$build/release.cpack.log" >&2; die "cpack failed (log: $build/release.cpack.log)"; }
rm -rf "$out/_CPack_Packages"

# 2. The tarball: the GPU bundle, built straight into a folder named like the tarball.
log "the bundle as $name.tar.gz"
BUILD_DIR=$build BUNDLE_DIR=$out/$name "$top/scripts/gpu-bundle.sh" >"$build/release.bundle.log" 2>&1 ||
	{ tail -n 30 "$build/release.bundle.log" >&2; die "scripts/gpu-bundle.sh failed (log: $build/release.bundle.log)"; }
glibc=$(sed -n 's/^glibc_needed=GLIBC_//p' "$out/$name/bundle-info.txt")
criu=$("$out/$name/sbin/criu" --version | sed -n 's/^Version: //p')
sed -e "s/@VERSION@/$version/g" -e "s/@GLIBC@/$glibc/g" -e "s/@CRIU@/$criu/g" \
	"$top/packaging/tarball-README.md.in" >"$out/$name/README.md"
# The same bytes for the same files: names sorted, no owner, one time stamp.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" -C "$out" -cf - "$name" |
	gzip -9n >"$out/$name.tar.gz"
rm -rf "${out:?}/$name"
(cd "$out" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")

log "ready in $out:"
(cd "$out" && du -h -- *) >&2
