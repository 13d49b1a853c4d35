#!/usr/bin/env bash
# ctest entry of the real-GPU tests (label "gpu"):  ctest-gpu.sh SOURCE_DIR BUILD_DIR
#
# Without an NVIDIA GPU (or without root, which CRIU needs) it says why and exits 77, which ctest reports as
# skipped. Otherwise it builds the bundle in BUILD_DIR/gpu-bundle with scripts/gpu-bundle.sh (a quick
# up-to-date check when it is there) and runs the tests from it.
set -euo pipefail
src=${1:?usage: ctest-gpu.sh SOURCE_DIR BUILD_DIR}
build=${2:?usage: ctest-gpu.sh SOURCE_DIR BUILD_DIR}

if [ -z "$(ls -A /proc/driver/nvidia/gpus 2>/dev/null)" ]; then
	echo "SKIP: no NVIDIA GPU on this machine"
	exit 77
fi
if [ "$(id -u)" != 0 ]; then
	echo "SKIP: CRIU needs root to dump and restore"
	exit 77
fi
BUILD_DIR=$build "$src/scripts/gpu-bundle.sh"
exec bash "$build/gpu-bundle/run-gpu-tests.sh"
