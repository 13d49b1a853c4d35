#!/usr/bin/env bash
# podman (runtime runc): a container running a CUDA workload (fake GPU) is
#   1. checkpointed and restored in place;
#   2. checkpointed with --export to a tarball and removed, then restored with --import, under a new
#      name, on a "second host": a private mount namespace in which podman's and runc's directories
#      (/var/lib/containers/storage, /run/containers/storage, /run/libpod, /run/runc) are empty ones,
#      so that podman there has a store of its own with only the image, at the usual paths.
# Our plugin is enabled only through /etc/criu/runc.conf and /etc/criu/cuda_plugin.conf. The workload
# verifies its device memory after each restore and counts on from where it was checkpointed.
source "$(dirname "$0")/lib.sh"

second_host() {
	[ -z "$(pod ps -aq)" ] || fail "the second host's store is not empty"
	pod_import_image
	on_pod_exit rm -f -t 0 pc-moved
	pod container restore --keep --import "$T/pc-one.tar.gz" --name pc-moved >"$T/restore-cmd.log" 2>&1 ||
		{ pod_log pc-moved restore; fail "podman container restore --import failed: $(cat "$T/restore-cmd.log")"; }
	pod_log pc-moved restore
	expect_summary "$T/restore.log" restore 1 "no restore summary on the second host"
	[ "$(pod_status pc-moved)" = running ] || fail "imported container is $(pod_status pc-moved)"
	expect_resumed "$T/state/one" "$(cat "$T/at_dump")" "exported, removed, imported on a second host under a new name"
	pod rm -f -t 0 pc-moved >/dev/null
	pod rmi -f "$POD_IMAGE" >/dev/null
}
second_host_part "$@"

ct_setup runc podman
podman_setup
pod_fakegpu_mounts

pod_run pc-one "$(memcheck_cmd one 64)" "${POD_FAKEGPU[@]}"
wait_for "the workload to fill its device memory" 20 test -f "$T/state/one"
expect_healthy "$T/state/one"
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

# 2. Export and remove here, import on a second host.
pod container checkpoint --keep --compress gzip --export "$T/pc-one.tar.gz" pc-one >"$T/checkpoint.log" 2>&1 ||
	{ pod_log pc-one dump; fail "podman container checkpoint --export failed: $(cat "$T/checkpoint.log")"; }
[ -s "$T/pc-one.tar.gz" ] || fail "no exported checkpoint"
tar -tzf "$T/pc-one.tar.gz" >"$T/export.list"
grep -q 'checkpoint/cuda-plugin.img' "$T/export.list" || fail "the export has no checkpoint/cuda-plugin.img"
pod rm -f pc-one >/dev/null || fail "podman rm failed"
state_value "$T/state/one" iterations >"$T/at_dump"
blank_state "$T/state/one"
on_second_host
log PASS
