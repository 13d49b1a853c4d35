#!/usr/bin/env bash
# cuda-criu inspect: a real image (text and JSON), a directory without our file, and image files that
# are truncated, corrupt, of another kind, from a newer plugin, or a symbolic link.
source "$(dirname "$0")/lib.sh"
e2e_strict_setup
start_fake_gpu


# 1. A real image: one 48 MiB process.
start_memcheck one 48
pid=$LAST_PID
dump "$pid" "$T/img" || fail "dump failed"
wait_gone "$pid"
cuda_criu inspect "$T/img" >"$T/text" || fail "inspect failed"
grep -qE '^image format 1, plugin [^ ]+, NVIDIA driver .*, host ' "$T/text" || fail "inspect: header: $(cat "$T/text")"
grep -qE '^1 CUDA process\(es\), 4[89]\.[0-9] MiB of GPU state in all$' "$T/text" || fail "inspect: totals"
grep -qE '^GPU 0: GPU-[0-9a-f-]{36} NVIDIA Fake H200, 16\.0 GiB' "$T/text" || fail "inspect: GPU line"
grep -qE "^$pid +[0-9]+ +running +4[89]\.[0-9] MiB +[0-9.]+ ms +[0-9.]+ s  GPU-" "$T/text" ||
	fail "inspect: process line: $(cat "$T/text")"
cuda_criu inspect --json "$T/img" >"$T/json" || fail "inspect --json failed"
py "assert d['cuda_image'] is True and d['version'] == 1, d
p = d['processes']
assert len(p) == 1 and p[0]['pid'] == $pid and p[0]['initial_state'] == 'running', p
assert 48 << 20 <= p[0]['state_bytes'] < 50 << 20, p
assert p[0]['gpu_uuids'] == [d['gpus'][0]['uuid']], p
assert d['created_unix'] > 1600000000 and d['device_phase_us'] > 0, d" <"$T/json" || fail "inspect --json: $(cat "$T/json")"
# The image restores after being read (inspect changes nothing).
restore "$T/img" || fail "restore after inspect failed"
expect_healthy "$STATE"
kill -9 "$pid"; wait_gone "$pid"
log "real image: text and JSON describe the process, and it restores: ok"

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

# version 2, plugin_version "9.9" (protobuf fields 1 and 3)
bad newer 'CUDACRIU\x07\x00\x00\x00\x08\x02\x1a\x039.9'
expect_bad newer "image format version 2 was written by a newer cuda_plugin \(9\.9\); this plugin reads versions up to 1"

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
