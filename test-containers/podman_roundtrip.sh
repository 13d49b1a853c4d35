#!/usr/bin/env bash
# podman (runtime runc): containers running a CUDA workload (fake GPU) each
#   1. pc-one: checkpointed and restored in place;
#   2. pc-two: checkpointed with --leave-running into a checkpoint image (--create-image) that is pushed
#      to a registry that is down (nothing listens on its port), and a tag that the test's registry does
#      not have is pulled: both fail, naming the registry or the image, and pc-two runs on with its data;
#   3. moved to a "second host" - a private mount namespace in which podman's and runc's directories
#      (/var/lib/containers/storage, /run/containers/storage, /run/libpod, /run/runc) are empty ones, so
#      that podman there has a store of its own at the usual paths: pc-one checkpointed with --export to a
#      tarball, removed, and restored there with --import under a new name; pc-two checkpointed into a
#      checkpoint image (--create-image), pushed to the test's registry (docker-registry on 127.0.0.1,
#      lib.sh's registry_start), removed with the image, pulled there from the registry and restored
#      under a new name. (podman 4.3 writes either the tarball or the image at one checkpoint.)
# Our plugin is enabled only through /etc/criu/runc.conf and /etc/criu/cuda_plugin.conf. The workload
# verifies its device memory after each restore and counts on from where it was checkpointed.
source "$(dirname "$0")/lib.sh"

CKPT_REPO=cuda-criu-ct/pc-two # pc-two's checkpoint images in the test's registry

# restore_moved STATE NAME WHAT RESTORE-ARGS...: a container of the first host restored here as NAME, its
# workload (state file $T/state/STATE) checked, then removed.
restore_moved() {
	local state=$T/state/$1 name=$2 what=$3
	shift 3
	on_pod_exit rm -f -t 0 "$name"
	pod container restore --keep --name "$name" "$@" >"$T/restore-cmd.log" 2>&1 ||
		{ pod_log "$name" restore; fail "podman container restore $* failed: $(cat "$T/restore-cmd.log")"; }
	pod_log "$name" restore
	expect_summary "$T/restore.log" restore 1 "no restore summary of $name on the second host"
	[ "$(pod_status "$name")" = running ] || fail "$name, restored from $*, is $(pod_status "$name")"
	expect_resumed "$state" "$(cat "$state.at_dump")" "$what"
	pod rm -f -t 0 "$name" >/dev/null
}

second_host() {
	local img=$REGISTRY/$CKPT_REPO:checkpoint
	[ -z "$(pod ps -aq)" ] || fail "the second host's store is not empty"
	pod_import_image
	restore_moved one pc-moved "exported, removed, imported on a second host under a new name" --import "$T/pc-one.tar.gz"
	on_pod_exit rmi -f "$img"
	pod pull --tls-verify=false "$img" >"$T/pull.log" 2>&1 || fail "podman pull $img failed: $(cat "$T/pull.log")"
	restore_moved two pc-pulled "pushed to a registry, removed, pulled on a second host under a new name" "$img"
	pod rmi -f "$img" "$POD_IMAGE" >/dev/null
}
second_host_part "$@"

# pod_fails WHAT REASON ARGS...: `pod ARGS...` fails with a message naming WHAT and matching REASON (an
# extended regular expression), and pc-two runs on with its data.
pod_fails() {
	local what=$1 reason=$2
	shift 2
	if pod "$@" >"$T/fails.log" 2>&1; then fail "podman $* succeeded"; fi
	grep -qF "$what" "$T/fails.log" || fail "podman $* failed without naming $what: $(cat "$T/fails.log")"
	grep -qE "$reason" "$T/fails.log" || fail "podman $* failed without saying '$reason': $(cat "$T/fails.log")"
	log "podman $1 failed as it should: $(tail -n1 "$T/fails.log")"
	[ "$(pod_status pc-two)" = running ] || fail "after the failed $1 pc-two is $(pod_status pc-two)"
	expect_healthy "$T/state/two"
}

# checkpoint_out NAME STATE: after a checkpoint that stopped NAME: removed, its workload's iteration kept
# in STATE.at_dump for the second host, STATE blanked for the restored workload to fill.
checkpoint_out() {
	pod rm -f "$1" >/dev/null || fail "podman rm $1 failed"
	state_value "$2" iterations >"$2.at_dump"
	blank_state "$2"
}

ct_setup runc podman docker-registry
podman_setup
# Our runc as podman's default runtime, also on the second host (CONTAINERS_CONF is passed on): podman 4.3
# names the default runtime in a checkpoint image, and restores an image with the runtime it names.
pod_runtime_conf
pod_fakegpu_mounts
registry_start

pod_run pc-one "$(memcheck_cmd one 64)" "${POD_FAKEGPU[@]}"
pod_run pc-two "$(memcheck_cmd two 64)" "${POD_FAKEGPU[@]}"
wait_for "the workloads to fill their device memory" 20 test -f "$T/state/one" -a -f "$T/state/two"
expect_healthy "$T/state/one"
expect_healthy "$T/state/two"
host_pid=$(pod_pid pc-one)

# 1. In place.
pod container checkpoint --keep pc-one >"$T/checkpoint.log" 2>&1 || { pod_log pc-one dump; fail "podman container checkpoint failed"; }
pod_log pc-one dump
expect_summary "$T/dump.log" dump 1 "no dump summary: is the plugin loaded through /etc/criu/runc.conf?"
[ -z "$(plugin_errors "$T/dump.log")" ] || fail "plugin errors in the dump log"
[ "$(pod_status pc-one)" = exited ] || fail "after checkpoint the container is $(pod_status pc-one)"
wait_for "pid $host_pid to exit" 10 test ! -e "/proc/$host_pid"
at_dump=$(state_value "$T/state/one" iterations)
expect_still "$T/state/one"
pod container restore --keep pc-one >"$T/restore-cmd.log" 2>&1 || { pod_log pc-one restore; fail "podman container restore failed: $(cat "$T/restore-cmd.log")"; }
pod_log pc-one restore
expect_summary "$T/restore.log" restore 1 "no restore summary"
[ "$(pod_status pc-one)" = running ] || fail "restored container is $(pod_status pc-one)"
expect_resumed "$T/state/one" "$at_dump" "checkpoint and restore in place"

# 2. A registry that is down, a tag that is not there.
snapshot=localhost/cuda-criu-ct-checkpoint:snapshot
on_pod_exit rmi -f "$snapshot"
pod container checkpoint --leave-running --create-image "$snapshot" pc-two >"$T/checkpoint.log" 2>&1 ||
	fail "podman container checkpoint --leave-running --create-image failed: $(cat "$T/checkpoint.log")"
down=127.0.0.1:$(free_port)
pod_fails "$down" "connection refused" push --tls-verify=false "$snapshot" "$down/$CKPT_REPO:snapshot"
pod_fails "$REGISTRY/$CKPT_REPO:missing" "manifest unknown" pull --tls-verify=false "$REGISTRY/$CKPT_REPO:missing"
pod rmi "$snapshot" >/dev/null || fail "podman rmi $snapshot failed"

# 3. Out of this host: pc-one exported, pc-two pushed to the registry; restored on a second host.
pod container checkpoint --keep --compress gzip --export "$T/pc-one.tar.gz" pc-one >"$T/checkpoint.log" 2>&1 ||
	{ pod_log pc-one dump; fail "podman container checkpoint --export failed: $(cat "$T/checkpoint.log")"; }
[ -s "$T/pc-one.tar.gz" ] || fail "no exported checkpoint"
tar -tzf "$T/pc-one.tar.gz" >"$T/export.list"
grep -q 'checkpoint/cuda-plugin.img' "$T/export.list" || fail "the export has no checkpoint/cuda-plugin.img"
checkpoint_out pc-one "$T/state/one"

img=$REGISTRY/$CKPT_REPO:checkpoint
on_pod_exit rmi -f "$img"
pod container checkpoint --keep --create-image "$img" pc-two >"$T/checkpoint.log" 2>&1 ||
	{ pod_log pc-two dump; fail "podman container checkpoint --create-image failed: $(cat "$T/checkpoint.log")"; }
pod_log pc-two dump
expect_summary "$T/dump.log" dump 1 "no dump summary of pc-two"
pod push --tls-verify=false "$img" >"$T/push.log" 2>&1 || fail "podman push $img failed: $(cat "$T/push.log")"
pod rmi "$img" >/dev/null || fail "podman rmi $img failed"
checkpoint_out pc-two "$T/state/two"
on_second_host
log PASS
