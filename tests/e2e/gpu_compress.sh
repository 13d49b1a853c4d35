#!/usr/bin/env bash
# The GPU image compressed (compress=zstd; docs/gpu-image.md, "Compression"): a fake-GPU workload whose
# device memory holds bf16-like weights and zeros is dumped with CUDA_CRIU_COMPRESS=zstd; the dump's summary
# and cuda-criu inspect give the ratio, --verify decodes and checks every chunk, and the restore decodes the
# chunks into memory CRIU maps into the process (or, with mapping off, writes them), the data verified. Then damaged copies, each refused by name (file, offset) before any
# process runs, nothing left running: a flipped byte in a compressed chunk, a chunk cut short, a stored
# length and an encoding that lie, a chunk that declares more than the 2 MiB chunk size (a decompression
# bomb). Incremental dumps across compressed and raw images: tests/unit/gpu_incremental_test.cpp.
source "$(dirname "$0")/lib.sh"
e2e_setup
start_fake_gpu
EDIT=$BUILD_DIR/tests/fuzz/gpu_index_edit
[ -x "$EDIT" ] || fail "no $EDIT: build the gpu_index_edit target"

start_memcheck compressed 24 --zero-mb 16 --pattern weights
pid=$LAST_PID
CUDA_CRIU_COMPRESS=zstd dump "$pid" "$T/img" || fail "dump with compress=zstd failed"
wait_gone "$pid"
# "...; compressed (zstd-1): 24.0 MiB of data stored in 13.9 MiB, 1.73x, 0 B raw; ..."
expect_log "$T/dump.log" "GPU image: .*compressed \(zstd-1\): [0-9.]+ MiB of data stored in [0-9.]+ MiB, 1\.[5-9][0-9]x" \
	"the dump's summary gives no compression ratio of at least 1.5x"
log "dump: $(grep -oE "compressed \(zstd-1\)[^;]*" "$T/dump.log" | head -n1)"
cuda_criu inspect "$T/img" >"$T/inspect.out" || fail "cuda-criu inspect failed"
grep -qE "^compressed \(zstd\): [0-9]+ chunk\(s\) holding [0-9.]+ MiB stored in [0-9.]+ MiB, 1\.[5-9][0-9]x" "$T/inspect.out" ||
	fail "inspect shows no compression: $(cat "$T/inspect.out")"
cuda_criu inspect --json "$T/img" | py 'assert d["gpu_image"]["total"]["compressed_chunks"] > 0, d["gpu_image"]["total"]' ||
	fail "inspect --json has no compressed chunks"
cuda_criu inspect --verify "$T/img" >"$T/verify.out" 2>&1 || fail "inspect --verify failed: $(cat "$T/verify.out")"
cp -a "$T/img" "$T/pristine"
restore "$T/img" || fail "restore of the compressed image failed"
expect_summary "$T/restore.log" restore 1 "no clean restore summary"
alive "$pid" && [ "$(cuda_state "$pid")" = running ] || fail "pid $pid not running after the restore"
expect_healthy "$STATE"
# Decoded while CRIU restored, into memory CRIU mapped (criu-patches/0008), given back once restored.
expect_log "$T/restore.log" "MiB from the memory its compressed chunks are decoded into while CRIU restores \(2 MiB pages\)" \
	"the compressed chunks were not decoded into memory CRIU maps, on 2 MiB pages"
expect_log "$T/restore.log" "Mapped [0-9]+ runs of pages from [0-9]+ plugin file" "CRIU mapped no run from the plugin's memory"
! grep -q "are written by the plugin" "$T/restore.log" || fail "the plugin wrote compressed chunks into the process"
! grep -q "cuda-criu-gpu-" "/proc/$pid/maps" || fail "pid $pid still maps the decoded GPU state: $(grep cuda-criu-gpu- "/proc/$pid/maps")"
log "restored from the compressed image (decoded into memory CRIU mapped, given back): running, data verified"

kill -9 "$pid"
wait_gone "$pid"

# Mapping off (CUDA_CRIU_MAP_IMAGE=off): the plugin writes every chunk into the process itself.
cp -a "$T/pristine" "$T/img-written"
CUDA_CRIU_MAP_IMAGE=off restore "$T/img-written" || fail "restore of the compressed image with mapping off failed"
alive "$pid" && [ "$(cuda_state "$pid")" = running ] || fail "pid $pid not running after the restore with mapping off"
expect_healthy "$STATE"
expect_log "$T/restore.log" "the GPU image is written into the processes by the plugin: mapping it is off" \
	"the restore with mapping off did not write the GPU image"
log "restored with mapping off (the plugin writes the chunks): running, data verified"
kill -9 "$pid"
wait_gone "$pid"

# damaged NAME PATTERN: the restore of $V fails within 20 s naming what is wrong, and nothing runs.
damaged() {
	local name=$1 pattern=$2
	if timeout -s KILL 20 "$CRIU" restore -D "$V" -d -L "$PLUGIN_DIR" -v4 -o restore.log </dev/null >/dev/null 2>&1; then
		fail "compress-$name: the restore succeeded"
	fi
	cp "$V/restore.log" "$T/restore-$name.log"
	expect_log "$T/restore-$name.log" "Error \(cuda_plugin\): .*$pattern" "compress-$name: the failure does not say what is wrong"
	wait_for "compress-$name: no restored process" 20 gone "$pid"
	! pgrep -f -- "--state $STATE" >/dev/null || fail "compress-$name: a process of the image runs"
	log "compress-$name: refused: $(grep -m1 -oE "$pattern.*" "$T/restore-$name.log" | cut -c1-170)"
}
variant() { V=$T/v-$1; rm -rf "$V"; cp -a "$T/pristine" "$V"; }

# A flipped byte in the middle of a compressed chunk: named with its file and offset.
variant flipped
read -r file offset addr < <("$EDIT" "$V")
python3 - "$V/$file" "$offset" <<'EOF'
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
at = int(sys.argv[2]) + 3000
b = os.pread(fd, 1, at)
os.pwrite(fd, bytes([b[0] ^ 0x55]), at)
EOF
damaged flipped "GPU state at $addr \([0-9]+ bytes(, zstd[^)]*)?\) in $file at offset $offset (does not decode|fails its checksum)"

# A chunk cut short: its data file truncated inside it.
variant truncated
read -r file offset addr < <("$EDIT" "$V")
truncate -s $((offset + 100)) "$V/$file"
damaged truncated "$file is cut short|lies past the end of $file"

# A stored length that lies: shorter than the frame, and longer (over the next chunk, or past the file's end).
variant stored-len
read -r file offset addr < <("$EDIT" "$V" --stored-len 4096)
damaged stored-len "GPU state at $addr \([0-9]+ bytes, zstd[^)]*in 4096 bytes\) in $file at offset $offset does not decode"
variant stored-len-longer
"$EDIT" "$V" --stored-len 0x1fffff >/dev/null
damaged stored-len-longer "(corrupt GPU image index: .*lies past the end|GPU state at $addr .* does not decode)"

# An encoding that lies: raw with a stored length, an unknown one, zstd for shuffled.
variant encoding-raw
"$EDIT" "$V" --encoding 0 >/dev/null
damaged encoding-raw "corrupt GPU image index: .*is stored as encoding 0"
variant encoding-unknown
"$EDIT" "$V" --encoding 9 >/dev/null
damaged encoding-unknown "corrupt GPU image index: .*is stored as encoding 9"
variant encoding-swapped
read -r file offset addr < <("$EDIT" "$V" --encoding 1)
damaged encoding-swapped "GPU state at $addr .* in $file at offset $offset (does not decode|fails its checksum)"

# A chunk that declares more than the 2 MiB chunk size: refused from the index, nothing decoded.
variant bomb
"$EDIT" "$V" --len $((64 << 20)) >/dev/null
damaged bomb "corrupt GPU image index: process [0-9]+, chunk at $addr declares 67108864 bytes, more than the image.s chunk size \(2097152\)"
log PASS
