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
#    log and image carry the version; `cuda-criu checkpoint`, `restore` and `roundtrip` run by nobody
#    each fail in one line that names root; after a purge nothing of them is left (files, directories,
#    the diversion, dpkg's status) and the other package's plugin is back. Then, installed again, they
#    are upgraded to a higher version (the same files repacked): the diversion and the unmodified
#    configuration file stay as they are and a round trip passes; `dpkg -r` keeps the configuration file
#    and takes the rest and the diversion away; a purge after it leaves nothing, as the direct one.
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
# It holds a file of its own too, as such a package does: dpkg takes a package whose every file is also
# listed by another (here through the diversion) as replaced, and forgets it at our upgrade.
other=cuda-criu-release-check-other
mkdir -p "$T/other/DEBIAN" "$T/other$PKG_PLUGIN_DIR" "$T/other/usr/share/doc/$other"
echo "not a plugin" >"$T/other$PKG_PLUGIN_DIR/cuda_plugin.so"
echo "the other package's own file" >"$T/other/usr/share/doc/$other/README"
printf 'Package: %s\nVersion: 1\nArchitecture: all\nMaintainer: nobody <nobody@example.org>\nDescription: test\n' \
	"$other" >"$T/other/DEBIAN/control"
dpkg-deb --build --root-owner-group "$T/other" "$T/other.deb" >/dev/null
on_exit "dpkg --purge cuda-criu cuda-criu-criu $other"

# dpkg_install DEB...: the packages installed with dpkg -i.
dpkg_install() { dpkg -i "$@" >"$T/dpkg.log" 2>&1 || fail "dpkg -i $*: $(cat "$T/dpkg.log")"; }

# expect_installed VERSION: both packages installed at VERSION (dpkg's), the other package's plugin diverted,
# ours in its place, the CLI in PATH.
expect_installed() {
	local v=$1 p
	for p in cuda-criu cuda-criu-criu; do
		[ "$(dpkg-query -W -f '${db:Status-Status} ${Version}' "$p")" = "installed $v" ] ||
			fail "dpkg-query $p: $(dpkg-query -W -f '${db:Status-Status} ${Version}' "$p"), not installed $v"
	done
	[ "$(cat "$PKG_PLUGIN_DIR/cuda_plugin.so.distrib")" = "not a plugin" ] ||
		fail "the other package's plugin is not diverted"
	dpkg-divert --list "$PKG_PLUGIN_DIR/cuda_plugin.so" | grep -q "by cuda-criu" || fail "no diversion by cuda-criu"
	grep -q cuda-plugin.img "$PKG_PLUGIN_DIR/cuda_plugin.so" || fail "$PKG_PLUGIN_DIR/cuda_plugin.so is not ours"
	[ "$(command -v cuda-criu)" = /usr/bin/cuda-criu ] || fail "cuda-criu in PATH: $(command -v cuda-criu)"
	/usr/lib/cuda-criu/bin/cuda-checkpoint --help | grep -q -- "--action ACTION --pid PID" ||
		fail "/usr/lib/cuda-criu/bin/cuda-checkpoint is not cuda-criu's cuda-checkpoint command line"
	dpkg --verify cuda-criu cuda-criu-criu >"$T/verify.txt" 2>&1 || fail "dpkg --verify: $(cat "$T/verify.txt")"
}

# expect_roundtrip NAME: a fake-GPU round trip through the installed files, with no path given; the
# version in the plugin's log line and in cuda-plugin.img.
expect_roundtrip() {
	local rt=$T/rt-$1
	cuda-criu roundtrip --require-cuda --ready-file "$T/state" --dir "$rt" --keep-images -- \
		env "LD_LIBRARY_PATH=$(dirname "$FAKE_LIB")" "$MEMCHECK" --mb 32 --interval-ms 20 \
		--state "$T/state" >"$T/roundtrip.txt" 2>&1 || fail "cuda-criu roundtrip: $(cat "$T/roundtrip.txt")"
	grep -qE "setup +ok .*\(/usr/lib/cuda-criu/sbin/criu\), plugin $PKG_PLUGIN_DIR/cuda_plugin.so" "$T/roundtrip.txt" ||
		fail "the round trip did not use the installed files: $(cat "$T/roundtrip.txt")"
	grep -qE '^PASS  roundtrip ' "$T/roundtrip.txt" || fail "no PASS: $(cat "$T/roundtrip.txt")"
	# The version, from CMake's project(VERSION), in the plugin's log line and in cuda-plugin.img.
	grep -rqF "cuda_plugin: ready to dump CUDA processes (version $version," "$rt/images-1" ||
		fail "no plugin log line with version $version in $rt/images-1"
	cuda-criu inspect "$rt/images-1" | grep -q "plugin $version," || fail "cuda-plugin.img does not carry $version"
}

# expect_purged: after dpkg --purge of both (from any state), dpkg knows neither, the other package's plugin
# is back, and once that package is purged too the diversions are as before and nothing of the packages is
# left (directories that were there before stay).
expect_purged() {
	local p type path
	dpkg --purge cuda-criu cuda-criu-criu >"$T/dpkg.log" 2>&1 || fail "dpkg --purge: $(cat "$T/dpkg.log")"
	for p in cuda-criu cuda-criu-criu; do
		! dpkg-query -W -f '${db:Status-Status}\n' "$p" 2>/dev/null | grep -qv not-installed ||
			fail "dpkg still knows $p"
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
}

# 2a. Installed next to the other package, used, purged.
dpkg_install "$T/other.deb"
dpkg_install "${debs[@]}"
expect_installed "$version"
[ "$(cuda-criu --version)" = "cuda-criu $version" ] || fail "cuda-criu --version: $(cuda-criu --version)"
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

expect_roundtrip installed
log "a fake-GPU round trip through the installed files; the version in the plugin's log and image: ok"

# A user who is not root (nobody, no capabilities): the driver's checkpoint and restore of root's CUDA
# process, and a round trip (CRIU needs root), each fail in one line that names root; the process runs on.
# The fake libcuda is copied where that user can load it.
chmod 711 "$T"
mkdir -m 755 "$T/nobody"
cp "$FAKE_LIB" "$T/nobody/libcuda.so.1"
chmod 644 "$T/nobody/libcuda.so.1"
setsid env "LD_LIBRARY_PATH=$(dirname "$FAKE_LIB")" "$MEMCHECK" --mb 8 --interval-ms 20 --state "$T/victim" \
	</dev/null >"$T/victim.log" 2>&1 &
victim=$!
on_exit "kill $victim"
wait_for "the workload" 10 grep -q '^iterations=[1-9]' "$T/victim"
for cmd in "checkpoint $victim" "restore $victim" "roundtrip --ready-delay 1 -- true"; do
	# shellcheck disable=SC2086 # the words of cmd
	expect_privilege_refusal "cuda-criu $cmd as nobody" setpriv --reuid=nobody --regid=nogroup --clear-groups \
		--inh-caps=-all env "CUDA_CRIU_LIBCUDA=$T/nobody/libcuda.so.1" timeout -s KILL 30 cuda-criu $cmd
done
[ "$(cuda-criu status "$victim")" = "$victim running" ] || fail "pid $victim: $(cuda-criu status "$victim" 2>&1)"
kill "$victim"
log "cuda-criu checkpoint, restore and roundtrip as nobody: each refused in one line naming root: ok"

expect_purged
log "purged: no file, directory, diversion or dpkg status of them left: ok"

# 2b. Upgraded, removed, then purged. The newer version is the same files repacked (dpkg-deb -R, -b) with a
# higher Version, the exact version cuda-criu depends on raised with it, and an entry of the new version on
# top of each changelog: rebuilding the tree with another project version would cost CI minutes and test
# nothing more of dpkg's upgrade. So cuda-criu --version still prints the version the binaries were built
# with, and the configuration file is the same: an unmodified one stays as it is.
new=$version+repack1
dpkg --compare-versions "$new" gt "$version" || fail "$new is not higher than $version"
repack() {
	local deb=$1 dir pkg changelog maintainer
	dir=$T/repack/$(basename "$deb" .deb)
	mkdir -p "$T/repack"
	dpkg-deb -R "$deb" "$dir"
	pkg=$(sed -n 's/^Package: //p' "$dir/DEBIAN/control")
	maintainer=$(sed -n 's/^Maintainer: //p' "$dir/DEBIAN/control")
	sed -i -e "s/^Version: .*/Version: $new/" -e "s/(= $version)/(= $new)/" "$dir/DEBIAN/control"
	changelog=$dir/usr/share/doc/$pkg/changelog.gz
	{
		printf '%s (%s) unstable; urgency=medium\n\n  * %s repacked by tests/release/check.sh.\n\n -- %s  %s\n\n' \
			"$pkg" "$new" "$version" "$maintainer" "$(date -R)"
		zcat "$changelog"
	} | gzip -9n >"$T/changelog.gz"
	cat "$T/changelog.gz" >"$changelog"
	(cd "$dir" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) \
		>"$dir/DEBIAN/md5sums"
	dpkg-deb --root-owner-group -Zgzip -b "$dir" "$T/${pkg}_${new}_amd64.deb" >/dev/null
}
for d in "${debs[@]}"; do repack "$d"; done
dpkg_install "$T/other.deb"
dpkg_install "${debs[@]}"
sha256sum "$conf" >"$T/conf.sha256"
dpkg_install "$T/cuda-criu-criu_${new}_amd64.deb" "$T/cuda-criu_${new}_amd64.deb"
[ "$(dpkg-query -W -f '${db:Status-Status}' "$other")" = installed ] || fail "dpkg forgot $other in the upgrade"
expect_installed "$new"
[ "$(cuda-criu --version)" = "cuda-criu $version" ] || fail "cuda-criu --version: $(cuda-criu --version)"
zcat /usr/share/doc/cuda-criu/changelog.gz | head -n1 | grep -qF "cuda-criu ($new)" ||
	fail "the changelog is not the one of $new"
sha256sum -c --quiet "$T/conf.sha256" || fail "$conf changed in the upgrade"
leftover=$(find /etc/criu -name 'cuda_plugin.conf?*')
[ -z "$leftover" ] || fail "the upgrade left $leftover"
expect_roundtrip upgraded
log "upgraded from $version to $new: the diversion, the unmodified $conf kept, a fake-GPU round trip: ok"

dpkg -r cuda-criu cuda-criu-criu >"$T/dpkg.log" 2>&1 || fail "dpkg -r: $(cat "$T/dpkg.log")"
[ "$(dpkg-query -W -f '${db:Status-Status}' cuda-criu)" = config-files ] ||
	fail "cuda-criu after dpkg -r: $(dpkg-query -W -f '${db:Status-Status}' cuda-criu), not config-files"
sha256sum -c --quiet "$T/conf.sha256" || fail "$conf changed or went with dpkg -r"
while read -r type path; do
	[ "$type" != d ] && [ "$path" != "$conf" ] && [ "$path" != "$PKG_PLUGIN_DIR/cuda_plugin.so" ] || continue
	[ ! -e "$path" ] && [ ! -L "$path" ] || fail "$path is left after dpkg -r"
done <"$T/paths"
! dpkg-divert --list | grep -q "by cuda-criu" || fail "the diversion is left after dpkg -r"
[ "$(cat "$PKG_PLUGIN_DIR/cuda_plugin.so")" = "not a plugin" ] || fail "the other package's plugin is not back"
[ ! -e "$PKG_PLUGIN_DIR/cuda_plugin.so.distrib" ] || fail "$PKG_PLUGIN_DIR/cuda_plugin.so.distrib is left"
log "removed (dpkg -r): $conf kept, the files and the diversion gone, the other package's plugin back: ok"
expect_purged
log "purged after the remove: no file, directory, diversion or dpkg status of them left: ok"
log PASS
