#!/usr/bin/env bash
# cuda-criu inspect: a real image (text and JSON) with the plugin's GPU image, --verify of it intact and
# damaged (a flipped byte, files cut short or missing), an image whose GPU state CRIU's pages images hold
# (gpu-image=criu), CRIU's pagemaps read by hand, a directory without our file, and image files that are
# truncated, corrupt, of another kind, from a newer plugin, or a symbolic link.
source "$(dirname "$0")/lib.sh"
e2e_strict_setup
start_fake_gpu


# 1. A real image: one process with 16 MiB of data and 32 MiB of device memory set to zero (--zero-mb),
# its GPU state in the plugin's GPU image (gpu-image=plugin, the default).
start_memcheck one 16 --zero-mb 32
pid=$LAST_PID
dump "$pid" "$T/img" || fail "dump failed"
wait_gone "$pid"
cuda_criu inspect "$T/img" >"$T/text" || fail "inspect failed"
grep -qE '^image format 2, plugin [^ ]+, NVIDIA driver .*, host ' "$T/text" || fail "inspect: header: $(cat "$T/text")"
grep -qE '^1 CUDA process\(es\), 4[89]\.[0-9] MiB of GPU state in all$' "$T/text" || fail "inspect: totals"
grep -qE '^GPU 0: GPU-[0-9a-f-]{36} NVIDIA Fake H200, 16\.0 GiB' "$T/text" || fail "inspect: GPU line"
grep -qE "^$pid +[0-9]+ +running +4[89]\.[0-9] MiB +[0-9.]+ ms +[0-9.]+ s  GPU-" "$T/text" ||
	fail "inspect: process line: $(cat "$T/text")"
cuda_criu inspect --json "$T/img" >"$T/json" || fail "inspect --json failed"
py "assert d['cuda_image'] is True and d['version'] == 2, d
p = d['processes']
assert len(p) == 1 and p[0]['pid'] == $pid and p[0]['initial_state'] == 'running', p
assert 48 << 20 <= p[0]['state_bytes'] < 50 << 20, p
assert p[0]['gpu_uuids'] == [d['gpus'][0]['uuid']], p
assert d['created_unix'] > 1600000000 and d['device_phase_us'] > 0, d" <"$T/json" || fail "inspect --json: $(cat "$T/json")"
# Who holds the GPU state, and the GPU image: its file, the process's chunks, zero share, totals.
grep -qxF "GPU state: the plugin's GPU image (cuda-gpu*.img): restore needs this project's cuda_plugin.so" "$T/text" ||
	fail "inspect: who holds the GPU state: $(cat "$T/text")"
grep -qE '^GPU image [0-9a-f]{32}: [1-9][0-9]* data file\(s\), CRC-32C per 2 MiB chunk; written in [0-9.]+ s, [0-9.]+ GB/s of GPU state$' \
	"$T/text" || fail "inspect: GPU image line: $(cat "$T/text")"
grep -qE '^cuda-gpu-0\.img +1[0-9]\.[0-9] MiB +1[0-9]\.[0-9] MiB +[0-9]+\.[0-9] MiB$' "$T/text" || fail "inspect: file line"
grep -qE "^$pid +[0-9]+ +4[89]\.[0-9] MiB +1[0-9]\.[0-9] MiB +6[0-9]\.[0-9]% +[1-9][0-9]*$" "$T/text" ||
	fail "inspect: GPU image process line: $(cat "$T/text")"
grep -qE '^4[89]\.[0-9] MiB of GPU state: 6[0-9]\.[0-9]% in all-zero chunks \(not stored\), 1[0-9]\.[0-9] MiB written \(6[0-9]\.[0-9]% zero pages\), [0-9.]+ MiB on disk$' \
	"$T/text" || fail "inspect: GPU image totals: $(cat "$T/text")"
py "assert d['gpu_state_in'] == 'gpu_image', d
g = d['gpu_image']
assert len(g['id']) == 32 and g['index'] == 'cuda-gpu.img' and g['checksum'] == 'CRC-32C', g
assert g['chunk_bytes'] == 2 << 20 and g['write_us'] > 0 and g['write_gb_per_s'] > 0, g
f = g['files']
assert f and f[0]['name'] == 'cuda-gpu-0.img', f
assert all(x['present'] and 4096 < x['data_bytes'] <= x['size'] and x['disk_bytes'] > 0 for x in f), f
p = g['processes']
assert len(p) == 1 and p[0]['pid'] == $pid and p[0]['chunks'] > 0, p
assert 48 << 20 <= p[0]['state_bytes'] < 50 << 20, p
assert p[0]['stored_bytes'] + p[0]['zero_bytes'] == p[0]['state_bytes'] and 0.6 < p[0]['zero_share'] < 0.7, p
t = g['total']
assert t['chunks'] == p[0]['chunks'] and t['data_bytes'] == sum(x['data_bytes'] for x in f), t" <"$T/json" ||
	fail "inspect --json: the GPU image: $(cat "$T/json")"
log "real image: the GPU image's files, chunks and zero share: ok"

# --verify of the intact image: every check ok, the rate, and what has no checksum.
cuda_criu inspect --verify "$T/img" >"$T/verify" || fail "inspect --verify of an intact image failed: $(cat "$T/verify")"
for re in "cuda-plugin\.img +format 2, 1 CUDA process\(es\); the GPU state is in the plugin's GPU image" \
	"inventory\.img +CRIU image version [0-9]+; a restore needs the plugin\(s\): .*cuda-gpu-image" \
	"cuda-gpu\.img +of this dump; [1-9][0-9]* data file\(s\), 1 process\(es\), [1-9][0-9]* chunk\(s\)$" \
	"cuda-gpu-0\.img +of this dump, whole: [0-9]+ bytes" \
	"checksums +CRC-32C of [1-9][0-9]* chunk\(s\), 1[0-9]\.[0-9] MiB, read by [1-9][0-9]* thread\(s\): every one matches$" \
	"pagemap-$pid\.img +pages-[0-9]+\.img holds the [1-9][0-9]* bytes \([0-9.]+ MiB\) its [1-9][0-9]* entries declare$"; do
	grep -qE "^ok +$re" "$T/verify" || fail "inspect --verify: no line '$re': $(cat "$T/verify")"
done
! grep -q '^FAIL' "$T/verify" || fail "inspect --verify: a failure: $(cat "$T/verify")"
grep -qE '^result: ok, every file a restore needs is present and whole \(read 1[0-9]\.[0-9] MiB in [0-9.]+ s, [0-9.]+ GB/s\)$' \
	"$T/verify" || fail "inspect --verify: result line: $(cat "$T/verify")"
grep -qE "^note: CRIU keeps no checksum of the processes' ordinary memory: .*only the GPU state \(cuda-gpu-\*\.img\) is checksummed" \
	"$T/verify" || fail "inspect --verify: no word on checksums"
cuda_criu inspect --verify --json "$T/img" | py "assert d['result'] == 'ok' and d['gpu_state_in'] == 'gpu_image', d
c = {x['name']: x for x in d['checks']}
assert all(x['status'] == 'ok' for x in d['checks']), d
assert {'cuda-plugin.img', 'inventory.img', 'cuda-gpu.img', 'cuda-gpu-0.img', 'checksums', 'pagemap-$pid.img'} <= set(c), c
assert d['bytes_read'] >= 16 << 20 and d['seconds'] > 0 and d['gb_per_s'] > 0, d
assert 'no checksum' in d['checksums'], d" || fail "inspect --verify --json"
log "inspect --verify of the intact image: ok ($(tail -n2 "$T/verify" | head -n1))"
cp -a "$T/img" "$T/pristine"

# The image restores after being read (inspect changes nothing).
restore "$T/img" || fail "restore after inspect failed"
healthy_then_gone
log "real image: text and JSON describe the process, and it restores: ok"

# 1b. --verify of damaged copies: exit 1, naming the file and what is wrong.
variant() { V=$T/v-$1; rm -rf "$V"; cp -a "$T/pristine" "$V"; }
largest() { ls -S "$V"/$1 | head -n1; }
# verify_fails NAME PATTERN: inspect --verify of $V exits 1 with a FAIL line matching PATTERN (and JSON too).
verify_fails() {
	local rc=0
	cuda_criu inspect --verify "$V" >"$T/$1.verify" 2>&1 || rc=$?
	[ $rc -eq 1 ] || fail "$1: inspect --verify exited $rc: $(cat "$T/$1.verify")"
	grep -qE "^FAIL  $2" "$T/$1.verify" || fail "$1: no FAIL line matching '$2': $(cat "$T/$1.verify")"
	grep -q '^result: FAIL, [1-9] check(s) failed' "$T/$1.verify" || fail "$1: result line: $(cat "$T/$1.verify")"
	rc=0
	cuda_criu inspect --verify --json "$V" >"$T/$1.json" || rc=$?
	[ $rc -eq 1 ] || fail "$1: inspect --verify --json exited $rc"
	py "assert d['result'] == 'fail' and any(x['status'] == 'fail' for x in d['checks']), d" <"$T/$1.json" ||
		fail "$1: JSON: $(cat "$T/$1.json")"
	log "$1: $(grep -m1 '^FAIL' "$T/$1.verify" | cut -c1-200)"
}

variant flipped # one byte of GPU state past the data file's 4096-byte header
f=$(largest 'cuda-gpu-[0-9]*.img')
off=$((4096 + 12345))
b=$(od -An -tu1 -j $off -N1 "$f" | tr -d ' ')
printf "$(printf '\\%03o' $((b ^ 0x5a)))" | dd of="$f" bs=1 seek=$off conv=notrunc status=none
verify_fails flipped "checksums +pid [0-9]+: GPU state at 0x[0-9a-f]+ \([0-9]+ bytes\) in $(basename "$f") at offset [0-9]+ fails its checksum"

variant pages-cut
p=$(largest 'pages-*.img')
truncate -s -8192 "$p"
verify_fails pages-cut "pagemap-[0-9]+\.img +$(basename "$p") is cut short: [0-9]+ bytes, its entries declare [0-9]+; the pages of 0x[0-9a-f]+ \(the entry at offset [0-9]+ of pagemap-[0-9]+\.img\) lie at offset [0-9]+-[0-9]+ of $(basename "$p")$"

variant missing-data
f=$(largest 'cuda-gpu-[0-9]*.img')
rm "$f"
verify_fails missing-data "$(basename "$f") +open $(basename "$f") \(a file of the GPU image\) in the image directory: No such file or directory"

variant data-cut
f=$(largest 'cuda-gpu-[0-9]*.img')
truncate -s -4096 "$f"
verify_fails data-cut "$(basename "$f") +$(basename "$f") is cut short: [0-9]+ bytes, the index records [0-9]+"

variant missing-index
rm "$V/cuda-gpu.img"
verify_fails missing-index "cuda-gpu\.img +missing"
rc=0; cuda_criu inspect "$V" >"$T/out" 2>"$T/err" || rc=$?
[ $rc -eq 1 ] && grep -q "cuda-gpu.img is missing" "$T/err" || fail "inspect without cuda-gpu.img: exit $rc, $(cat "$T/err")"
log "damaged copies: each --verify fails naming the file: ok"

# 1c. gpu-image=criu: the GPU state stays in CRIU's pages images, which CRIU's own CUDA plugin restores too.
start_memcheck criu 16 --zero-mb 32
pid=$LAST_PID
CUDA_CRIU_GPU_IMAGE=criu dump "$pid" "$T/img-criu" || fail "gpu-image=criu: dump failed"
wait_gone "$pid"
[ ! -e "$T/img-criu/cuda-gpu-0.img" ] || fail "gpu-image=criu: GPU image data was written"
cuda_criu inspect "$T/img-criu" >"$T/criu.txt" || fail "gpu-image=criu: inspect failed"
grep -qxF "GPU state: CRIU's pages images (pages-*.img): CRIU's own CUDA plugin can restore it too" "$T/criu.txt" ||
	fail "gpu-image=criu: who holds the GPU state: $(cat "$T/criu.txt")"
! grep -q '^GPU image ' "$T/criu.txt" || fail "gpu-image=criu: a GPU image shown"
cuda_criu inspect --json "$T/img-criu" | py "assert d['version'] == 1 and d['gpu_state_in'] == 'criu_pages' and d['gpu_image'] is None, d" ||
	fail "gpu-image=criu: JSON"
cuda_criu inspect --verify "$T/img-criu" >"$T/criu.verify" || fail "gpu-image=criu: --verify failed: $(cat "$T/criu.verify")"
grep -qE "^ok +cuda-plugin\.img +format 1, 1 CUDA process\(es\); the GPU state is in CRIU's pages images$" "$T/criu.verify" ||
	fail "gpu-image=criu: --verify: $(cat "$T/criu.verify")"
grep -qE "^ok +cuda-gpu\.img +CRC-32C of [1-9][0-9]* chunk\(s\) of the GPU state in CRIU's pages images" "$T/criu.verify" ||
	fail "gpu-image=criu: --verify does not show the checksums: $(cat "$T/criu.verify")"
! grep -qE '^(ok|FAIL) +cuda-gpu-[0-9]' "$T/criu.verify" || fail "gpu-image=criu: GPU image data checks"
grep -qE "^ok +checksums +[1-9][0-9]* chunk\(s\) of the GPU state in the pages images match" "$T/criu.verify" ||
	fail "gpu-image=criu: --verify did not check the GPU state in the pages images: $(cat "$T/criu.verify")"
grep -q "^note: .*the GPU state is in them too (gpu-image=criu): its checksums (cuda-gpu.img) are checked here and by the restore" "$T/criu.verify" ||
	fail "gpu-image=criu: no word on checksums"
# A byte flipped in the GPU state inside pages-1.img (the middle of its longest run of zero pages: the fake
# driver's copy of the zeroed device memory): --verify fails naming the address and the file.
cp -a "$T/img-criu" "$T/img-criu-bad"
at=$(zero_run_middle "$T/img-criu-bad/pages-1.img" 77)
printf '\125' | dd of="$T/img-criu-bad/pages-1.img" bs=1 seek="$at" conv=notrunc status=none
rc=0; cuda_criu inspect --verify "$T/img-criu-bad" >"$T/criu-bad.verify" || rc=$?
[ $rc -eq 1 ] && grep -qE "^FAIL +checksums +pid [0-9]+: GPU state at 0x[0-9a-f]+ \(2097152 bytes\) in pages-1\.img fails its checksum" "$T/criu-bad.verify" ||
	fail "gpu-image=criu: --verify of a flipped byte: exit $rc, $(cat "$T/criu-bad.verify")"
log "gpu-image=criu: CRIU's pages images hold the GPU state; --verify passes: ok"

# 1d. CRIU's pagemap, read by hand: pages_id 7; an entry without flags (present, as older CRIUs wrote
# them) of 2 pages at 0x1000 (offset 14), one in the parent image (3 pages), a lazy one (1 page), a present
# one with nr_pages (1 page at 0x30000, offset 49).
mkdir -p "$T/pm"
cp "$T/img-criu/inventory.img" "$T/pm/"
pagemap() {
	printf '\x19\x43\x56\x54\x25\x40\x08\x56\x02\x00\x00\x00\x08\x07'
	printf '\x05\x00\x00\x00\x08\x80\x20\x10\x02'
	printf '\x08\x00\x00\x00\x08\x80\x80\x04\x10\x03\x18\x01'
	printf '\x0a\x00\x00\x00\x08\x80\x80\x08\x10\x00\x20\x02\x28\x01'
	printf '\x0a\x00\x00\x00\x08\x80\x80\x0c\x10\x00\x20\x04\x28\x01'
}
pagemap >"$T/pm/pagemap-1.img"
head -c 12288 /dev/zero >"$T/pm/pages-7.img"
cuda_criu inspect --verify "$T/pm" >"$T/pm.txt" || fail "pagemap: --verify failed: $(cat "$T/pm.txt")"
grep -qxF "ok    pagemap-1.img         pages-7.img holds the 12288 bytes (0.0 MiB) its 4 entries declare; 12288 bytes in the parent image (not checked); 4096 bytes served by lazy migration (in no image)" \
	"$T/pm.txt" || fail "pagemap: $(cat "$T/pm.txt")"
grep -qE '^ok +cuda-plugin\.img +absent' "$T/pm.txt" || fail "pagemap: cuda-plugin.img line"
truncate -s 10000 "$T/pm/pages-7.img"
V=$T/pm verify_fails pagemap-cut "pagemap-1\.img +pages-7\.img is cut short: 10000 bytes, its entries declare 12288; the pages of 0x30000 \(the entry at offset 49 of pagemap-1\.img\) lie at offset 8192-12288 of pages-7\.img$"
head -c 12288 /dev/zero >"$T/pm/pages-7.img"
{ pagemap; printf '\x05\x00\x00\x00\x08'; } >"$T/pm/pagemap-1.img"
V=$T/pm verify_fails pagemap-short "pagemap-1\.img +cut short at offset 63: a message of 5 bytes, 1 left$"
pagemap >"$T/pm/pagemap-1.img"
rm "$T/pm/pages-7.img"
V=$T/pm verify_fails pages-missing "pagemap-1\.img +pages-7\.img: No such file or directory"
head -c 12288 /dev/zero >"$T/pm/pages-7.img"
cp "$T/pristine/inventory.img" "$T/pm/" # lists the GPU image, but there is no cuda-plugin.img
V=$T/pm verify_fails inventory-gpu "inventory\.img +lists the plugin's GPU image, but cuda-plugin\.img names none"
log "pagemaps read by hand (compat, parent, lazy entries; cut short), the inventory: ok"

# 2. A directory without cuda-plugin.img (as CRIU's own CUDA plugin leaves it) is not an error.
mkdir -p "$T/none"
cuda_criu inspect "$T/none" >"$T/none.txt" || fail "inspect of a directory without our file failed"
grep -q "has no cuda-plugin.img" "$T/none.txt" || fail "no-image message: $(cat "$T/none.txt")"
cuda_criu inspect --json "$T/none" | py "assert d['cuda_image'] is False and 'processes' not in d, d" ||
	fail "no-image JSON"
log "directory without cuda-plugin.img: ok"

# expect_bad NAME PATTERN: inspect of $T/NAME fails with exit 1 and a message matching PATTERN.
expect_bad() {
	local rc=0
	cuda_criu inspect "$T/$1" >"$T/$1.out" 2>"$T/$1.err" || rc=$?
	[ $rc -eq 1 ] || fail "$1: inspect exited $rc"
	[ ! -s "$T/$1.out" ] || fail "$1: printed something on stdout: $(cat "$T/$1.out")"
	grep -qE "$2" "$T/$1.err" || fail "$1: message '$(cat "$T/$1.err")' does not match '$2'"
	rc=0
	cuda_criu inspect --json "$T/$1" >/dev/null 2>&1 || rc=$?
	[ $rc -eq 1 ] || fail "$1: inspect --json exited $rc"
}
# bad NAME: a directory holding a crafted cuda-plugin.img, written by the printf arguments that follow.
bad() {
	local dir=$T/$1
	shift
	mkdir -p "$dir"
	printf "$@" >"$dir/cuda-plugin.img"
}

mkdir -p "$T/truncated"
head -c 30 "$T/img/cuda-plugin.img" >"$T/truncated/cuda-plugin.img"
expect_bad truncated "cuda-plugin.img: truncated or padded image: header says [0-9]+ bytes of data, file has 18"

bad padded 'CUDACRIU\x02\x00\x00\x00\x08\x01\x00\x00'
expect_bad padded "truncated or padded image: header says 2 bytes of data, file has 4"

bad corrupt 'CUDACRIU\x04\x00\x00\x00\xff\xff\xff\xff'
expect_bad corrupt "corrupt image: its data does not parse"

bad foreign 'PK\x03\x04\x14\x00\x00\x00\x08\x00some zip file'
expect_bad foreign "not a cuda_plugin image \(bad magic\): the file is corrupt or of another kind"

bad empty ''
expect_bad empty "truncated image: 0 bytes, shorter than its 12-byte header"

# version 3, plugin_version "9.9" (protobuf fields 1 and 3)
bad newer 'CUDACRIU\x07\x00\x00\x00\x08\x03\x1a\x039.9'
expect_bad newer "image format version 3 was written by a newer cuda_plugin \(9\.9\); this plugin reads versions up to 2"

bad version0 'CUDACRIU\x02\x00\x00\x00\x08\x00'
expect_bad version0 "corrupt image: version 0"

mkdir -p "$T/symlink"
ln -s "$T/img/cuda-plugin.img" "$T/symlink/cuda-plugin.img"
expect_bad symlink "is a symbolic link: refusing to follow it"

expect_bad nonexistent "cannot open image directory .*/nonexistent: No such file or directory"
log "truncated, padded, corrupt, foreign, empty, newer, version 0, symlink, missing: each a clear error: ok"

# 3. cuda-plugin-devices.img (processes forked after CUDA started; a real one in e2e.fork_workers):
# its untrusted paths are escaped, in the old form (paths only) and per process.
mkdir -p "$T/devs-old" "$T/devs-new"
# version 1, mapped_paths "/\e[2J" (field 2), a file id 7 "/\e]0;x\a" (field 3)
printf 'CUDADEVS\x16\x00\x00\x00\x08\x01\x12\x05/\x1b[2J\x1a\x0b\x08\x07\x1a\x07/\x1b]0;x\x07' >"$T/devs-old/cuda-plugin-devices.img"
cuda_criu inspect "$T/devs-old" >"$T/devs-old.txt" || fail "inspect of an old-form devices image failed"
grep -q "has no cuda-plugin.img" "$T/devs-old.txt" || fail "devs-old: no-image line: $(cat "$T/devs-old.txt")"
grep -qF '  mapped /\x1b[2J -> zero-filled memory (/dev/zero)' "$T/devs-old.txt" || fail "devs-old: mapping: $(cat -v "$T/devs-old.txt")"
grep -qF '  file id 0x7 /\x1b]0;x\x07 O_RDWR -> /dev/null O_RDWR' "$T/devs-old.txt" || fail "devs-old: file: $(cat -v "$T/devs-old.txt")"
# version 1, process pid 42 (field 4) with a mapping 0x10000-0x11000 "rw-s" offset 0 path "/\e[2J"
printf 'CUDADEVS\x1f\x00\x00\x00\x08\x01\x22\x1b\x08\x2a\x1a\x17\x08\x80\x80\x04\x10\x80\xa0\x04\x1a\x04rw-s\x20\x00\x2a\x05/\x1b[2J' \
	>"$T/devs-new/cuda-plugin-devices.img"
cuda_criu inspect "$T/devs-new" >"$T/devs-new.txt" || fail "inspect of a devices image failed"
grep -qx 'pid 42 (ns pid 0): 1 mapping(s), 0 open file(s)' "$T/devs-new.txt" || fail "devs-new: process: $(cat -v "$T/devs-new.txt")"
grep -qxF '  map 10000-11000 rw-s offset 0 /\x1b[2J -> zero-filled shared memory (/dev/zero)' "$T/devs-new.txt" ||
	fail "devs-new: mapping: $(cat -v "$T/devs-new.txt")"
! grep -q $'\x1b' "$T/devs-old.txt" "$T/devs-new.txt" || fail "an escape character reached the terminal"
cuda_criu inspect --json "$T/devs-new" | py "
p = d['inherited_devices']['processes']
assert d['cuda_image'] is False and len(p) == 1 and p[0]['pid'] == 42, d
assert p[0]['mappings'] == [{'start': '0x10000', 'end': '0x11000', 'perms': 'rw-s', 'offset': 0, 'path': '/\x1b[2J',
                             'restored_as': 'zero-filled shared memory (/dev/zero)'}], p" || fail "devs-new: JSON"
cuda_criu inspect --json "$T/img" | py "assert 'inherited_devices' not in d, d" || fail "inherited_devices in an image without the file"
printf 'CUDADEVS\x09\x00\x00\x00\x08\x01' >"$T/devs-bad.img"; mkdir -p "$T/devs-bad"; mv "$T/devs-bad.img" "$T/devs-bad/cuda-plugin-devices.img"
rc=0; cuda_criu inspect "$T/devs-bad" >/dev/null 2>"$T/devs-bad.err" || rc=$?
[ $rc -eq 1 ] && grep -q "cuda-plugin-devices.img: truncated or padded devices image" "$T/devs-bad.err" ||
	fail "devs-bad: exit $rc, $(cat "$T/devs-bad.err")"
log "cuda-plugin-devices.img: per process and old form, escaped; a truncated one is a clear error: ok"

rc=0; cuda_criu inspect 2>/dev/null || rc=$?
[ $rc -eq 2 ] || fail "inspect without a directory exited $rc"
rc=0; cuda_criu inspect "$T/img" "$T/none" 2>/dev/null || rc=$?
[ $rc -eq 2 ] || fail "inspect with two directories exited $rc"
log PASS
