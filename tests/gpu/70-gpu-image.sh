# Real-GPU test of the GPU image the plugin writes itself (sourced by run-gpu-tests.sh: test_gpu_image is
# the test gpu-image).

# The GPU image the plugin writes itself (docs/gpu-image.md), on a real GPU: 1 GiB of data and 2 GiB of
# zeroed device memory. The dump leaves the zeros out; a flipped byte in a data file is refused before the
# driver's restore with nothing left running; the intact copy restores, once written back by the plugin
# (CUDA_CRIU_MAP_IMAGE=off) and once mapped from the plugin's files.
test_gpu_image() {
	local name=gpu-image dir=$work/gpu-image pid pids line f base
	start_in "$dir" "$bundle/bin/cuda_memcheck" --mb 1024 --zero-mb 2048 --state "$dir/state" --interval-ms 100
	wait_state "$dir/state" 120 1 || { failed $name "before the dump: $why"; show_workload "$dir"; return; }
	pid=$(state_value "$dir/state" pid)
	mapfile -t pids < <(tree_pids "$pid")
	started+=("${pids[@]}")
	criu_dump "$dir" "$pid" || { failed $name "$why"; show_log "$dir/dump.log"; kill_pids "${pids[@]}"; return; }
	gone_within 30 "${pids[@]}" || { failed $name "pid $pid still exists after the dump"; return; }
	line=$(grep -o 'cuda_plugin: GPU image: .*' "$dir/dump.log" | tail -n1)
	[ -n "$line" ] || { failed $name "no GPU image line in dump.log"; show_log "$dir/dump.log"; return; }
	cp -a "$dir/img" "$dir/pristine"
	f=$(ls -S "$dir/img"/cuda-gpu-[0-9]*.img | head -n1)
	printf '\125' | dd of="$f" bs=1 seek=$((4096 + 777777)) conv=notrunc status=none
	if criu_restore "$dir"; then
		failed $name "a flipped byte in $(basename "$f") restored"; kill_tree "$pid"; return
	fi
	grep -q "fails its checksum" "$dir/restore.log" || { failed $name "the damaged restore does not name the checksum"; show_log "$dir/restore.log"; return; }
	gone_within 30 "$pid" || { failed $name "pid $pid runs after a refused restore"; kill_tree "$pid"; return; }
	local written mapped
	for mode in off auto; do
		rm -rf "$dir/img"; cp -a "$dir/pristine" "$dir/img"
		base=$(state_value "$dir/state" iterations)
		RESTORE_ENV=CUDA_CRIU_MAP_IMAGE=$mode criu_restore "$dir" || { failed $name "map-image=$mode: $why"; show_log "$dir/restore.log"; return; }
		advance 60 "$dir/state" "$base" || { failed $name "map-image=$mode: after restore: $why"; show_workload "$dir"; kill_tree "$pid"; return; }
		[ $mode = off ] && written=$restore_s || mapped=$restore_s
		kill_tree "$pid"; gone_within 30 "$pid"
	done
	passed $name "flipped byte refused; restore ${written} s written back, ${mapped} s mapped"
	echo "  ${line#cuda_plugin: }"
	f=$(plugin_line "$dir/restore.log" restore); echo "  ${f:-no restore line}"
	rm -rf "$dir/pristine"
}

# The GPU image compressed (compress=zstd; docs/gpu-image.md, "Compression") on a real GPU: 1 GiB of
# bf16-like weights (cuda_memcheck --pattern weights) and 1 GiB of zeros, dumped with CUDA_CRIU_COMPRESS=zstd:
# the dump's summary gives the ratio, cuda-criu inspect --verify decodes and checks every chunk, and the
# restore writes the chunks back; the workload verifies its data after it.
test_gpu_compress() {
	local name=gpu-compress dir=$work/gpu-compress pid pids line base
	start_in "$dir" "$bundle/bin/cuda_memcheck" --mb 1024 --zero-mb 1024 --pattern weights --state "$dir/state" \
		--interval-ms 100
	wait_state "$dir/state" 120 1 || { failed $name "before the dump: $why"; show_workload "$dir"; return; }
	pid=$(state_value "$dir/state" pid)
	mapfile -t pids < <(tree_pids "$pid")
	started+=("${pids[@]}")
	CUDA_CRIU_COMPRESS=zstd criu_dump "$dir" "$pid" || { failed $name "$why"; show_log "$dir/dump.log"; kill_pids "${pids[@]}"; return; }
	gone_within 30 "${pids[@]}" || { failed $name "pid $pid still exists after the dump"; return; }
	line=$(grep -oE 'compressed \(zstd-1\): [^;]*' "$dir/dump.log" | tail -n1)
	[ -n "$line" ] || { failed $name "no compression in the dump's summary"; show_log "$dir/dump.log"; return; }
	"$bundle/bin/cuda-criu" inspect --verify "$dir/img" >"$dir/verify.out" 2>&1 ||
		{ failed $name "inspect --verify: $(tail -n3 "$dir/verify.out")"; return; }
	base=$(state_value "$dir/state" iterations)
	criu_restore "$dir" || { failed $name "$why"; show_log "$dir/restore.log"; return; }
	advance 60 "$dir/state" "$base" || { failed $name "after restore: $why"; show_workload "$dir"; kill_tree "$pid"; return; }
	# Decoded into memory CRIU mapped (criu-patches/0008), which the real driver unmaps once restored.
	grep -q "from the memory its compressed chunks are decoded into" "$dir/restore.log" ||
		{ failed $name "the compressed chunks were not decoded into memory CRIU maps"; show_log "$dir/restore.log"; kill_tree "$pid"; return; }
	if grep -q "cuda-criu-gpu-" "/proc/$pid/maps"; then
		failed $name "pid $pid still maps its decoded GPU state after the restore"; kill_tree "$pid"; return
	fi
	kill_tree "$pid"; gone_within 30 "$pid"
	passed $name "$line; dump ${dump_s} s, image $((img_bytes >> 20)) MiB, restore ${restore_s} s (decoded into memory CRIU mapped, given back), data verified"
}
