#!/usr/bin/env bash
# scripts/build-criu.sh takes its Debian mirror from the machine's apt configuration: debian_mirror on
# sample configurations (deb822 and one-line, options, disabled stanzas, other archives, our own entry)
# and on this machine's /etc/apt; and its build fingerprint does not depend on where the checkout lies.
#
#   build_criu_mirror.sh PATH/TO/build-criu.sh
set -euo pipefail
source "${1:?usage: build_criu_mirror.sh PATH/TO/build-criu.sh}"
T=$(mktemp -d /tmp/cuda-criu-mirror.XXXXXX)
trap 'rm -rf "$T"' EXIT
failures=0

# expect_mirror CASE WANT: debian_mirror on $T/CASE (an apt configuration directory) prints WANT.
expect_mirror() {
	local got
	got=$(debian_mirror "$T/$1")
	if [ "$got" = "$2" ]; then
		echo "ok   $1: '$got'"
	else
		echo "FAIL $1: debian_mirror printed '$got', expected '$2'"
		failures=$((failures + 1))
	fi
}

# apt_dir CASE: an empty apt configuration directory.
apt_dir() { mkdir -p "$T/$1/sources.list.d"; }

# deb822, as Debian 12 images ship it: security archive second, a comment inside the stanza.
apt_dir deb822
cat >"$T/deb822/sources.list.d/debian.sources" <<'EOT'
Types: deb
# http://snapshot.example.org/archive/debian/20250520T000000Z
URIs: http://mirror.example.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example.org/debian-security
Suites: bookworm-security
Components: main
EOT
expect_mirror deb822 http://mirror.example.org/debian

# One-line sources.list: the security line first, options in brackets, a trailing slash.
apt_dir oneline
cat >"$T/oneline/sources.list" <<'EOT'
# deb http://commented.example.org/debian bookworm main
deb http://security.example.org/debian-security bookworm-security main
deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://ftp.mirror.example.org/debian/ bookworm main contrib
EOT
expect_mirror oneline http://ftp.mirror.example.org/debian

# A caching proxy in the URI; before it (in apt's order) a disabled stanza, another archive, a
# Debian entry without main, and our own deb-src entry, which must not count.
apt_dir cacher
cat >"$T/cacher/sources.list.d/a-disabled.sources" <<'EOT'
Types: deb
URIs: http://disabled.example.org/debian
Suites: bookworm
Components: main
Enabled: no
EOT
cat >"$T/cacher/sources.list.d/b-nodesource.sources" <<'EOT'
Types: deb
URIs: https://packages.example.org/node_20.x
Suites: nodistro
Components: main
EOT
echo 'deb http://contrib-only.example.org/debian bookworm contrib' >"$T/cacher/sources.list.d/c-contrib.list"
cat >"$T/cacher/sources.list.d/cuda-criu-src.sources" <<'EOT'
Types: deb-src
URIs: http://old.example.org/debian
Suites: sid
Components: main
EOT
cat >"$T/cacher/sources.list.d/debian.sources" <<'EOT'
Types: deb
URIs: http://apt-cacher.example.org:3142/mirror.example.org/debian
Suites: bookworm
Components: main
EOT
echo 'deb http://ignored.example.org/debian bookworm main' >"$T/cacher/sources.list.d/old.list.disabled"
expect_mirror cacher http://apt-cacher.example.org:3142/mirror.example.org/debian

# Nothing Debian: no mirror (build-criu.sh then asks for DEBIAN_MIRROR).
apt_dir none
echo 'deb https://packages.example.org/apt cloud-sdk-bookworm main' >"$T/none/sources.list"
expect_mirror none ""

# This machine: a mirror, and one that its apt configuration names.
mirror=$(debian_mirror)
if [ -n "$mirror" ] && grep -rqsF "$mirror" /etc/apt/sources.list /etc/apt/sources.list.d/; then
	echo "ok   /etc/apt: '$mirror'"
else
	echo "FAIL /etc/apt: debian_mirror printed '$mirror', which is not a URI of /etc/apt's sources"
	failures=$((failures + 1))
fi

# The build's fingerprint (its stamp) is the same from two checkouts in other places: they share a CRIU
# build without rebuilding it for each other.
src=$(cd "$(dirname "$1")/.." && pwd)
for c in a b; do
	mkdir -p "$T/$c/checkout-$c/scripts"
	cp "$1" "$T/$c/checkout-$c/scripts/"
	cp -r "$src/criu-patches" "$T/$c/checkout-$c/"
done
fp_a=$(bash -c 'source "$1"; fingerprint 4.2.1' _ "$T/a/checkout-a/scripts/build-criu.sh")
fp_b=$(bash -c 'source "$1"; fingerprint 4.2.1' _ "$T/b/checkout-b/scripts/build-criu.sh")
if [ -n "$fp_a" ] && [ "$fp_a" = "$fp_b" ]; then
	echo "ok   fingerprint: the same from two checkouts ($fp_a)"
else
	echo "FAIL fingerprint: '$fp_a' in one checkout, '$fp_b' in another (it must not depend on the path)"
	failures=$((failures + 1))
fi

[ "$failures" = 0 ]
