#!/usr/bin/env bash
# Builds the image parser's libFuzzer target with clang (ASan + UBSan) and runs it for a bounded time
# over a copy of the seed corpus. Fails on any crash, leak, timeout or out-of-memory; exits 77 (skip)
# when no clang with libFuzzer is installed (Debian: apt-get install clang libclang-rt-14-dev).
#   run_fuzzer.sh [--out DIR] [--seconds N] [extra libFuzzer options...]
# FUZZ_SECONDS (default 60) sets the run time too; crash reproducers are kept in DIR/artifacts/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
out=${FUZZ_OUT:-${BUILD_DIR:-$top/build}/tests/fuzz/clang}
seconds=${FUZZ_SECONDS:-60}
while [ $# -gt 0 ]; do
	case $1 in
	--out) out=$2; shift 2 ;;
	--seconds) seconds=$2; shift 2 ;;
	*) break ;;
	esac
done
CLANG=${CLANG:-clang}
CLANGXX=${CLANGXX:-clang++}

skip() { echo "SKIP: $*"; exit 77; }
command -v "$CLANGXX" >/dev/null || skip "no $CLANGXX (install clang and libclang-rt-14-dev)"
command -v protoc-c >/dev/null || { echo "no protoc-c" >&2; exit 1; }
mkdir -p "$out/obj" "$out/gen" "$out/artifacts"
probe=$out/obj/probe.cpp
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char *, unsigned long) { return 0; }\n' >"$probe"
"$CLANGXX" -fsanitize=fuzzer "$probe" -o "$out/obj/probe" 2>/dev/null ||
	skip "$CLANGXX cannot link -fsanitize=fuzzer (install libclang-rt-14-dev)"

san=(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1)
read -r -a pbc_flags <<<"$(pkg-config --cflags libprotobuf-c 2>/dev/null || true)"
read -r -a pbc_libs <<<"$(pkg-config --libs libprotobuf-c libzstd 2>/dev/null || echo -lprotobuf-c -lzstd)"
protoc-c --proto_path="$top/include/cuda_criu" --c_out="$out/gen" "$top/include/cuda_criu/cuda_plugin.proto"
inc=(-I"$top/plugin" -I"$out/gen" "${pbc_flags[@]}")
"$CLANG" "${san[@]}" "${inc[@]}" -c "$out/gen/cuda_plugin.pb-c.c" -o "$out/obj/pb.o"
objs=("$out/obj/pb.o")
for src in plugin/image/image.cpp plugin/image/gpu_image.cpp plugin/image/chunk_codec.cpp plugin/image/criu_pages.cpp plugin/image/image_file.cpp plugin/os/dir.cpp plugin/os/file_pages.cpp plugin/os/fs_context.cpp plugin/os/maps.cpp plugin/base/format.cpp plugin/base/gpu.cpp plugin/base/text.cpp tests/fuzz/image_fuzzer.cpp; do
	o=$out/obj/$(basename "$src" .cpp).o
	"$CLANGXX" -std=c++20 "${san[@]}" "${inc[@]}" -c "$top/$src" -o "$o"
	objs+=("$o")
done
"$CLANGXX" -fsanitize=fuzzer,address,undefined "${objs[@]}" "${pbc_libs[@]}" -o "$out/image_fuzzer"

# New inputs go to a scratch corpus; the checked-in seeds are only read.
rm -rf "$out/work"
mkdir -p "$out/work"
echo "fuzzing decode_image, decode_gpu_index and the chunk decoder for ${seconds}s (seeds: $here/corpus)"
rc=0
# A small ASan quarantine keeps the RSS of a long run well under -rss_limit_mb.
export ASAN_OPTIONS=${ASAN_OPTIONS:-quarantine_size_mb=32:detect_leaks=1}
# -max_len: inputs as large as the largest image read_image() accepts (kImageMaxBytes, 4 MiB, plus the
# 12-byte header), so that mutations reach the images that cost most to decode.
"$out/image_fuzzer" -max_total_time="$seconds" -rss_limit_mb=512 -malloc_limit_mb=64 -timeout=5 \
	-max_len=$((4 * 1024 * 1024 + 12)) \
	-print_final_stats=1 -artifact_prefix="$out/artifacts/" "$@" "$out/work" "$here/corpus" || rc=$?
if [ $rc -ne 0 ]; then
	echo "FAIL: the fuzzer found a problem (exit $rc); reproducers:" >&2
	ls -l "$out/artifacts" >&2
	echo "replay one with: $out/image_fuzzer ARTIFACT; add it to tests/fuzz/corpus/ once fixed" >&2
	exit 1
fi
echo "PASS: no crash, leak, timeout or large allocation in ${seconds}s ($(ls "$out/work" | wc -l) new inputs)"
