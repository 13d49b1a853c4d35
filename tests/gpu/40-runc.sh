# Real-GPU tests in runc containers (sourced by run-gpu-tests.sh: each test_NAME function is the test NAME,
# with - for _): a container checkpointed and restored twice; one moved from GPU 0 to GPU 1. The
# container's config.json comes from oci_config (tests/lib/common.sh), as the container tests' does.

# runc_prepare DIR: what a runc test needs in DIR: libseccomp for runc, rootfs/ (the host's top directories
# as mount points or links), state/, runc-root/, a criu wrapper, and RUNC_WORKLOAD for runc_config from
# GPU_TESTS_RUNC_WORKLOAD. Uses name (the test) and runc_bin; returns 1 (the test skipped) when the
# workload cannot run here.
runc_prepare() {
	local dir=$1 root=$1/rootfs d
	case "${GPU_TESTS_RUNC_WORKLOAD:-memcheck}" in
	memcheck) unset RUNC_WORKLOAD RUNC_BINDS ;;
	torch)
		# The host's python with PyTorch; its prefix (a virtual environment outside /usr, say) is bound
		# read-only at the same path, beside the host's /usr that its interpreter comes from.
		local py prefix
		py=$(command -v "$python")
		if ! prefix=$("$py" -c 'import sys, torch; assert torch.cuda.is_available(); print(sys.prefix)' 2>/dev/null); then
			skipped "$name" "GPU_TESTS_RUNC_WORKLOAD=torch: $python has no PyTorch with CUDA"; return 1
		fi
		case "$prefix" in /usr | /usr/*) unset RUNC_BINDS ;; *) export RUNC_BINDS=$prefix; mkdir -p "$root$prefix" ;; esac
		mkdir -p "$dir/state" && cp "$bundle/torch_workload.py" "$bundle/serving_workload.py" "$dir/state/" || return 1
		export RUNC_WORKLOAD="$py -u /state/torch_workload.py --gb 2 --state /state/one --interval-ms 100" ;;
	*) failed "$name" "GPU_TESTS_RUNC_WORKLOAD=${GPU_TESTS_RUNC_WORKLOAD}: want memcheck or torch"; return 1 ;;
	esac
	# runc re-executes itself (runc init) with an empty environment: its libseccomp must be the system's.
	if ! ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2 '; then
		echo "  $name: this machine has no libseccomp.so.2: installing the bundle's copy into /usr/local/lib"
		install -m 644 "$bundle/lib/libseccomp.so.2" /usr/local/lib/ && ldconfig
	fi
	mkdir -p "$dir"/{rootfs,state,runc-root}
	for d in usr etc proc sys dev tmp state opt/bin; do mkdir -p "$root/$d"; done
	for d in bin sbin lib lib64 lib32; do
		if [ -L "/$d" ]; then ln -sfn "$(readlink "/$d")" "$root/$d"; elif [ -d "/$d" ]; then mkdir -p "$root/$d"; fi
	done
	# CRIU through a wrapper: its libraries, and our plugin's directory (runc passes its environment on,
	# CUDA_CRIU_DEVICE_MAP included).
	printf '#!/bin/sh\nexport LD_LIBRARY_PATH=%s CRIU_LIBS_DIR=%s\nexec %s "$@"\n' \
		"$bundle/lib" "$bundle/plugin" "$bundle/sbin/criu" >"$dir/criu"
	chmod +x "$dir/criu"
}

# runc_config BUNDLE_DIR TEST_DIR DEV_DIR DEVICE...: BUNDLE_DIR/config.json for the rootfs and state/ of
# TEST_DIR, running $RUNC_WORKLOAD (default: cuda_memcheck on 1 GiB) with the state file /state/one; the
# host folders in $RUNC_BINDS (colon-separated) are bound read-only at their own paths. The DEVICEs (host paths) are
# the container's devices (cgroup rules, and nodes runc creates in a tmpfs /dev). With DEV_DIR non-empty,
# /dev is instead a bind mount of that host directory (filled by the caller): runc then creates no nodes,
# and CRIU treats /dev as an external mount whose source the restoring config.json names.
runc_config() {
	local bundle=$1 dir=$2 devdir=$3
	shift 3
	local tops=(/usr /etc) binds=(/usr /usr ro /etc /etc ro) extra=() opts=() p m t i cmd dsts=""
	for p in /lib /lib64 /bin /sbin; do
		if [ -d "$p" ] && [ ! -L "$p" ]; then tops+=("$p"); binds+=("$p" "$p" ro); fi
	done
	# Mounts below those (e.g. the driver on its own file system) as mounts of their own: runc tells CRIU
	# about the bind mounts of config.json only, and CRIU cannot dump a file system it does not know.
	while read -r m; do
		for t in "${tops[@]}"; do
			case "$m" in "$t"/*) binds+=("$m" "$m" ro); break ;; esac
		done
	done < <(awk '{ print $5 }' /proc/self/mountinfo | sort -u | awk '{ print length($0), $0 }' | sort -s -n -k1,1 | cut -d' ' -f2-)
	IFS=: read -ra extra <<<"${RUNC_BINDS:-}"
	for p in ${extra[@]+"${extra[@]}"}; do [ -z "$p" ] || binds+=("$p" "$p" ro); done
	binds+=("$(realpath "$RUNC_BINDIR")" /opt/bin ro "$dir/state" /state rw)
	for ((i = 0; i < ${#binds[@]}; i += 3)); do
		opts+=(--bind "${binds[i]}" "${binds[i + 1]}" "${binds[i + 2]}")
		dsts+=" ${binds[i + 1]}"
	done
	for p in "$@"; do opts+=(--device "$p"); done
	if [ -n "${RUNC_NETNS:-}" ]; then
		# A network namespace of its own (a loopback only), as runtimes give a container: CRIU locks it with
		# nftables (that machine has no iptables), set in a CRIU configuration file runc passes for it.
		echo "network-lock nftables" >"$dir/criu.conf"
		opts+=(--netns --annotation "org.criu.config=$dir/criu.conf")
	fi
	cmd="exec ${RUNC_WORKLOAD:-/opt/bin/cuda_memcheck --mb 1024 --state /state/one --interval-ms 100} 2>>/state/one.err"
	if [ -n "$devdir" ]; then
		# runc reopens stdio that is the host's /dev/null inside the container only when it sets up /dev
		# itself: with /dev bind-mounted the process would keep the host's /dev/null, which CRIU cannot find
		# in the container's mounts ("Can't lookup mount=N for fd=0"). Reopen it here, inside.
		cmd="exec </dev/null >/dev/null 2>>/state/one.err; $cmd"
		opts+=(--dev-dir "$devdir")
	fi
	# No network namespace: CRIU would need iptables to lock it, and that machine has none.
	oci_config "$bundle/config.json" --root "$dir/rootfs" --hostname cuda-gpu-ct --cmd "$cmd" \
		--env PATH=/usr/bin:/bin --cap CAP_KILL "${opts[@]}" || return 1
	echo "  runc: devices $*${devdir:+ in /dev from $devdir}; bind mounts${dsts}${RUNC_NETNS:+; its own network namespace}"
}

# The container commands of the runc tests; they use name, dir and runc_bin of the calling test.
rc_() { "$runc_bin" --root "$dir/runc-root" --log "$dir/runc.log" --criu "$dir/criu" "$@"; }

rc_state() { rc_ state "$1" 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['$2'])" 2>/dev/null; }

rc_remove() { rc_ kill "$1" KILL 2>/dev/null; sleep 1; rc_ delete -f "$1" 2>/dev/null; }

rc_remove_all() { local id; for id in $(rc_ list -q 2>/dev/null); do rc_ kill "$id" KILL; rc_ delete -f "$id"; done 2>/dev/null; }

rc_fail() {
	failed "$name" "$1"
	[ -n "${2:-}" ] && show_log "$2"
	tail -n 5 "$dir/runc.log" 2>/dev/null | sed 's/^/  runc.log | /'
	tail -n 5 "$dir/state/one.err" 2>/dev/null | sed 's/^/  one.err | /'
	rc_remove_all
}

# rc_checkpoint ID HOST_PID: runc checkpoint of container ID into $dir/img (CRIU's log in $dir/work-dump), the
# workload gone and the container removed afterwards. Sets dump_s, img_bytes and at_dump; fails the test
# (rc_fail) and returns 1 when a step fails.
rc_checkpoint() {
	local id=$1 host_pid=$2 t0
	t0=$(now)
	rc_ checkpoint --image-path "$dir/img" --work-path "$dir/work-dump" "$id" </dev/null >"$dir/checkpoint.out" 2>&1 ||
		{ rc_fail "runc checkpoint failed: $(tail -n 3 "$dir/checkpoint.out")" "$dir/work-dump/dump.log"; return 1; }
	dump_s=$(since "$t0")
	img_bytes=$(du -sb "$dir/img" | cut -f1)
	gone_within 30 "$host_pid" || { rc_fail "pid $host_pid still exists after the checkpoint"; return 1; }
	rc_ delete -f "$id" 2>/dev/null
	at_dump=$(state_value "$dir/state/one" iterations)
	echo "  $name: checkpointed in $dump_s s at iteration $at_dump, image $(gib "$img_bytes") GiB, container removed"
	plugin_line "$dir/work-dump/dump.log" dump | sed 's/^/  /'
}

# A real CUDA workload in a runc container (hand-written OCI config: the host's /usr and /etc read-only, the
# NVIDIA device nodes as devices): checkpointed, the container removed, restored from the image under its
# own name, removed, and restored again under a new name; its data checked each time.
test_runc() {
	local name=runc dir=$work/runc runc_bin=$bundle/sbin/runc n devs=()
	[ -x "$runc_bin" ] || { skipped $name "no runc in the bundle"; return; }
	runc_prepare "$dir" || return
	for n in /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia[0-9]*; do [ -c "$n" ] && devs+=("$n"); done
	RUNC_BINDIR=$bundle/bin runc_config "$dir" "$dir" "" "${devs[@]}" || { failed $name "cannot write config.json"; return; }
	"$runc_bin" --version | head -n1 | sed 's/^/  /'

	# The container's stdio is runc's: /dev/null (CRIU cannot restore a file outside the container).
	rc_ run -d --bundle "$dir" ct-gpu </dev/null >/dev/null 2>&1 || { rc_fail "runc run failed (runc.log below)"; return; }
	wait_state "$dir/state/one" 120 1 || { rc_fail "in the container: $why"; return; }
	local host_pid at_dump now gpu t0 id
	host_pid=$(rc_state ct-gpu pid)
	gpu=$(gpu_gib "$host_pid")
	echo "  runc: container ct-gpu, workload host pid $host_pid (pid $(state_value "$dir/state/one" pid) inside), $gpu GiB on the GPU"
	rc_checkpoint ct-gpu "$host_pid" || return
	for id in ct-gpu ct-gpu-new; do
		t0=$(now)
		rc_ restore -d --bundle "$dir" --image-path "$dir/img" --work-path "$dir/work-$id" "$id" </dev/null >/dev/null 2>&1 ||
			{ rc_fail "runc restore as $id failed" "$dir/work-$id/restore.log"; return; }
		restore_s=$(since "$t0")
		[ "$(rc_state "$id" status)" = running ] || { rc_fail "$id is $(rc_state "$id" status) after the restore" "$dir/work-$id/restore.log"; return; }
		advance 60 "$dir/state/one" "$at_dump" || { rc_fail "$id after the restore: $why" "$dir/work-$id/restore.log"; return; }
		now=$(state_value "$dir/state/one" iterations)
		echo "  runc: restored as $id in $restore_s s (host pid $(rc_state "$id" pid)), iterations $at_dump -> $now, data verified"
		plugin_line "$dir/work-$id/restore.log" restore | sed 's/^/  /'
		rc_remove "$id"
		blank_state "$dir/state/one" # the next restore must write it
	done
	rc_remove_all
	passed $name "checkpoint $dump_s s, image $(gib "$img_bytes") GiB; restored as ct-gpu and as ct-gpu-new, data intact"
	rm -rf "$dir/img"
}

# mem_of PID: what a replica holds in host memory, from /proc/PID/status and smaps_rollup: its resident set,
# how much of it is file pages (the image's GPU state mapped from the page cache, shared by the replicas),
# and its proportional share (Pss: shared pages divided among those that map them), in GiB.
mem_of() {
	awk '/^VmRSS:/ { r = $2 } /^RssFile:/ { f = $2 } END { printf "rss %.2f GiB (file %.2f)", r / 1048576, f / 1048576 }' \
		"/proc/$1/status"
	awk '/^Pss:/ { printf ", pss %.2f GiB", $2 / 1048576 }' "/proc/$1/smaps_rollup" 2>/dev/null
}

# replica_bundle DIR REPLICA_DIR: a runtime bundle for one replica of the container of DIR: its config.json,
# with a root file system of its own (a copy of DIR/rootfs: mount points and links only), as runtimes give
# each container its own (runc restoring two containers on one root folder at once fails to mount there).
replica_bundle() {
	rm -rf "$2" && mkdir -p "$2" && cp -a "$1/rootfs" "$2/rootfs" || return 1
	python3 - "$1/config.json" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["root"]["path"] = sys.argv[2] + "/rootfs"
json.dump(c, open(sys.argv[2] + "/config.json", "w"), indent=1)
PY
}

# One checkpoint, N replicas, as runtimes make them: a runc container (as in test_runc) is checkpointed once
# and its image restored as N containers at once (N = 1, 2 and 4; GPU_TESTS_REPLICAS), each under its own
# name, bundle and work folder, so with its own pid, mount and network namespaces and its own /proc. The
# network namespace is needed: the driver listens on an abstract unix socket named after the process's pid
# namespace and pid (@cuda-uvmfd-<pid ns inode>-<pid>), which CRIU restores under the same name, so two
# replicas in one network namespace collide (bind: Address already in use). Each replica is a CUDA
# process verifying its device data at every iteration into the state file they share (/state/one; a
# mismatch writes status=FAIL and ends it): all of them alive and the file advancing with status=ok is all
# of them verified. Per N: the wall time of the N restores, each one's own time, and what each holds.
test_runc_replicas() {
	local name=runc-replicas dir=$work/runc-replicas runc_bin=$bundle/sbin/runc n devs=() host_pid k i t0 s
	local summary="" one_s="" id rc took ids pids
	[ -x "$runc_bin" ] || { skipped $name "no runc in the bundle"; return; }
	runc_prepare "$dir" || return
	for n in /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia[0-9]*; do [ -c "$n" ] && devs+=("$n"); done
	RUNC_NETNS=1 RUNC_BINDIR=$bundle/bin runc_config "$dir" "$dir" "" "${devs[@]}" || { failed $name "cannot write config.json"; return; }
	rc_ run -d --bundle "$dir" ct-src </dev/null >/dev/null 2>&1 || { rc_fail "runc run failed (runc.log below)"; return; }
	wait_state "$dir/state/one" 120 1 || { rc_fail "in the container: $why"; return; }
	host_pid=$(rc_state ct-src pid)
	echo "  $name: container ct-src, host pid $host_pid, $(gpu_gib "$host_pid") GiB on the GPU; its listening unix sockets:"
	awk 'NR > 1 && $4 == "00010000" { print "    " $0 }' "/proc/$host_pid/net/unix"
	rc_checkpoint ct-src "$host_pid" || return
	for k in ${GPU_TESTS_REPLICAS:-1 2 4}; do
		t0=$(now) ids=() pids=()
		for i in $(seq "$k"); do
			id=r$k-$i ids+=("$id")
			replica_bundle "$dir" "$dir/$id" || { rc_fail "cannot make the bundle of replica $id"; return; }
			(t1=$(now); rc_ restore -d --bundle "$dir/$id" --image-path "$dir/img" --work-path "$dir/work-$id" "$id" \
				</dev/null >/dev/null 2>&1; echo "$? $(since "$t1")" >"$dir/$id.rc") &
			pids+=($!)
		done
		wait "${pids[@]}"
		s=$(since "$t0")
		local each="" hosts=() nss=""
		for id in "${ids[@]}"; do
			read -r rc took <"$dir/$id.rc"
			[ "$rc" = 0 ] || { rc_fail "$k at once: replica $id: runc restore exited $rc after $took s" "$dir/work-$id/restore.log"; return; }
			[ "$(rc_state "$id" status)" = running ] || { rc_fail "$k at once: replica $id is $(rc_state "$id" status)" "$dir/work-$id/restore.log"; return; }
			hosts+=("$(rc_state "$id" pid)")
			each+=" $took"
		done
		nss=$(for p in "${hosts[@]}"; do readlink "/proc/$p/ns/pid" "/proc/$p/ns/mnt" "/proc/$p/ns/net"; done | sort -u | wc -l)
		[ "$nss" -eq $((3 * k)) ] || { rc_fail "$k at once: the replicas share namespaces ($nss pid, mount and network namespaces for $k)"; return; }
		advance 60 "$dir/state/one" "$at_dump" || { rc_fail "$k at once: after the restores: $why" "$dir/work-${ids[0]}/restore.log"; return; }
		for i in "${!hosts[@]}"; do
			[ -d "/proc/${hosts[$i]}" ] || { rc_fail "$k at once: replica ${ids[$i]} ended (state: $(state_value "$dir/state/one" status))"; return; }
			echo "  $name: $k at once: ${ids[$i]} host pid ${hosts[$i]} (pid $(awk '/^NSpid:/ { print $NF }' "/proc/${hosts[$i]}/status") inside), $(mem_of "${hosts[$i]}"), $(gpu_gib "${hosts[$i]}") GiB on the GPU"
		done
		plugin_line "$dir/work-${ids[0]}/restore.log" restore | sed 's/^/  /'
		echo "  $name: $k replica(s) restored at once in $s s (each restore:$each s), all running, data verified (iterations $after)"
		[ -n "$one_s" ] || one_s=$s
		summary+="${summary:+; }$k at once ${s} s ($(awk -v a="$s" -v b="$one_s" 'BEGIN { printf "%.2f", a / b }')x one)"
		for id in "${ids[@]}"; do rc_remove "$id"; done
		blank_state "$dir/state/one" # the next restores must write it
	done
	rc_remove_all
	passed $name "checkpoint $dump_s s, image $(gib "$img_bytes") GiB; $summary; each replica its own container, namespaces and /proc, data verified"
	rm -rf "$dir/img"
}

# gpu_nodes_of PID: the GPU device nodes (nvidiaN, by minor number) the process holds open, as a list.
gpu_nodes_of() {
	local f t m
	for f in /proc/"$1"/fd/*; do
		read -r t m < <(stat -L -c '%t %T' "$f" 2>/dev/null) || continue
		[ "$t" = c3 ] && [ $((16#$m)) -lt 255 ] && echo "nvidia$((16#$m))"
	done | sort -u | xargs
}

# runc_devdir DIR NODE...: a /dev for a container in the host directory DIR: the character devices runc
# would create (null, zero, full, random, urandom), its links, shm/ for the tmpfs mounted there, and a node
# with the same numbers for each host NODE (/dev/nvidiactl, ...), under the same name.
runc_devdir() {
	local d=$1 n t m; shift
	rm -rf "$d" && mkdir -p "$d/shm" || return 1
	for n in null:3 zero:5 full:7 random:8 urandom:9; do mknod -m 666 "$d/${n%:*}" c 1 "${n#*:}" || return 1; done
	ln -s /proc/self/fd "$d/fd" && ln -s /proc/self/fd/0 "$d/stdin" && ln -s /proc/self/fd/1 "$d/stdout" &&
		ln -s /proc/self/fd/2 "$d/stderr" || return 1
	for n in "$@"; do
		read -r t m < <(stat -c '%t %T' "$n") || return 1
		mknod -m 666 "$d/${n#/dev/}" c $((16#$t)) $((16#$m)) || return 1
	done
}

# A runc container that sees only GPU 0, checkpointed, and restored onto GPU 1 as a new container that sees
# only GPU 1. The container's /dev is a bind mount of a host directory (not runc's tmpfs): CRIU restores a
# tmpfs /dev from the image, with GPU 0's node and without GPU 1's, whatever the restoring config.json says,
# whereas a bind mount is external to CRIU and runc hands it the source named by the restoring config.json.
# So the checkpoint's /dev holds nvidia0 (plus nvidiactl, nvidia-uvm, nvidia-uvm-tools) and the restore's
# holds nvidia1 in its place: the driver, restoring with the GPU pairs, reopens /dev/nvidiaN by the new
# GPU's minor number inside the container, and the process has no use for GPU 0 afterwards, so nvidia0 is
# left out (and denied by the cgroup) to show that nothing still needs it. GPU_TESTS_RUNC_REMAP_KEEP0=1
# keeps nvidia0 there too, to tell a driver that still wants it from other failures.
# The pairs: CUDA_CRIU_DEVICE_MAP=GPU0=GPU1 (UUIDs) in runc's environment, which runc passes to CRIU; with
# GPU_TESTS_RUNC_REMAP=auto no map, so that the plugin pairs GPU 0 with GPU 1 by itself (runc puts CRIU in
# the container's device cgroup: GPU 1 is the only GPU it sees).
test_runc_remap() {
	local name=runc-remap dir=$work/runc-remap runc_bin=$bundle/sbin/runc how=${GPU_TESTS_RUNC_REMAP:-map}
	[ -x "$runc_bin" ] || { skipped $name "no runc in the bundle"; return; }
	with_two_gpus $name || return
	local u0 u1 n common=() devs0 devs1 renv line host_pid at_dump t0 now
	u0=$(gpu_uuid 0); u1=$(gpu_uuid 1)
	for n in /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools; do [ -c "$n" ] && common+=("$n"); done
	[ -c /dev/nvidia0 ] && [ -c /dev/nvidia1 ] || { failed $name "no /dev/nvidia0 or /dev/nvidia1 on this machine"; return; }
	devs0=("${common[@]}" /dev/nvidia0)
	devs1=("${common[@]}" /dev/nvidia1)
	[ -n "${GPU_TESTS_RUNC_REMAP_KEEP0:-}" ] && devs1+=(/dev/nvidia0)
	case "$how" in
	# Only GPU 0's pair: the container's /dev had no nvidia1, so its driver never knew GPU 1 (the dump
	# records no other GPU, and the driver refuses a pair for one the process did not know).
	map) renv="CUDA_CRIU_DEVICE_MAP=$u0=$u1" ;;
	# runc puts CRIU into the container's device cgroup before it restores: CRIU sees GPU 1 only and the
	# plugin pairs GPU 0 of the image with it by itself (CUDA_VISIBLE_DEVICES=1 would hide GPU 1 too).
	auto) renv=CUDA_CRIU_DEVICE_MAP= ;;
	*) failed $name "GPU_TESTS_RUNC_REMAP=$how: want map or auto"; return ;;
	esac
	runc_prepare "$dir" || return
	# The nodes are made under $work: a file system mounted nodev there would make them unusable.
	if findmnt -n -o OPTIONS -T "$dir" | grep -qw nodev; then
		failed $name "$work is on a file system mounted nodev: set GPU_TESTS_WORK to a folder where device nodes work"; return
	fi
	runc_devdir "$dir/dev-gpu0" "${devs0[@]}" || { failed $name "cannot make the device nodes in $dir/dev-gpu0"; return; }
	runc_devdir "$dir/dev-gpu1" "${devs1[@]}" || { failed $name "cannot make the device nodes in $dir/dev-gpu1"; return; }
	RUNC_BINDIR=$bundle/bin runc_config "$dir/gpu0" "$dir" "$dir/dev-gpu0" "${devs0[@]}" &&
		RUNC_BINDIR=$bundle/bin runc_config "$dir/gpu1" "$dir" "$dir/dev-gpu1" "${devs1[@]}" ||
		{ failed $name "cannot write config.json"; return; }
	"$runc_bin" --version | head -n1 | sed 's/^/  /'

	# The process's environment is config.json's: CUDA_VISIBLE_DEVICES is unset, GPU 0 is all it can open.
	rc_ run -d --bundle "$dir/gpu0" ct-gpu0 </dev/null >/dev/null 2>&1 || { rc_fail "runc run failed (runc.log below)"; return; }
	wait_state "$dir/state/one" 120 1 || { rc_fail "in the container: $why"; return; }
	host_pid=$(rc_state ct-gpu0 pid)
	echo "  $name: container ct-gpu0, host pid $host_pid holds $(gpu_nodes_of "$host_pid"), on $(gpu_uuids_of "$host_pid") (GPU 0 is $u0)"
	[ "$(gpu_uuids_of "$host_pid")" = "$u0" ] || { rc_fail "before the checkpoint the workload is on '$(gpu_uuids_of "$host_pid")', not GPU 0 ($u0)"; return; }
	rc_checkpoint ct-gpu0 "$host_pid" || return

	echo "  $name: restoring as ct-gpu1 (/dev with ${devs1[*]}) with $renv"
	t0=$(now)
	# shellcheck disable=SC2163 # renv is NAME=VALUE
	(export "$renv" && rc_ restore -d --bundle "$dir/gpu1" --image-path "$dir/img" --work-path "$dir/work-restore" ct-gpu1) \
		</dev/null >/dev/null 2>&1 ||
		{ rc_fail "runc restore as ct-gpu1 with $renv failed" "$dir/work-restore/restore.log"; return; }
	restore_s=$(since "$t0")
	line=$(plugin_line "$dir/work-restore/restore.log" 'restoring with GPU pairs')
	echo "  ${line:-no 'restoring with GPU pairs' line in restore.log}"
	[ "$(rc_state ct-gpu1 status)" = running ] || { rc_fail "ct-gpu1 is $(rc_state ct-gpu1 status) after the restore" "$dir/work-restore/restore.log"; return; }
	advance 60 "$dir/state/one" "$at_dump" || { rc_fail "ct-gpu1 after the restore: $why" "$dir/work-restore/restore.log"; return; }
	now=$(state_value "$dir/state/one" iterations)
	host_pid=$(rc_state ct-gpu1 pid)
	echo "  $name: restored as ct-gpu1 in $restore_s s, host pid $host_pid holds $(gpu_nodes_of "$host_pid"), iterations $at_dump -> $now, data verified"
	plugin_line "$dir/work-restore/restore.log" restore | sed 's/^/  /'
	nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader 2>&1 | sed 's/^/  nvidia-smi | /'
	if [ -z "$line" ]; then
		rc_fail "the plugin did not restore with GPU pairs (no 'restoring with GPU pairs' line)" "$dir/work-restore/restore.log"; return
	fi
	expect_on $name "$host_pid" 1 || { rc_remove_all; return; }
	rc_remove_all
	passed $name "checkpoint on GPU 0 $dump_s s, image $(gib "$img_bytes") GiB; restored as ct-gpu1 with only /dev/nvidia1 onto GPU 1 ($how) in $restore_s s, data intact"
	rm -rf "$dir/img"
}
