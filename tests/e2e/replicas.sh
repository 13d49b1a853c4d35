# One image, several replicas: a CUDA process dumped in pid, mount and network namespaces of its own (their
# init, as in a container; ns_exec, tests/lib/common.sh) is restored three times at once from the same image
# directory by plain CRIU, each restore in new namespaces (ns_criu_opts), as container runtimes start
# replicas of one checkpoint. Every replica must come back as its
# own CUDA process (the fake driver tells them apart: tests/fakegpu/fakegpu.h, "Replicas"), running, its
# device data verified, each restore's summary clean; then each is killed. Then replicas that no longer fit:
# the GPU (the fake NVML's: its memory less what the daemon's processes use) has room for two replicas'
# state, three restores start at once, slowed so that they overlap: each counts what the others reserved
# (os/gpu_ledger.h), so one does not fit beside them; it waits for their restores to end (while they run,
# the free memory is no measure) and is then refused by name, before any driver call, having said whom it
# waited for; the other two run on.
source "$(dirname "$0")/lib.sh"
e2e_setup
start_fake_gpu

N=3
# start_workload DIR [cuda_memcheck options...]: the workload as pid 1 of namespaces of its own, its state
# file $STATE; sets pid, dump_opts and restore_opts (ns_criu_opts into DIR).
start_workload() {
	local dir=$1
	shift
	LD_LIBRARY_PATH=$(dirname "$FAKE_LIB") ns_exec "$MEMCHECK" --mb 16 --zero-mb 32 "$@" --state "$STATE" \
		--interval-ms 20 </dev/null >/dev/null 2>&1 &
	PIDS+=($!)
	disown
	wait_for "the workload to fill its device memory" 20 test -f "$STATE"
	pid=$(pgrep -f -- "--state $STATE" | while read -r p; do grep -q "^NSpid:.*[[:space:]]1$" /proc/$p/status && echo $p; done)
	[ -n "$pid" ] || fail "no workload that is pid 1 of its namespace"
	mkdir -p "$dir"
	ns_criu_opts "$pid" "$dir"
	mapfile -t dump_opts <"$dir/dump.opts"
	mapfile -t restore_opts <"$dir/restore.opts"
}
STATE=$T/replica.state
start_workload "$T"
dump "$pid" "$T/img" "${dump_opts[@]}" || fail "dump failed"
wait_gone "$pid"

t0=$SECONDS
restores=()
for i in $(seq $N); do
	"$CRIU" restore -D "$T/img" -d -L "$PLUGIN_DIR" -v4 -o "$T/restore-$i.log" "${restore_opts[@]}" \
		</dev/null >/dev/null 2>&1 &
	restores+=($!)
done
for i in $(seq $N); do
	wait "${restores[$((i - 1))]}" || fail "replica $i: criu restore failed: $(grep -m2 -E "Error \(cuda_plugin\)|Restoring FAILED" "$T/restore-$i.log")"
	expect_summary "$T/restore-$i.log" restore 1 "replica $i: no clean restore summary"
done
mapfile -t replicas < <(pgrep -f -- "--state $STATE")
PIDS+=("${replicas[@]}")
[ ${#replicas[@]} -eq $N ] || fail "${#replicas[@]} replicas run, expected $N: ${replicas[*]}"
namespaces=$(for p in "${replicas[@]}"; do readlink "/proc/$p/ns/pid" "/proc/$p/ns/mnt" "/proc/$p/ns/net"; done | sort -u | wc -l)
[ "$namespaces" -eq $((3 * N)) ] || fail "the replicas share namespaces ($namespaces pid, mount and network namespaces for $N)"
for p in "${replicas[@]}"; do
	grep -q "^NSpid:.*[[:space:]]1$" "/proc/$p/status" || fail "replica $p is not pid 1 of its namespace"
	[ "$(cuda_state "$p")" = running ] || fail "replica $p: CUDA state $(cuda_state "$p")"
done
# The replicas share the state file (it is the one the image names): each verifies its device data at
# every iteration and exits with status=FAIL on a mismatch, so all alive and the file ok is all of them ok.
expect_healthy "$STATE"
alive "${replicas[@]}" || fail "a replica died: $(cat "$STATE")"
log "$N replicas restored at once from one image in $((SECONDS - t0)) s, each in its own pid, mount and network namespaces, running, data verified"
kill -9 "${replicas[@]}"
wait_gone "${replicas[@]}"

# restore_replica I [env...]: a replica restored in the background, its log restore-fit-I.log; sets $!.
restore_replica() {
	local i=$1
	shift
	env "$@" "$CRIU" restore -D "${IMG:-$T/img}" -d -L "$PLUGIN_DIR" -v4 -o "$T/restore-fit-$i.log" "${restore_opts[@]}" \
		</dev/null >/dev/null 2>&1 &
}
state_mib=$(grep -oE "dump: 1 CUDA process\(es\), [0-9.]+ MiB of GPU state" "$T/dump.log" | grep -oE "[0-9.]+ MiB" | cut -d' ' -f1)
[ -n "$state_mib" ] || fail "no GPU state size in the dump's summary"
room=(LD_LIBRARY_PATH="$FAKE_NVML_DIR" FAKENVML_TOTAL=$(awk -v m="$state_mib" 'BEGIN { printf "%d", m * 2.5 * 1048576 }')
	FAKEGPU_COPY_MBPS=16)
restores=()
for i in 1 2 3; do
	restore_replica "$i" "${room[@]}"
	restores+=($!)
done
ok=0 refused=0
for i in 1 2 3; do
	if wait "${restores[$((i - 1))]}"; then
		ok=$((ok + 1))
	elif grep -qE "has [0-9.]+ MiB free now .*; it waited [0-9.]+ s for the restores in progress to end" "$T/restore-fit-$i.log" &&
		grep -qE "waiting for them to end before deciding .*which have reserved [0-9.]+ MiB of GPU-[0-9a-f-]+ by CRIU pid\(s\) [0-9]+" \
			"$T/restore-fit-$i.log"; then
		refused=$((refused + 1))
		why=$(grep -oE "Error \(cuda_plugin\): .*" "$T/restore-fit-$i.log" | head -n1 | cut -c1-220)
	else
		fail "replica $i failed otherwise: $(grep -m2 -E "Error \(cuda_plugin\)|Restoring FAILED" "$T/restore-fit-$i.log")"
	fi
done
[ "$ok" = 2 ] && [ "$refused" = 1 ] || fail "of 3 replicas with room for 2, $ok restored and $refused refused"
mapfile -t replicas < <(pgrep -f -- "--state $STATE")
PIDS+=("${replicas[@]}")
[ ${#replicas[@]} -eq 2 ] || fail "${#replicas[@]} replicas run, expected the 2 that fit: ${replicas[*]}"
expect_healthy "$STATE"
log "replicas that no longer fit: 2 of 3 restored at once, the third waited for them and was refused before any driver call: $why"
kill -9 "${replicas[@]}"
wait_gone "${replicas[@]}"

# A replica that comes while two others are in their driver restores, on a GPU with room for all three
# (3.2 replicas' state), whose driver does not tell what the processes it restores hold so far (as on the
# H200, where the fourth of 4 replicas that fit saw 0.6 GiB of room beside three restores in progress):
# what they have allocated shows in the free memory and their reservations count whole, so it does not
# fit now. It waits for them to end and is then restored, not refused. The fake driver's restores copy at
# the rate of their process's own environment (FAKEGPU_COPY_MBPS, the workload's, restored with it): at 4 MB/s
# each allocates its 32 MiB of zeros after ~8.4 s and its 16 MiB of data after ~12.6 s; the third comes at
# ~10.5 s, with 2 s to spare on either side.
STATE=$T/late.state first_restore_opts=("${restore_opts[@]}")
FAKEGPU_COPY_MBPS=4 start_workload "$T/late"
dump "$pid" "$T/img-late" "${dump_opts[@]}" || fail "dump of the slowly restored workload failed"
wait_gone "$pid"
late=(LD_LIBRARY_PATH="$FAKE_NVML_DIR" FAKENVML_PROCESSES=none
	FAKENVML_TOTAL=$(awk -v m="$state_mib" 'BEGIN { printf "%d", m * 3.2 * 1048576 }'))
IMG=$T/img-late
restores=()
for i in 1 2; do
	restore_replica "late-$i" "${late[@]}"
	restores+=($!)
done
both_restoring() { grep -q "restoring 1 CUDA process" "$T/restore-fit-late-1.log" && grep -q "restoring 1 CUDA process" "$T/restore-fit-late-2.log"; }
wait_for "both replicas in their driver restores" 30 both_restoring
sleep 10.4
restore_replica late-3 "${late[@]}"
restores+=($!)
for i in 1 2 3; do
	wait "${restores[$((i - 1))]}" || fail "late replica $i was refused: $(grep -m1 -E "Error \(cuda_plugin\)" "$T/restore-fit-late-$i.log")"
done
expect_log "$T/restore-fit-late-3.log" "not enough free GPU memory now, beside restores in progress on this machine .*waiting for them to end before deciding" \
	"the late replica did not wait for the restores in progress"
mapfile -t replicas < <(pgrep -f -- "--state $STATE")
PIDS+=("${replicas[@]}")
[ ${#replicas[@]} -eq 3 ] || fail "${#replicas[@]} late replicas run, expected 3: ${replicas[*]}"
expect_healthy "$STATE"
log "a replica that came while two others restored, on a GPU with room for three: it waited for them, then was restored ($(grep -oE "has [0-9.]+ MiB free now[^;]*; the processes restored onto it need [0-9.]+ MiB" "$T/restore-fit-late-3.log" | head -n1), then fitted)"
kill -9 "${replicas[@]}"
wait_gone "${replicas[@]}"
STATE=$T/replica.state IMG=$T/img restore_opts=("${first_restore_opts[@]}")

# Staggered replicas on a GPU whose free memory is what the running ones leave (the fake NVML's total less
# the device memory of the daemon's processes), with room for two: each restore starts once the one before
# it runs. The second fits beside the first (whose reservation ended with its restore: its memory is
# counted once, as used), the third does not and is refused by name, counting no reservation; the two run on.
staggered=(LD_LIBRARY_PATH="$FAKE_NVML_DIR" FAKENVML_TOTAL=$(awk -v m="$state_mib" 'BEGIN { printf "%d", m * 2.5 * 1048576 }'))
for i in 1 2; do
	restore_replica "staggered-$i" "${staggered[@]}"
	wait $! || fail "staggered replica $i was refused: $(grep -m1 -E "Error \(cuda_plugin\)" "$T/restore-fit-staggered-$i.log")"
	expect_summary "$T/restore-fit-staggered-$i.log" restore 1 "staggered replica $i: no clean restore summary"
done
restore_replica staggered-3 "${staggered[@]}"
! wait $! || fail "a third staggered replica was restored where two fit"
log3=$T/restore-fit-staggered-3.log
expect_log "$log3" "Error \(cuda_plugin\): .*has [0-9.]+ MiB free now \(of [0-9.]+ [KMGT]iB\); the processes restored onto it need [0-9.]+ MiB" \
	"the third staggered replica not refused by name"
! grep -q "restores in progress" "$log3" || fail "the third staggered replica counted reservations of restores that were done: $(grep -m1 "restores in progress" "$log3")"
mapfile -t replicas < <(pgrep -f -- "--state $STATE")
PIDS+=("${replicas[@]}")
[ ${#replicas[@]} -eq 2 ] || fail "${#replicas[@]} staggered replicas run, expected 2: ${replicas[*]}"
expect_healthy "$STATE"
log "staggered replicas: two restored one after the other, none refused; a third refused by name: $(grep -oE "has [0-9.]+ MiB free now[^;]*; the processes restored onto it need [0-9.]+ MiB" "$log3" | head -n1)"
kill -9 "${replicas[@]}"
wait_gone "${replicas[@]}"

# Replicas of a compressed image (compress=zstd) restored at once: each process's GPU state is decoded
# once, by the first restore to get to it, into memory that the others map too (os/decoded_share.h); the
# fake driver's restore is slowed so that the first still runs when the others start. Every replica runs,
# its data verified, and the one decoded copy is given back once the last of them is done.
STATE=$T/replica-z.state
start_workload "$T/z" --pattern weights
CUDA_CRIU_COMPRESS=zstd dump "$pid" "$T/imgz" "${dump_opts[@]}" || fail "compressed dump failed"
wait_gone "$pid"
restores=()
for i in $(seq $N); do
	FAKEGPU_COPY_MBPS=16 "$CRIU" restore -D "$T/imgz" -d -L "$PLUGIN_DIR" -v4 -o "$T/restore-z-$i.log" \
		"${restore_opts[@]}" </dev/null >/dev/null 2>&1 &
	restores+=($!)
done
decoded=0 joined=0
for i in $(seq $N); do
	log_i=$T/restore-z-$i.log
	wait "${restores[$((i - 1))]}" || fail "compressed replica $i: criu restore failed: $(grep -m2 -E "Error \(cuda_plugin\)|Restoring FAILED" "$log_i")"
	expect_summary "$log_i" restore 1 "compressed replica $i: no clean restore summary"
	expect_log "$log_i" "decoded into while CRIU restores" "compressed replica $i: its GPU state not mapped from decoded memory"
	if grep -qE "its compressed GPU state is being decoded by another restore of the same image \(CRIU pid [0-9]+\)" "$log_i"; then
		expect_log "$log_i" "its GPU state was decoded by the restore CRIU pid [0-9]+ runs" \
			"compressed replica $i joined another restore's decode but did not see it done"
		joined=$((joined + 1))
	else
		decoded=$((decoded + 1))
	fi
done
[ "$joined" -ge 1 ] || fail "each of $N compressed replicas restored at once decoded its own copy ($decoded)"
mapfile -t replicas < <(pgrep -f -- "--state $STATE")
PIDS+=("${replicas[@]}")
[ ${#replicas[@]} -eq $N ] || fail "${#replicas[@]} compressed replicas run, expected $N"
expect_healthy "$STATE"
alive "${replicas[@]}" || fail "a compressed replica died: $(cat "$STATE")"
! grep -q "cuda-criu-gpu-" /proc/"${replicas[0]}"/maps || fail "a replica still maps the decoded memory"
log "$N replicas of a compressed image restored at once: $decoded decoded it, $joined mapped that copy and waited for it"
kill -9 "${replicas[@]}"
wait_gone "${replicas[@]}"
log PASS
