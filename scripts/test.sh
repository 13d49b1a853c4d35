#!/usr/bin/env bash
# Sets everything up and runs the whole test suite: every test in build/ (tests that need a GPU or
# root are reported as skipped), then the unit tests again built with ASan+UBSan (build/asan).
#   scripts/test.sh [ctest options...]     e.g. scripts/test.sh -L e2e
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

scripts/setup.sh
# The container runtimes (runc, podman) and the busybox root file system of the container tests.
test-containers/setup.sh

echo "[test] unit tests under AddressSanitizer + UndefinedBehaviorSanitizer (build/asan)" >&2
cmake -S . -B build/asan -DCUDA_CRIU_WERROR=ON -DCUDA_CRIU_SANITIZE=address,undefined \
	-DCRIU_PREFIX="$top/build/criu/4.2.1/install" >build/asan.cmake.log 2>&1 || { cat build/asan.cmake.log; exit 1; }
cmake --build build/asan -j"$(nproc)" --target unit_tests >build/asan.build.log 2>&1 || { tail -40 build/asan.build.log; exit 1; }
ctest --test-dir build/asan -L unit --output-on-failure

echo "[test] the whole suite (build)" >&2
ctest --test-dir build --output-on-failure "$@"
