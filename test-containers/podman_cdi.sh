#!/usr/bin/env bash
# podman + CDI: the fake GPU is described by a CDI spec (/etc/cdi/cuda-criu-ct.json, written for the test)
# like the NVIDIA container toolkit describes real GPUs: its "device nodes" ($FAKEGPU_DIR/dev/nvidia*,
# plain files) mounted at /dev/nvidia*, its driver library and daemon directory mounted, its environment
# set. `podman run --device cuda-criu-ct.test/gpu=0` gets it all; the container is checkpointed and
# restored, and its device files and the workload's open handles on them survive.
source "$(dirname "$0")/lib.sh"
ct_setup runc podman
podman_setup

if [ ! -d /etc/cdi ]; then
	mkdir /etc/cdi
	on_exit 'rmdir /etc/cdi'
fi
on_exit 'rm -f /etc/cdi/cuda-criu-ct.json'
jq -n --arg fg "$FAKEGPU_DIR" --arg run "$CT_RUN" --arg lib "$(dirname "$FAKE_LIB")" '{
  cdiVersion: "0.5.0",
  kind: "cuda-criu-ct.test/gpu",
  devices: [{
    name: "0",
    containerEdits: {mounts: [{hostPath: ($fg + "/dev/nvidia0"), containerPath: "/dev/nvidia0", options: ["bind", "rw"]}]}
  }],
  containerEdits: {
    env: ["LD_LIBRARY_PATH=/opt/fakegpu", ("FAKEGPU_DIR=" + $fg)],
    mounts: [
      {hostPath: ($fg + "/dev/nvidiactl"), containerPath: "/dev/nvidiactl", options: ["bind", "rw"]},
      {hostPath: ($fg + "/dev/nvidia-uvm"), containerPath: "/dev/nvidia-uvm", options: ["bind", "rw"]},
      {hostPath: $lib, containerPath: "/opt/fakegpu", options: ["rbind", "ro"]},
      {hostPath: $run, containerPath: $run, options: ["rbind", "rw"]}
    ]
  }
}' >/etc/cdi/cuda-criu-ct.json

# The workload's handles on the fake device files (as the driver's on /dev/nvidia*), seen from the host.
device_fds() { # HOST-PID
	local fd
	for fd in /proc/"$1"/fd/*; do readlink "$fd"; done 2>/dev/null | grep -E "^$FAKEGPU_DIR/dev/" | sort | xargs
}
expect_devices() { # WHAT
	local pid
	pid=$(pod_pid pc-cdi)
	pod exec pc-cdi test -e /dev/nvidia0 -a -e /dev/nvidiactl -a -e /dev/nvidia-uvm ||
		fail "$1: the CDI device files are missing in the container"
	local fds
	fds=$(device_fds "$pid")
	[ "$fds" = "$FAKEGPU_DIR/dev/nvidia-uvm $FAKEGPU_DIR/dev/nvidia0 $FAKEGPU_DIR/dev/nvidiactl" ] ||
		fail "$1: the workload's device handles are '$fds'"
}

pod_run pc-cdi "$(memcheck_cmd one 32)" --device cuda-criu-ct.test/gpu=0
wait_for "the workload to fill its device memory" 20 test -f "$T/state/one"
expect_healthy "$T/state/one"
expect_devices "before the checkpoint"

pod container checkpoint --keep pc-cdi >"$T/checkpoint.log" 2>&1 || { pod_log pc-cdi dump; fail "podman container checkpoint failed"; }
pod_log pc-cdi dump
expect_summary "$T/dump.log" dump 1 "no dump summary"
[ -z "$(plugin_errors "$T/dump.log")" ] || fail "plugin errors in the dump log"
at_dump=$(state_value "$T/state/one" iterations)
pod container restore --keep pc-cdi >"$T/restore-cmd.log" 2>&1 || { pod_log pc-cdi restore; fail "podman container restore failed: $(cat "$T/restore-cmd.log")"; }
pod_log pc-cdi restore
expect_summary "$T/restore.log" restore 1 "no restore summary"
expect_resumed "$T/state/one" "$at_dump" "CDI devices, restored"
expect_devices "after the restore"
pod rm -f -t 0 pc-cdi >/dev/null
log "CDI devices: checkpoint and restore, device files and handles back, data intact"
log PASS
