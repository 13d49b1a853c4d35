#!/usr/bin/env bash
# Sets everything up and runs the whole test suite: the unit tests built with ASan+UBSan (build/asan) and
# with TSan (build/tsan), clang-tidy, then every test in build/ (tests that need a GPU or root are reported
# as skipped), then, without ctest options, the release files (Debian packages, tarball: tests/release/).
# CUDA_CRIU_SANITIZED_CRIU=1 adds, at the end, the end-to-end and container tests with CRIU built with
# AddressSanitizer and the plugin with ASan+UBSan (scripts/test-sanitized.sh, ~10 min: nightly).
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
cmake --build build/asan -j"$(nproc)" --target unit_tests image_fuzz_replay thp_populate >build/asan.build.log 2>&1 ||
	{ tail -40 build/asan.build.log; exit 1; }
ctest --test-dir build/asan -L unit --output-on-failure

echo "[test] unit tests under ThreadSanitizer (build/tsan): driver calls run on worker threads" >&2
cmake -S . -B build/tsan -DCUDA_CRIU_WERROR=ON -DCUDA_CRIU_SANITIZE=thread \
	-DCRIU_PREFIX="$top/build/criu/4.2.1/install" >build/tsan.cmake.log 2>&1 || { cat build/tsan.cmake.log; exit 1; }
cmake --build build/tsan -j"$(nproc)" --target unit_tests image_fuzz_replay thp_populate >build/tsan.build.log 2>&1 ||
	{ tail -40 build/tsan.build.log; exit 1; }
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 ctest --test-dir build/tsan -L unit --output-on-failure

echo "[test] clang-tidy (scripts/tidy.sh, config .clang-tidy)" >&2
scripts/tidy.sh build

echo "[test] the whole suite (build)" >&2
ctest --test-dir build --output-on-failure "$@"

# After the whole suite (nothing else uses CRIU then): the packages are installed on this machine and purged.
if [ $# -eq 0 ]; then
	echo "[test] the release: built (scripts/release.sh), unpacked, installed, used and purged (tests/release/check.sh)" >&2
	scripts/release.sh
	tests/release/check.sh build
fi

if [ "${CUDA_CRIU_SANITIZED_CRIU:-0}" = 1 ]; then
	echo "[test] end-to-end and container tests inside a sanitized CRIU (scripts/test-sanitized.sh)" >&2
	scripts/test-sanitized.sh
fi
