#!/usr/bin/env bash
# The driver's restore reads compressed GPU state while it is still being decoded (criu-patches/0010,
# plugin/core/lazy_decoded.h): CRIU registers the memory it maps from the plugin's decoded file with a
# userfaultfd, the plugin takes it at RESUME_DEVICES_LATE, and the fake driver's restore (which reads its
# host copy in ascending order, as NVIDIA's does) starts at once; each first touch of a chunk not yet
# decoded waits for it, and that chunk is decoded next. The workload's device memory is verified after the
# restore, every registration is gone, and the process runs on. Then once more with a driver that reads its
# host copy from the end first (FAKEGPU_RESTORE_BACKWARDS): its first touches find chunks not yet decoded,
# wait for them, and the decode takes them first.
source "$(dirname "$0")/lib.sh"
e2e_setup
start_fake_gpu

# roundtrip NAME: a memcheck process dumped compressed and restored
# while its GPU state is decoded; its data verified, no registration left. The account of faults in $FAULTS.
roundtrip() {
	local name=$1
	# Large enough that the decode (one reader on a 2-core machine) is still going when CRIU is done.
	start_memcheck "$name" 768 --pattern weights
	local pid=$LAST_PID
	CUDA_CRIU_COMPRESS=zstd dump "$pid" "$T/$name.img" || fail "$name: dump with compress=zstd failed"
	wait_gone "$pid"
	restore "$T/$name.img" || fail "$name: restore of the compressed image failed"
	expect_summary "$T/restore.log" restore 1 "$name: no clean restore summary"
	alive "$pid" && is_running "$pid" || fail "$name: pid $pid not running after the restore"
	expect_healthy "$STATE"
	expect_log "$T/restore.log" "Mapped [0-9]+ runs of pages from [0-9]+ plugin file\(s\), [1-9][0-9]* of them on demand" \
		"$name: CRIU registered no run with a userfaultfd"
	expect_log "$T/restore.log" "the driver's restore starts before its GPU state is decoded \([0-9]+ of [0-9]+ chunk" \
		"$name: the driver's restore waited for the whole decode"
	FAULTS=$(grep -oE "came in on demand: [0-9]+ fault\(s\) served, [0-9]+ waited" "$T/restore.log" | head -n1)
	[ -n "$FAULTS" ] || fail "$name: no account of the faults served"
	# No registration is left: a later first touch of that memory must never wait for a plugin that is gone.
	! grep -qE "^VmFlags:.* (um|ui)( |$)" "/proc/$pid/smaps" || fail "$name: pid $pid still has memory registered with a userfaultfd"
	log "$name: restored while decoding, $FAULTS for their chunk; data verified"
	kill -9 "$pid"
	wait_gone "$pid"
}

roundtrip lazy
export FAKEGPU_RESTORE_BACKWARDS=1 # read by the fake driver inside the restored process, from its own environment
roundtrip backwards
waited=$(awk '{print $(NF-1)}' <<<"$FAULTS")
[ "$waited" -ge 1 ] || fail "backwards: no first touch waited for its chunk ($FAULTS): the fault path went unused"
