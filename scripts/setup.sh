#!/usr/bin/env bash
# Sets everything up in build/: Debian packages, CRIU 4.2.1 (ours, patched) and 4.1.1 (stock, for
# compatibility tests) from Debian's source packages, then the plugin, the CLI and the tests.
# A second run rebuilds only what changed.
#   scripts/setup.sh [extra cmake options...]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

scripts/build-criu.sh 4.2.1 4.1.1
echo "[setup] building the plugin and tests in build/" >&2
mkdir -p build
cmake -S . -B build -DCUDA_CRIU_WERROR=ON "$@" >build/cmake.log 2>&1 || { cat build/cmake.log; exit 1; }
cmake --build build -j"$(nproc)" >build/build.log 2>&1 ||
	{ grep -E -A5 'error|Error' build/build.log | head -60; echo "[setup] build failed: build/build.log" >&2; exit 1; }
echo "[setup] ready: build/plugin/cuda_plugin.so (CRIU: build/criu/4.2.1/install/sbin/criu)" >&2
