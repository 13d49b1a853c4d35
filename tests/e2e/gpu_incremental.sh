#!/usr/bin/env bash
# An incremental GPU image (docs/gpu-image.md): a dump given an earlier dump as its parent
# (`criu dump --track-mem --prev-images-dir`, as periodic checkpoints and iterative migration run it)
# references the GPU chunks that are unchanged since then instead of writing them; the restore reads them
# from the parent's files, and a parent that is gone is refused by name. CRIU takes --prev-images-dir only
# with the kernel's dirty tracking (soft-dirty bits): without it the test is skipped, visibly. The plugin's
# side is also covered by the unit tests (tests/unit/gpu_incremental_test.cpp).
source "$(dirname "$0")/lib.sh"
e2e_setup
"$CRIU" check --feature mem_dirty_track >/dev/null 2>&1 ||
	skip "this kernel has no dirty tracking (CRIU: \"Dirty tracking is OFF\"): CRIU refuses --prev-images-dir"
start_fake_gpu

# 64 MiB of data (a chunk rewritten per iteration; slowly: most chunks stay as they are) and 32 MiB of zeros.
start_memcheck inc 64 --zero-mb 32 --interval-ms 1000
pid=$LAST_PID
dump "$pid" "$T/d1" -R --track-mem || fail "first dump (leave running) failed"
cp "$T/dump.log" "$T/dump1.log"
expect_log "$T/dump1.log" "GPU image: .* written" "no GPU image in the first dump"
alive "$pid" || fail "the workload died after the dump with --leave-running"
dump "$pid" "$T/d2" --track-mem --prev-images-dir ../d1 || fail "second dump (against the first) failed"
wait_gone "$pid"
line=$(grep -oE "GPU image: .*unchanged since the parent image.*" "$T/dump.log" || true)
[ -n "$line" ] || fail "the second dump references nothing in the first: $(grep -o 'GPU image: .*' "$T/dump.log")"
log "second dump: ${line#GPU image: }"
# Most of the 64 MiB is referenced: at most a few chunks were rewritten between the dumps.
ref=$(sed -n 's/.*; \([0-9.]*\) MiB unchanged since the parent image.*/\1/p' "$T/dump.log")
awk -v r="${ref:-0}" 'BEGIN { exit !(r >= 48) }' || fail "only ${ref:-0} MiB referenced in the parent image"
written=$(du -cb "$T"/d2/cuda-gpu-[0-9]*.img | tail -n1 | cut -f1)
first=$(du -cb "$T"/d1/cuda-gpu-[0-9]*.img | tail -n1 | cut -f1)
[ "$written" -lt $((first / 2)) ] || fail "the second dump's GPU files take $written bytes, the first's $first"
cuda_criu inspect "$T/d2" >"$T/inspect.out" 2>&1 || fail "inspect failed: $(cat "$T/inspect.out")"
cuda_criu inspect --verify "$T/d2" >"$T/verify.out" 2>&1 || fail "inspect --verify failed: $(cat "$T/verify.out")"
cp -a "$T/d2" "$T/d2-pristine"

restore "$T/d2" || fail "restore of the second dump failed"
expect_log "$T/restore.log" "from the parent image are written by the plugin|GPU image is written into the processes" \
	"the restore does not say how the parent's chunks come back"
expect_summary "$T/restore.log" restore 1 "no restore summary" "GPU image checked in"
healthy_then_gone
log "restored from the second dump with the first's chunks: data verified"

# The parent's data file gone: refused by name before CRIU restores anything.
f=$(ls "$T"/d1/cuda-gpu-[0-9]*.img | head -n1)
mv "$f" "$f.away"
if "$CRIU" restore -D "$T/d2-pristine" -d -L "$PLUGIN_DIR" -v4 -o restore.log </dev/null >/dev/null 2>&1; then
	fail "restored with the parent's file missing"
fi
expect_log "$T/d2-pristine/restore.log" "parent/$(basename "$f") \(a file of the parent image" \
	"the refusal does not name the parent's file"
wait_for "no restored process" 20 gone "$pid"
log "parent's file missing: refused: $(grep -m1 -o 'open parent/.*' "$T/d2-pristine/restore.log" | cut -c1-120)"
log PASS
