#!/usr/bin/env bash
# The end-to-end and container tests with sanitizers inside CRIU: CRIU built with AddressSanitizer
# (scripts/build-criu.sh --asan, build/criu-asan/4.2.1) loads our plugin built with ASan+UBSan
# (build/asan/plugin), so that a bad access of the plugin inside CRIU's process stops the dump or the
# restore with a report. The tests, workloads and fake GPU are those of build/. Nightly-style, about
# 10 min on 2 cores (docs/hardening.md):
#   scripts/test-sanitized.sh [ctest options...]       or   CUDA_CRIU_SANITIZED_CRIU=1 scripts/test.sh
# Every sanitizer report, also one from a process whose failure fails no test (the plugin's guards, forked
# from CRIU), goes to build/asan/sanitizer-logs/ and fails the run.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

echo "[test-sanitized] CRIU with AddressSanitizer (build/criu-asan)" >&2
scripts/build-criu.sh --asan
criu=$top/build/criu-asan/4.2.1/install/sbin/criu

# Only the code that runs inside CRIU is instrumented: the plugin. The processes CRIU checkpoints stay
# uninstrumented (the workloads, the fake libcuda they load, cuda-criu: build/): CRIU cannot restore a
# tree of ASan-instrumented processes (a restored child dies of SIGSEGV, with the plain CRIU too).
echo "[test-sanitized] the plugin with ASan+UBSan (build/asan)" >&2
cmake -S . -B build/asan -DCUDA_CRIU_WERROR=ON -DCUDA_CRIU_SANITIZE=address,undefined \
	-DCRIU_PREFIX="$top/build/criu/4.2.1/install" >build/asan.cmake.log 2>&1 || { cat build/asan.cmake.log; exit 1; }
cmake --build build/asan -j"$(nproc)" --target cuda_plugin >build/asan.build.log 2>&1 ||
	{ tail -40 build/asan.build.log; exit 1; }
[ -f build/CMakeCache.txt ] || { echo "[test-sanitized] no build/: run scripts/setup.sh first" >&2; exit 1; }
cmake --build build -j"$(nproc)" >build/build.log 2>&1 || { tail -40 build/build.log; exit 1; }

logs=$top/build/asan/sanitizer-logs
rm -rf "$logs" && mkdir -p "$logs"
# Leaks are not checked here: CRIU's own allocations at exit would fail every test (CRIU's zdtm runs its
# ASan build with detect_leaks=0 too); the plugin's leaks are checked by its unit tests under ASan.
export ASAN_OPTIONS=log_path=$logs/asan:detect_leaks=0:abort_on_error=1
export UBSAN_OPTIONS=log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1
[ $# -gt 0 ] || set -- -L '^(e2e|containers)$'
echo "[test-sanitized] ctest $* with CRIU=$criu, PLUGIN_DIR=build/asan/plugin" >&2
rc=0
# CRIU_411=none: the parts with stock CRIU 4.1.1 are skipped (an uninstrumented CRIU cannot load the
# instrumented plugin: the ASan runtime must be the first library of the program).
CRIU=$criu PLUGIN_DIR=$top/build/asan/plugin CRIU_411=none ctest --test-dir build --output-on-failure "$@" || rc=$?

if [ -n "$(ls -A "$logs")" ]; then
	echo "[test-sanitized] sanitizer reports:" >&2
	for f in "$logs"/*; do echo "---- $f"; cat "$f"; done >&2
	exit 1
fi
exit "$rc"
