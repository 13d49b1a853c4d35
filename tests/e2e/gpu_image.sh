#!/usr/bin/env bash
# The plugin's own GPU image (gpu-image=plugin, the default; docs/gpu-image.md): the plugin stores the
# fake driver's copies itself (several files, all-zero chunks left out, a CRC-32C per chunk) and CRIU
# leaves them out of pages-N.img (criu-patches/0004); the restore checks every chunk before the driver's
# restore. Then what damages or moves an image: a flipped byte, a file cut short or missing, files of
# another dump, holes filled with zeros, a restore without our plugin, stock CRIU 4.1.1 on either side,
# gpu-image=criu, --leave-running, and the dumps that cannot leave pages out.
source "$(dirname "$0")/lib.sh"
e2e_setup
start_fake_gpu

# dump_gpu NAME [criu dump options]: a 16 MiB workload with 32 MiB of zeroed device memory, dumped into
# $T/NAME; sets pid, img.
dump_gpu() {
	local name=$1
	shift
	start_memcheck "$name" 16 --zero-mb 32
	pid=$LAST_PID img=$T/$name
	dump "$pid" "$img" "$@" || fail "$name: dump failed"
	wait_gone "$pid"
}

bytes_of() { du -cb --apparent-size "$@" 2>/dev/null | tail -n1 | cut -f1; }

# must_fail NAME DIR PATTERN [criu options]: the restore fails within 20 s naming the problem (a plugin
# error matching PATTERN), and nothing of the dumped process runs.
must_fail() {
	local name=$1 dir=$2 pattern=$3 t0=$SECONDS
	shift 3
	if timeout -s KILL 20 "$CRIU" restore -D "$dir" -d -L "$PLUGIN_DIR" -v4 -o restore.log "$@" </dev/null >/dev/null 2>&1; then
		fail "$name: the restore succeeded"
	fi
	cp "$dir/restore.log" "$T/restore.log"
	expect_log "$T/restore.log" "$pattern" "$name: the failure does not say what is wrong"
	wait_for "$name: no restored process" 20 gone "$pid"
	log "$name: refused in $((SECONDS - t0)) s: $(grep -m1 -oE "$pattern.*" "$T/restore.log" | cut -c1-160)"
}

# 1. The plugin stores the GPU state; CRIU's pages images do not hold it; the restore checks and writes it.
dump_gpu base
# written on the plugin's threads while CRIU dumped the process (criu-patches/0009), before CRIU's inventory
expect_log "$T/dump.log" "cuda_plugin: GPU image: written while CRIU dumps the processes" \
	"the GPU image was not written while CRIU dumped the process"
[ "$(grep -n 'GPU image: written while CRIU dumps' "$T/dump.log" | cut -d: -f1)" -lt \
	"$(grep -n 'Writing image inventory' "$T/dump.log" | cut -d: -f1)" ] ||
	fail "the GPU image's write did not start before CRIU's inventory"
expect_log "$T/dump.log" "GPU image: [0-9.]+ MiB of GPU state, [0-9.]+ MiB written \(([5-9][0-9])\.[0-9]% zero pages\) into [1-9][0-9]* file" \
	"no summary of the GPU image (or too few zero pages left out)"
[ -f "$img/cuda-gpu.img" ] && [ -f "$img/cuda-gpu-0.img" ] || fail "no GPU image files"
pages=$(bytes_of "$img"/pages-*.img)
# The workload's own 16 MiB host buffer stays; the 48 MiB of GPU state (16 of data) must not be there.
[ "$pages" -lt $((24 << 20)) ] || fail "CRIU still wrote the GPU state: pages images of $pages bytes"
expect_log "$T/dump.log" "saved by a plugin" "CRIU's log does not say it left pages to the plugin"
log "dump: pages images $((pages >> 10)) KiB, GPU image $(( $(bytes_of "$img"/cuda-gpu-*.img) >> 10 )) KiB apparent, $(du -ck "$img"/cuda-gpu-*.img | tail -n1 | cut -f1) KiB on disk"
cp -a "$img" "$T/pristine"
base_pid=$pid
restore "$img" || fail "restore failed"
expect_log "$T/restore.log" "GPU image is written into the processes by the plugin|asking CRIU to map its GPU image" \
	"the restore does not say how the GPU image comes back"
expect_summary "$T/restore.log" restore 1 "no restore summary" "GPU image checked in"
healthy_then_gone
log "plugin-written GPU image: dump and restore ok"

# variant NAME: a fresh copy of the pristine dump in $V.
variant() { V=$T/v-$1; rm -rf "$V"; cp -a "$T/pristine" "$V"; }
data_file() { ls "$V"/cuda-gpu-[0-9]*.img | xargs -n1 du -b | sort -n | tail -n1 | cut -f2; } # the largest

# flip_stored_byte FILE: one byte of chunk data flipped (XOR 0x55): the first non-zero byte after the
# header. Holes (zero chunks left out) read as zeros, so the byte lies in a stored chunk, wherever the
# writer threads put the chunks.
flip_stored_byte() {
	python3 -c 'import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
off = 4096
while True:
    b = os.pread(fd, 1 << 20, off)
    if not b:
        sys.exit("no stored data in " + sys.argv[1])
    nz = next((i for i, x in enumerate(b) if x), None)
    if nz is not None:
        os.pwrite(fd, bytes([b[nz] ^ 0x55]), off + nz)
        break
    off += len(b)
os.close(fd)' "$1"
}

# 2. Damage: every case refused by name before the driver's restore, nothing left running.
variant flipped
f=$(data_file)
flip_stored_byte "$f"
must_fail flipped "$V" "fails its checksum \(CRC-32C [0-9a-f]+, recorded [0-9a-f]+\)"
expect_log "$T/restore.log" "in $(basename "$f") at offset [0-9]+ fails its checksum" "flipped: the file is not named"

# The same flipped byte with the image out of the page cache: read from the disk by the check of what CRIU
# maps, which starts once CRIU has forked the tasks; the process is never unlocked.
variant flipped-cold
f=$(data_file)
flip_stored_byte "$f"
python3 -c 'import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.fdatasync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$V"/cuda-gpu*.img
must_fail flipped-cold "$V" "the GPU image CRIU maps failed its check; the processes are not unlocked"
expect_log "$T/restore.log" "in $(basename "$f") at offset [0-9]+ fails its checksum" "flipped-cold: the file is not named"

variant truncated
f=$(data_file)
truncate -s $(( $(stat -c %s "$f") - 8192 )) "$f"
must_fail truncated "$V" "$(basename "$f") is cut short"

variant missing-data
rm "$(data_file)"
must_fail missing-data "$V" "open cuda-gpu-[0-9]+\.img \(a file of the GPU image\)"

variant missing-index
rm "$V/cuda-gpu.img"
must_fail missing-index "$V" "cuda-gpu.img is missing"

variant missing-plugin-image
rm "$V/cuda-plugin.img"
must_fail missing-plugin-image "$V" "holds a GPU image \(cuda-gpu.img\) but no cuda-plugin.img"

dump_gpu other
pid=$base_pid STATE=$T/base.state # the variants restore the first dump
variant swapped # the data files of another dump
cp "$T/other"/cuda-gpu-[0-9]*.img "$V/"
must_fail swapped "$V" "belongs to another dump"

# No plugin that knows the GPU image (CRIU's own CUDA plugin, an older one, none): CRIU refuses by name.
variant no-plugin
mkdir -p "$T/empty-libdir"
if timeout 20 "$CRIU" restore -D "$V" -d -L "$T/empty-libdir" -v4 -o restore.log </dev/null >/dev/null 2>&1; then
	fail "no-plugin: restored without the plugin (the GPU would get zeros)"
fi
expect_log "$V/restore.log" "Missing required plugin: cuda-gpu-image" "no-plugin: CRIU does not name the GPU image"
wait_for "no-plugin: no restored process" 20 gone "$pid"
log "no-plugin: refused: $(grep -m1 -o 'Missing required plugin: cuda-gpu-image.*' "$V/restore.log" | cut -c1-120)"

# A copy that filled the holes with zeros (cp --sparse=never, some archivers) verifies and restores.
V=$T/v-filled
cp -r --sparse=never "$T/pristine" "$V"
restore "$V" || fail "filled: restore failed"
healthy_then_gone
log "holes filled with zeros: restored"

# The damaged copy restores once the file is whole again.
variant repaired
f=$(data_file)
truncate -s $(( $(stat -c %s "$f") - 8192 )) "$f"
must_fail repaired-before "$V" "is cut short"
cp "$T/pristine/$(basename "$f")" "$f"
restore "$V" || fail "repaired: restore failed"
healthy_then_gone
log "damage, then the file copied again: restored"

# Restores CRIU cannot map a plugin's files in: --lazy-pages (the plugin writes the GPU image into the
# process) and --auto-dedup (which punches holes only into CRIU's pages files).
variant lazy
start_lazy_pages "$V"
restore "$V" --lazy-pages || fail "lazy pages: restore failed"
expect_log "$T/restore.log" "CRIU refused to map .* from cuda-gpu-[0-9]+\.img \(Operation not supported\); the plugin writes" \
	"lazy pages: no reason logged"
healthy_then_gone
variant dedup
restore "$V" --auto-dedup || fail "auto-dedup: restore failed"
healthy_then_gone
cmp "$V/cuda-gpu-0.img" "$T/pristine/cuda-gpu-0.img" || fail "auto-dedup: the GPU image changed"
log "--lazy-pages (written by the plugin) and --auto-dedup (GPU image untouched): ok"

# 3. gpu-image=criu: today's images, the pages in CRIU's pages images; the plugin keeps only checksums of
#    the GPU state (cuda-gpu.img, no data file) and checks the memory CRIU restored before the driver's
#    restore: a byte flipped in the GPU state inside pages-1.img is refused.
CUDA_CRIU_GPU_IMAGE=criu dump_gpu criu
expect_log "$T/dump.log" "the GPU state stays in CRIU's pages images: gpu-image=criu" "criu: no reason logged"
expect_log "$T/dump.log" "GPU state in CRIU's pages images \(gpu-image=criu\), its checksums taken in" "criu: no checksums"
[ -e "$img/cuda-gpu.img" ] && [ ! -e "$img/cuda-gpu-0.img" ] || fail "criu: expected checksums only, no data file"
cp -a "$img" "$T/criu-pristine"
restore "$img" || fail "criu: restore failed"
expect_log "$T/restore.log" "GPU image checked in" "criu: the restore did not check the GPU state"
healthy_then_gone
# The fake driver's copy of the 32 MiB of zeroed device memory is the longest run of zero pages in
# pages-1.img: one byte flipped in its middle.
V=$T/v-criu-flipped; cp -a "$T/criu-pristine" "$V"
at=$(zero_run_middle "$V/pages-1.img" 123)
printf '\125' | dd of="$V/pages-1.img" bs=1 seek="$at" conv=notrunc status=none
must_fail criu-flipped "$V" "as CRIU restored it from its pages images, fails its checksum"
log "gpu-image=criu: checksums kept, checked over the restored memory, a flipped byte refused: ok"

# 4. --leave-running: the process goes on; dumped again, restored.
start_memcheck leave 16 --zero-mb 32
pid=$LAST_PID
dump "$pid" "$T/leave1" --leave-running || fail "leave-running: dump failed"
sleep 0.3
expect_healthy "$STATE"
dump "$pid" "$T/leave2" --leave-running || fail "leave-running: second dump failed"
kill -9 "$pid"; wait_gone "$pid"
restore "$T/leave2" || fail "leave-running: restore failed"
healthy_then_gone
log "--leave-running twice, then restore: ok"

# 5. A page server: the pages go there, the GPU state stays in the plugin's files beside CRIU's other
#    local images (which reach the restoring side the same way).
start_memcheck server 16 --zero-mb 32
pid=$LAST_PID
mkdir -p "$T/ps-target"
"$CRIU" page-server -D "$T/ps-target" --port 27231 -v4 -o ps.log -d || fail "page-server did not start"
dump "$pid" "$T/ps-dump" --page-server --address 127.0.0.1 --port 27231 || fail "page-server: dump failed"
wait_gone "$pid"
expect_log "$T/dump.log" "GPU image: .* written" "page-server: the plugin did not write its GPU image"
[ -e "$T/ps-dump/cuda-gpu-0.img" ] || fail "page-server: no GPU image data on the dumping side"
served=$(bytes_of "$T"/ps-target/pages-*.img)
[ "$served" -lt $((24 << 20)) ] || fail "page-server: the GPU state went to the page server too ($served bytes of pages)"
cp "$T/ps-target"/*.img "$T/ps-dump/"
restore "$T/ps-dump" || fail "page-server: restore failed"
expect_log "$T/restore.log" "GPU image checked in" "page-server: the GPU state was not checked"
healthy_then_gone
log "--page-server: pages to the page server ($((served >> 10)) KiB), GPU image here, restored together"

# 6. The GPU image written back by the plugin (process_vm_writev), as on a CRIU that cannot map a
#    plugin's files (a stock CRIU: 4.1.1 cannot restore images of CRIU 4.2 at all, so 4.2.1 without the
#    mapping stands in for it); and stock CRIU 4.1.1 dumping: it cannot leave pages out, so the GPU state
#    stays in its pages images.
variant written
pid=$base_pid STATE=$T/base.state
CUDA_CRIU_MAP_IMAGE=off restore "$V" || fail "written: restore failed"
expect_log "$T/restore.log" "GPU image is written into the processes by the plugin: mapping it is off" \
	"written: no reason logged"
healthy_then_gone
log "GPU image written into the process by the plugin: ok"
if stock_criu; then
	CRIU=$CRIU411 dump_gpu stock-dump
	expect_log "$T/dump.log" "this CRIU cannot leave pages to a plugin" "4.1.1 dump: no reason logged"
	[ ! -e "$img/cuda-gpu-0.img" ] || fail "4.1.1: GPU image data was written"
	CRIU=$CRIU411 restore "$img" || fail "4.1.1: restore of its own dump failed"
	healthy_then_gone
	log "stock CRIU 4.1.1: the GPU state stays in its pages images: ok"
else
	log "$STOCK_WHY: skipped that part"
fi
log PASS
