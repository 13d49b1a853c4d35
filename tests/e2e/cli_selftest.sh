#!/usr/bin/env bash
# cuda-criu selftest against the fake GPU: the round trip passes (driver found through the loader's
# path, or named with --libcuda), and fails clearly (step, reason, log kept, workload gone) when the
# checkpoint fails or the plugin directory holds CRIU's own plugin.
source "$(dirname "$0")/lib.sh"
e2e_strict_setup
start_fake_gpu

SELFTEST=("$CUDA_CRIU" selftest --criu "$CRIU" --libdir "$PLUGIN_DIR" --mb 32 --dir "$T")
workloads() { pgrep -f -- "__selftest-workload .*$T/" || true; }
# expect_steps FILE STEP...: each step has an "ok" line with a time.
expect_steps() {
	local f=$1 s
	shift
	for s in "$@"; do
		grep -qE "^ok +$s +[0-9]+\.[0-9]{2} s  " "$f" || fail "step $s not ok: $(cat "$f")"
	done
}

# 1. Through the loader's path, as a user with the driver installed runs it.
rc=0
LD_LIBRARY_PATH=$(dirname "$FAKE_LIB") "${SELFTEST[@]}" >"$T/pass.txt" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "selftest exited $rc: $(cat "$T/pass.txt")"
expect_steps "$T/pass.txt" setup start dump exit restore verify
grep -qE '^ok +dump .* GPU state 32\.0 MiB checkpointed' "$T/pass.txt" || fail "dump line: $(grep dump "$T/pass.txt")"
grep -qE '^ok +verify .* all 32 MiB read back intact [0-9]+ times since the restore' "$T/pass.txt" || fail "verify line"
grep -qE '^PASS  selftest: 32 MiB' "$T/pass.txt" || fail "no PASS line"
[ -z "$(ls -d "$T"/cuda-criu-selftest.* 2>/dev/null)" ] || fail "work directory left behind after a pass"
[ -z "$(workloads)" ] || fail "workload left running: $(workloads)"
log "selftest through LD_LIBRARY_PATH: every step ok, cleaned up: ok"

# 1b. From a bundle's layout without --criu or --libdir, no criu in PATH: the criu and plugin beside it.
bundle_layout "$T/bundle"
rc=0
PATH=/usr/bin:/bin LD_LIBRARY_PATH=$(dirname "$FAKE_LIB") "$T/bundle/bin/cuda-criu" selftest --mb 32 --dir "$T" \
	>"$T/bundle.txt" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "selftest from a bundle's layout exited $rc: $(cat "$T/bundle.txt")"
grep -qE "^ok +setup .* CRIU 4\.2\.1 \($T/bundle/sbin/criu\), plugin $T/bundle/plugin/cuda_plugin.so," "$T/bundle.txt" ||
	fail "bundle: setup line: $(grep setup "$T/bundle.txt")"
expect_steps "$T/bundle.txt" setup start dump exit restore verify
[ -z "$(workloads)" ] || fail "workload left running: $(workloads)"
log "selftest from a bundle's layout: its criu and plugin found beside cuda-criu: ok"

# 2. The library named with --libcuda (no loader path, no CUDA_CRIU_LIBCUDA): used by all three parts.
rc=0
env -u CUDA_CRIU_LIBCUDA -u LD_LIBRARY_PATH "${SELFTEST[@]}" --libcuda "$FAKE_LIB" --keep >"$T/libcuda.txt" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "selftest --libcuda exited $rc: $(cat "$T/libcuda.txt")"
expect_steps "$T/libcuda.txt" setup start dump exit restore verify
work=$(sed -n 's/^work directory kept: //p' "$T/libcuda.txt")
[ -f "$work/images/cuda-plugin.img" ] && [ -f "$work/images/dump.log" ] || fail "--keep: no images in '$work'"
cuda_criu inspect "$work/images" | grep -qE ' running +32\.0 MiB ' || fail "--keep: the kept image does not inspect"
rm -rf "$work"
[ -z "$(workloads)" ] || fail "workload left running: $(workloads)"
log "selftest --libcuda --keep: ok"

# 3. The checkpoint fails: exit 1, the dump step named with the plugin's error, the log kept.
rc=0
FAKEGPU_FAIL=checkpoint LD_LIBRARY_PATH=$(dirname "$FAKE_LIB") "${SELFTEST[@]}" >"$T/fail.txt" 2>&1 || rc=$?
[ $rc -eq 1 ] || fail "selftest with a failing checkpoint exited $rc"
expect_steps "$T/fail.txt" setup start
grep -qE '^FAIL  dump +criu dump exited with status 1' "$T/fail.txt" || fail "no FAIL dump line: $(cat "$T/fail.txt")"
grep -qE 'Error \(cuda_plugin\): .*cuCheckpointProcessCheckpoint failed' "$T/fail.txt" || fail "the plugin's error not shown"
grep -qE '^FAIL  selftest' "$T/fail.txt" || fail "no final FAIL line"
work=$(sed -n 's/^work directory kept: //p' "$T/fail.txt")
[ -f "$work/images/dump.log" ] || fail "failed run: log not kept"
[ -z "$(workloads)" ] || fail "workload left running after a failure: $(workloads)"
log "failing checkpoint: FAIL at dump with the plugin's error, log kept, workload gone: ok"

# 4. Setup failures: CRIU's own plugin in --libdir; the workload cannot find the driver.
CRIU_ROOT=$(cd "$(dirname "$CRIU")/.." && pwd)
rc=0
"$CUDA_CRIU" selftest --criu "$CRIU" --libdir "$CRIU_ROOT/lib/criu-intree" >"$T/intree.txt" 2>&1 || rc=$?
[ $rc -eq 1 ] && grep -qE "^FAIL  setup +.*is CRIU's own CUDA plugin" "$T/intree.txt" || fail "in-tree libdir: $(cat "$T/intree.txt")"
rc=0
env -u LD_LIBRARY_PATH "${SELFTEST[@]}" >"$T/nolib.txt" 2>&1 || rc=$?
[ $rc -eq 1 ] && grep -qE "^FAIL  start +the workload failed: FAIL cannot load libcuda.so.1" "$T/nolib.txt" &&
	grep -q "hint: .*--libcuda PATH" "$T/nolib.txt" || fail "workload without a driver: $(cat "$T/nolib.txt")"
rm -rf "$T"/cuda-criu-selftest.*
rc=0
"$CUDA_CRIU" selftest --mb 0 2>/dev/null || rc=$?
[ $rc -eq 2 ] || fail "selftest --mb 0 exited $rc"
log "setup failures and bad usage: ok"
log PASS
