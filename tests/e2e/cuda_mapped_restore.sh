#!/usr/bin/env bash
# Restore at page-cache speed (criu-patches/0002): the fake driver's host copies of the GPU state are
# mapped from the image's pages file instead of being read into fresh memory, the fake restore reads them
# through that mapping, and every case that cannot use it restores as before and says why.
source "$(dirname "$0")/lib.sh"
e2e_setup
start_fake_gpu
# The GPU state in CRIU's pages images (the GPU image the plugin writes itself: gpu_image.sh).
export CUDA_CRIU_GPU_IMAGE=criu
# The fake restore writes its memory map and its copies' addresses before reading the copies.
export FAKEGPU_RECORD_MAPS=1

# check_copies MAPS WANT: WANT=mapped: every host copy lies in a mapping of a pages-N.img;
# WANT=anonymous: none does. Prints what it found.
check_copies() {
	python3 - "$1" "$2" <<'EOF'
import re, sys
maps, copies = [], []
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "copy":
        a, b = f[1].split("-"); copies.append((int(a, 16), int(b, 16)))
    elif len(f) >= 6 and re.search(r"/pages-\d+\.img$", f[5]):
        a, b = f[0].split("-"); maps.append((int(a, 16), int(b, 16)))
def mapped(a, b):
    for s, e in sorted(maps):
        if s <= a < e:
            a = e
        if a >= b:
            return True
    return False
n = sum(mapped(a, b) for a, b in copies)
print(f"{len(copies)} host copies, {n} mapped from the image ({len(maps)} mappings of pages files)")
ok = copies and (n == len(copies) if sys.argv[2] == "mapped" else n == 0)
sys.exit(0 if ok else 1)
EOF
}

# sha256 of memory START-END (hex) of PID; with "file": of the bytes the mapping there shows of its file,
# read from the file, after dropping the file's cached pages that no process maps.
mem_sum() {
	python3 - "$@" <<'EOF'
import hashlib, os, sys
pid, rng = sys.argv[1], sys.argv[2]
a, b = (int(x, 16) for x in rng.split("-"))
if len(sys.argv) > 3:
    line = next(l for l in open(f"/proc/{pid}/maps") if l.startswith(rng + " "))
    fd = os.open(f"/proc/{pid}/map_files/{rng}", os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    print(hashlib.sha256(os.pread(fd, b - a, int(line.split()[2], 16))).hexdigest())
else:
    with open(f"/proc/{pid}/mem", "rb") as f:
        f.seek(a); print(hashlib.sha256(f.read(b - a)).hexdigest())
EOF
}

# 1. Mapped restore: the CRIU log and the plugin's say so, the fake restore reads its copies through
#    mappings of the pages file, the data comes back intact, and the driver's unmap leaves none behind.
start_memcheck mapped 16
pid=$LAST_PID
dump "$pid" "$T/img1" || fail "dump failed"
wait_gone "$pid"
expect_log "$T/dump.log" "pid $pid: the checkpoint mapped [0-9.]+ MiB of new memory in [1-9][0-9]* range" \
	"the dump did not record the checkpoint's memory"
# (The fake driver's copy slowed a little: the file pages are read ahead while it runs.)
FAKEGPU_COPY_MBPS=64 restore "$T/img1" || fail "restore failed"
expect_log "$T/restore.log" \
	"cuda_plugin: pid $pid: asking CRIU to map its GPU state \(.* MiB in [0-9]+ range\(s\)\) from the image" \
	"no plugin line about the mapped restore"
expect_log "$T/restore.log" \
	"Map from image 0x[0-9a-f]+-0x[0-9a-f]+: [1-9][0-9]* pages mapped from pages-[0-9]+\.img, 0 read" \
	"no CRIU line about pages mapped from the image"
check_copies "$FAKEGPU_DIR/restore-maps.$pid" mapped || fail "the fake restore did not read its copies from the image"
# The pages of its mapped files (libc, the fake libcuda) it used: noted at dump, read ahead at restore.
expect_log "$T/dump.log" "pid $pid: [0-9.]+ (KiB|MiB) of its mapped files in use, in [1-9][0-9]* range" \
	"the dump did not note the pages of the process's mapped files"
expect_log "$T/restore.log" "read ahead [0-9.]+ (KiB|MiB) of the [0-9.]+ (KiB|MiB) of files the process\(es\) had mapped and used" \
	"the restore did not read the process's mapped files ahead"
# The image can go at once: the restore is complete.
rm -rf "$T/img1"
expect_healthy "$STATE"
! grep -q "pages-[0-9]*\.img" "/proc/$pid/maps" || fail "the restored process still maps the image"
! grep -q "still maps the image" "$T/restore.log" || fail "unexpected warning about a kept mapping"
log "mapped restore: ok"

# 2. A later dump and restore of the restored process.
dump "$pid" "$T/img1b" || fail "second dump failed"
wait_gone "$pid"
rm "$FAKEGPU_DIR/restore-maps.$pid" # written again by this restore
restore "$T/img1b" || fail "second restore failed"
check_copies "$FAKEGPU_DIR/restore-maps.$pid" mapped || fail "second restore: copies not mapped from the image"
healthy_then_gone
log "dump and restore of a restored process: ok"

# 3. Forked CUDA processes: their copies lie at the same addresses as the parent's, yet each maps its own
#    (CRIU does not treat them as memory shared copy-on-write with the parent).
start_memcheck tree 16 --children 2
root=$LAST_PID
wait_for "the children" 20 test -f "$STATE.1"
kids=$(ps -o pid= --ppid "$root" | xargs)
dump "$root" "$T/img2" || fail "tree: dump failed"
wait_gone "$root" $kids
restore "$T/img2" || fail "tree: restore failed"
for p in $root $kids; do
	check_copies "$FAKEGPU_DIR/restore-maps.$p" mapped || fail "tree: pid $p did not read its copies from the image"
done
for f in "$STATE" "$STATE.0" "$STATE.1"; do expect_healthy "$f"; done
kill -9 "$root" $kids; wait_gone "$root" $kids
log "tree of 3 CUDA processes: ok"

# 4. A driver that keeps its copies mapped after restore: the plugin warns, deleting the image at once is
#    safe (the mapping keeps the file's data), and a later dump records the deleted file (--ghost-limit).
FAKEGPU_KEEP_COPIES=1 start_memcheck kept 16
pid=$LAST_PID
dump "$pid" "$T/img3" || fail "kept: dump failed"
wait_gone "$pid"
restore "$T/img3" || fail "kept: restore failed"
expect_log "$T/restore.log" "pid $pid still maps the image after its GPU state was restored" "kept: no warning"
range=$(grep -m1 "pages-[0-9]*\.img" "/proc/$pid/maps" | cut -d' ' -f1) || fail "kept: no mapping of the image"
before=$(mem_sum "$pid" "$range" file)
rm -rf "$T/img3"
# Pages not touched yet come from the deleted file, which the mapping keeps.
[ "$(mem_sum "$pid" "$range" file)" = "$before" ] || fail "kept: the deleted file's data changed"
[ "$(mem_sum "$pid" "$range")" = "$before" ] || fail "kept: memory differs from the image after deleting it"
expect_healthy "$STATE"
dump "$pid" "$T/img3b" --ghost-limit 256M || fail "kept: dump of the restored process failed"
wait_gone "$pid"
restore "$T/img3b" || fail "kept: second restore failed"
[ "$(mem_sum "$pid" "$range")" = "$before" ] || fail "kept: memory changed by the second restore"
healthy_then_gone
log "copies kept mapped, image deleted, dumped again: ok"

# 5. Each case that cannot map restores as before, and the logs say why.
dump_one off
CUDA_CRIU_MAP_IMAGE=off restore "$img" || fail "off: restore failed"
expect_log "$T/restore.log" "normal restore: mapping the GPU state from the image is off \(CUDA_CRIU_MAP_IMAGE=off\)" \
	"off: no reason logged"
! grep -q "Map from image" "$T/restore.log" || fail "off: CRIU mapped pages anyway"
check_copies "$FAKEGPU_DIR/restore-maps.$pid" anonymous || fail "off: copies mapped from the image"
healthy_then_gone

dump_one dedup
restore "$img" --auto-dedup || fail "auto-dedup: restore failed"
expect_log "$T/restore.log" \
	"Map from image .*: 0 pages mapped from pages-[0-9]+\.img, [1-9][0-9]* read: --auto-dedup punches holes" \
	"auto-dedup: no reason logged"
check_copies "$FAKEGPU_DIR/restore-maps.$pid" anonymous || fail "auto-dedup: copies mapped from the image"
healthy_then_gone

dump_one lazy
start_lazy_pages "$img"
restore "$img" --lazy-pages || fail "lazy pages: restore failed"
expect_log "$T/restore.log" "Map from image .*: 0 pages mapped from pages-[0-9]+\.img, [1-9][0-9]* read: lazy restore" \
	"lazy pages: no reason logged"
check_copies "$FAKEGPU_DIR/restore-maps.$pid" anonymous || fail "lazy pages: copies mapped from the image"
healthy_then_gone
log "CUDA_CRIU_MAP_IMAGE=off, --auto-dedup, --lazy-pages: normal restore: ok"

if stock_criu; then
	CRIU=$CRIU411 dump_one stock
	CRIU=$CRIU411 restore "$img" || fail "CRIU 4.1.1: restore failed"
	expect_log "$T/restore.log" "normal restore: this CRIU cannot map pages from the image" "CRIU 4.1.1: no reason logged"
	check_copies "$FAKEGPU_DIR/restore-maps.$pid" anonymous || fail "CRIU 4.1.1: copies mapped from the image"
	healthy_then_gone
	log "stock CRIU 4.1.1: normal restore: ok"
else
	log "$STOCK_WHY: skipped that part"
fi
log PASS
