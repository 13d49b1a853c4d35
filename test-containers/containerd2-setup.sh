#!/usr/bin/env bash
# Installs containerd 2.1 for the CRI tests into a private prefix, beside Debian 12's containerd 1.6 (which
# the other containerd tests use and which stays the system's), together with the CRI's api.proto:
#
#   test-containers/containerd2-setup.sh          (as root; test-containers/setup.sh calls it)
#
# Both come from Debian's unstable suite, by package name and version: `containerd` (2.1.x: a Go binary
# that needs only libc6 >= 2.34 and runc, both on Debian 12) and `golang-k8s-cri-api-dev` (the CRI's
# k8s.io/cri-api/pkg/apis/runtime/v1/api.proto). apt downloads them with a configuration of its own (the
# machine's Debian mirror, suite sid, its own index and cache), so that the machine's apt sources and
# packages are not changed; `dpkg-deb -x` unpacks each into $CT_OUT/containerd2 (usr/bin/containerd,
# containerd-shim-runc-v2, ctr; usr/share/gocode/src/k8s.io/cri-api/...). A second run with the same
# versions does nothing.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$top/build}
out=${CT_OUT:-$BUILD_DIR/test-containers}
prefix=$out/containerd2
# The versions: containerd of the 2.1 series, the CRI's API of Kubernetes 1.36.
CONTAINERD_SERIES=2.1.
CRI_API_SERIES=0.36.

# The machine's Debian mirror (debian_mirror), as scripts/build-criu.sh finds it.
# shellcheck source=../scripts/build-criu.sh
source "$top/scripts/build-criu.sh"
log() { echo "[test-containers/containerd2] $*" >&2; }
die() { log "error: $*"; exit 1; }

stamp=$prefix/.versions
if [ -x "$prefix/usr/bin/containerd" ] && [ -f "$prefix/usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto" ] &&
	grep -q "^containerd $CONTAINERD_SERIES" "$stamp" 2>/dev/null && grep -q "^golang-k8s-cri-api-dev $CRI_API_SERIES" "$stamp"; then
	exit 0
fi
[ "$(id -u)" -eq 0 ] || die "run as root"

mirror=${DEBIAN_MIRROR:-$(debian_mirror)}
[ -n "$mirror" ] || die "no Debian main entry in /etc/apt: set DEBIAN_MIRROR (e.g. http://deb.debian.org/debian)"

apt_dir=$BUILD_DIR/downloads/apt-sid
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs"
cat >"$apt_dir/sources.list" <<EOF
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror sid main
EOF
apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/nonexistent
	-o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o Acquire::Languages=none
	-o APT::Sandbox::User=root)

# newest VERSION-PREFIX PACKAGE: the newest version of PACKAGE in the index that starts with the prefix.
newest() {
	apt-cache "${apt_opts[@]}" madison "$2" | awk -F' *\\| *' -v p="$1" 'index($2, p) == 1 { print $2 }' |
		sort -V | tail -n1
}

log "reading the sid index of $mirror"
apt-get "${apt_opts[@]}" update -qq || die "apt-get update of sid from $mirror failed"
rm -rf "$prefix"
mkdir -p "$prefix"
: >"$stamp.tmp"
for want in "containerd $CONTAINERD_SERIES" "golang-k8s-cri-api-dev $CRI_API_SERIES"; do
	read -r pkg series <<<"$want"
	ver=$(newest "$series" "$pkg")
	[ -n "$ver" ] || die "no $pkg $series* in sid ($(apt-cache "${apt_opts[@]}" madison "$pkg" | xargs))"
	deb=$(ls "$apt_dir/debs/${pkg}_${ver//:/%3a}_"*.deb 2>/dev/null | head -n1 || true)
	if [ -z "$deb" ]; then
		log "downloading $pkg $ver"
		(cd "$apt_dir/debs" && apt-get "${apt_opts[@]}" download -qq "$pkg=$ver") || die "apt-get download $pkg=$ver failed"
		deb=$(ls "$apt_dir/debs/${pkg}_${ver//:/%3a}_"*.deb | head -n1)
	fi
	dpkg-deb -x "$deb" "$prefix" || die "dpkg-deb -x $deb failed"
	echo "$pkg $ver" >>"$stamp.tmp"
done
mv "$stamp.tmp" "$stamp"
"$prefix/usr/bin/containerd" --version >/dev/null || die "$prefix/usr/bin/containerd does not run here"
log "ready in $prefix: $(xargs <"$stamp")"
