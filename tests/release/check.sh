#!/usr/bin/env bash
# The release files (scripts/release.sh) as a user gets them:
#
#   tests/release/check.sh [BUILD_DIR]       (default: build; the files in BUILD_DIR/release)
#
# 1. The tarball: its sha256 checks, it unpacks, and there bin/cuda-criu --version and sbin/criu --version
#    run with no environment at all; it holds a README.md and nothing of NVIDIA's.
# 2. The Debian packages (as root, else skipped; this machine's dpkg, so run it when nothing else uses
#    CRIU): lintian reports no error or warning that packaging/deb/*.lintian-overrides does not explain;
#    both install with dpkg next to another package's cuda_plugin.so, which they divert; `cuda-criu check`
#    and a round trip with the fake GPU run through the installed files with no path given, and the plugin's
#    log and image carry the version; after a purge nothing of them is left (files, directories, the
#    diversion, dpkg's status) and the other package's plugin is back.
# Files of the machine's that the packages would replace (/etc/criu/cuda_plugin.conf) are put back after.
set -euo pipefail
TEST_NAME=release-check
source "$(dirname "$0")/../lib/common.sh"
top=$(cd "$(dirname "$0")/../.." && pwd)
BUILD_DIR=$(realpath "${1:-$top/build}")
build_tree_paths # the fake GPU: FAKE_LIB, FAKE_DAEMON, MEMCHECK
rel=$BUILD_DIR/release
PKG_PLUGIN_DIR=/usr/lib/criu # CRIU's default plugin directory, where the package puts the plugin

version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$BUILD_DIR/CMakeCache.txt")
name=cuda-criu-$version-$(uname -m)
T=$(mktemp -d /tmp/cuda-criu-release.XXXXXX)
on_exit 'rm -rf "$T"'

# 1. The tarball.
[ -f "$rel/$name.tar.gz" ] || fail "no $rel/$name.tar.gz: run scripts/release.sh"
(cd "$rel" && sha256sum -c --quiet "$name.tar.gz.sha256") || fail "$name.tar.gz does not match its sha256"
mkdir "$T/unpacked"
tar -xzf "$rel/$name.tar.gz" -C "$T/unpacked"
[ "$(ls "$T/unpacked")" = "$name" ] || fail "the tarball does not unpack into one folder $name: $(ls "$T/unpacked")"
root=$T/unpacked/$name
[ -s "$root/README.md" ] && grep -q "cuda-criu $version" "$root/README.md" || fail "no README.md of $version"
out=$(cd / && env -i "$root/bin/cuda-criu" --version 2>&1) || fail "bin/cuda-criu --version: $out"
[ "$out" = "cuda-criu $version" ] || fail "bin/cuda-criu --version printed '$out', not 'cuda-criu $version'"
out=$(cd / && env -i "$root/sbin/criu" --version 2>&1) || fail "sbin/criu --version: $out"
grep -qE '^Version: 4\.' <<<"$out" || fail "sbin/criu --version printed '$out'"
nvidia=$(find "$root" -name 'libcuda*' -o -name 'libnvidia*')
[ -z "$nvidia" ] || fail "the tarball holds NVIDIA's files: $nvidia"
log "tarball $name.tar.gz: checksum, README, bin/cuda-criu and sbin/criu run with no environment: ok"

# 2. The packages.
if [ "$(id -u)" -ne 0 ]; then
	log "packages: skipped (installing them needs root)"
	exit 0
fi
debs=("$rel/cuda-criu-criu_${version}_amd64.deb" "$rel/cuda-criu_${version}_amd64.deb")
for d in "${debs[@]}"; do [ -f "$d" ] || fail "no $d: run scripts/release.sh"; done
for p in cuda-criu cuda-criu-criu; do
	if dpkg-query -W -f '${db:Status-Status}' "$p" 2>/dev/null | grep -qv not-installed; then
		fail "$p is installed here already: this check installs and purges it (dpkg --purge $p first)"
	fi
done

# Errors and warnings fail; the info and pedantic tags are shown (the overrides explain those there are).
lintian --fail-on error,warning -I --pedantic "${debs[@]}" >"$T/lintian.txt" 2>&1 ||
	fail "lintian: $(cat "$T/lintian.txt")"
grep -v '^running with root' "$T/lintian.txt" || true
log "lintian: no error or warning that the packages' overrides do not explain: ok"

# What is there before: the diversions, and which of the packages' directories exist.
dpkg-divert --list | sort >"$T/diversions.before"
# "TYPE PATH" of every entry of the packages (d: a directory).
for d in "${debs[@]}"; do dpkg-deb -c "$d"; done | awk '{print substr($1, 1, 1), substr($6, 2)}' |
	sed 's|/$||' | grep -v ' $' | sort -u >"$T/paths"
while read -r type path; do
	[ "$type" = d ] && [ -d "$path" ] && echo "$path"
done <"$T/paths" >"$T/dirs.before"
conf=/etc/criu/cuda_plugin.conf
if [ -e "$conf" ]; then
	mv "$conf" "$T/saved.conf"
	on_exit "mv '$T/saved.conf' '$conf'"
fi

# Another package's cuda_plugin.so (as a distribution's criu may ship CRIU's own plugin): ours diverts it.
other=cuda-criu-release-check-other
mkdir -p "$T/other/DEBIAN" "$T/other$PKG_PLUGIN_DIR"
echo "not a plugin" >"$T/other$PKG_PLUGIN_DIR/cuda_plugin.so"
printf 'Package: %s\nVersion: 1\nArchitecture: all\nMaintainer: nobody <nobody@example.org>\nDescription: test\n' \
	"$other" >"$T/other/DEBIAN/control"
dpkg-deb --build --root-owner-group "$T/other" "$T/other.deb" >/dev/null
on_exit "dpkg --purge cuda-criu cuda-criu-criu $other"
dpkg -i "$T/other.deb" >/dev/null

dpkg -i "${debs[@]}" >"$T/dpkg.log" 2>&1 || fail "dpkg -i: $(cat "$T/dpkg.log")"
[ "$(cat "$PKG_PLUGIN_DIR/cuda_plugin.so.distrib")" = "not a plugin" ] ||
	fail "the other package's plugin is not diverted"
dpkg-divert --list "$PKG_PLUGIN_DIR/cuda_plugin.so" | grep -q "by cuda-criu" || fail "no diversion by cuda-criu"
grep -q cuda-plugin.img "$PKG_PLUGIN_DIR/cuda_plugin.so" || fail "$PKG_PLUGIN_DIR/cuda_plugin.so is not ours"
[ "$(command -v cuda-criu)" = /usr/bin/cuda-criu ] || fail "cuda-criu in PATH: $(command -v cuda-criu)"
[ "$(cuda-criu --version)" = "cuda-criu $version" ] || fail "cuda-criu --version: $(cuda-criu --version)"
/usr/lib/cuda-criu/bin/cuda-checkpoint --help | grep -q -- "--action ACTION --pid PID" ||
	fail "/usr/lib/cuda-criu/bin/cuda-checkpoint is not cuda-criu's cuda-checkpoint command line"
log "installed with dpkg, the other package's cuda_plugin.so diverted: ok"

# The fake GPU; only the workload gets LD_LIBRARY_PATH, cuda-criu and criu the plugin's libcuda option.
start_fake_gpu_daemon "$T/fakegpu"
on_exit 'kill "$DAEMON_PID"'
export CUDA_CRIU_LIBCUDA=$FAKE_LIB TMPDIR=$T

cuda-criu check >"$T/check.txt" 2>&1 || fail "cuda-criu check: $(cat "$T/check.txt")"
grep -qE "^ok +criu +/usr/lib/cuda-criu/sbin/criu: CRIU 4\.2\.1$" "$T/check.txt" ||
	fail "check did not find the package's CRIU: $(cat "$T/check.txt")"
grep -qE "^ok +criu-patch " "$T/check.txt" || fail "check: the package's CRIU is not patched: $(cat "$T/check.txt")"
grep -qE "^ok +plugin +criu loads $PKG_PLUGIN_DIR/cuda_plugin.so" "$T/check.txt" ||
	fail "check did not find the plugin: $(cat "$T/check.txt")"
log "cuda-criu check: the package's CRIU and plugin, no path given: ok"

cuda-criu roundtrip --require-cuda --ready-file "$T/state" --dir "$T/rt" --keep-images -- \
	env "LD_LIBRARY_PATH=$(dirname "$FAKE_LIB")" "$MEMCHECK" --mb 32 --interval-ms 20 \
	--state "$T/state" >"$T/roundtrip.txt" 2>&1 || fail "cuda-criu roundtrip: $(cat "$T/roundtrip.txt")"
grep -qE "setup +ok .*\(/usr/lib/cuda-criu/sbin/criu\), plugin $PKG_PLUGIN_DIR/cuda_plugin.so" "$T/roundtrip.txt" ||
	fail "the round trip did not use the installed files: $(cat "$T/roundtrip.txt")"
grep -qE '^PASS  roundtrip ' "$T/roundtrip.txt" || fail "no PASS: $(cat "$T/roundtrip.txt")"
# The version, from CMake's project(VERSION), in the plugin's log line and in cuda-plugin.img.
grep -rqF "cuda_plugin: ready to dump CUDA processes (version $version," "$T/rt/images-1" ||
	fail "no plugin log line with version $version in $T/rt/images-1"
cuda-criu inspect "$T/rt/images-1" | grep -q "plugin $version," || fail "cuda-plugin.img does not carry $version"
log "a fake-GPU round trip through the installed files; the version in the plugin's log and image: ok"

dpkg --purge cuda-criu cuda-criu-criu >"$T/dpkg.log" 2>&1 || fail "dpkg --purge: $(cat "$T/dpkg.log")"
for p in cuda-criu cuda-criu-criu; do
	! dpkg-query -W -f '${db:Status-Status}\n' "$p" 2>/dev/null | grep -qv not-installed || fail "dpkg still knows $p"
done
[ "$(cat "$PKG_PLUGIN_DIR/cuda_plugin.so")" = "not a plugin" ] || fail "the other package's plugin is not back"
[ ! -e "$PKG_PLUGIN_DIR/cuda_plugin.so.distrib" ] || fail "$PKG_PLUGIN_DIR/cuda_plugin.so.distrib is left"
dpkg --purge "$other" >/dev/null
dpkg-divert --list | sort | diff "$T/diversions.before" - || fail "the diversions differ from before"
while read -r type path; do
	if [ "$type" = d ]; then
		[ ! -d "$path" ] || grep -qx "$path" "$T/dirs.before" || fail "directory $path is left"
	elif [ -e "$path" ] || [ -L "$path" ]; then
		fail "$path is left"
	fi
done <"$T/paths"
log "purged: no file, directory, diversion or dpkg status of them left: ok"
log PASS
