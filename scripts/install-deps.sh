#!/usr/bin/env bash
# Installs, with apt, the Debian packages needed to build CRIU, the plugin and the tests.
# Only missing packages are installed, so a second run costs one dpkg query.
set -euo pipefail

pkgs=(
	# toolchain, test framework, fuzzing (clang's libFuzzer) and static checks
	build-essential cmake pkg-config libgtest-dev libgmock-dev clang libclang-rt-14-dev clang-tidy
	# the GPU image's chunk compression
	libzstd-dev
	# the CLI's --json output
	nlohmann-json3-dev
	# CRIU's build dependencies
	libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler python3-protobuf
	libnl-3-dev libnet1-dev libcap-dev libbsd-dev libgnutls28-dev libnftables-dev uuid-dev libaio-dev
	# CRIU's run-time helpers and the download of its source
	iproute2 iptables curl ca-certificates xz-utils patch
	# CRIU's own test suite, zdtm (tests/zdtm/run-zdtm.sh)
	python3-yaml libnl-route-3-dev
	# the GPU bundle: its binaries' RUNPATH (scripts/gpu-bundle.sh)
	patchelf
	# the release: the Debian packages' checks (tests/release/check.sh)
	lintian
)

missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null | grep -qx installed || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

[ "$(id -u)" -eq 0 ] || { echo "install-deps: run as root to install: ${missing[*]}" >&2; exit 1; }
echo "[install-deps] installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
