#!/usr/bin/env bash
# containerd (runc shim io.containerd.runc.v2, client ctr): a container running a CUDA workload (fake
# GPU) is
#   1. checkpointed with `ctr containers checkpoint --task --rw` into a checkpoint image in containerd's
#      store (the container runs on), removed, and restored from that image under its own name
#      (`ctr containers restore --live --rw`);
#   2. removed again and restored from the same image into a new container.
# The test runs a containerd of its own (containerd_lib.sh). Our plugin is enabled only through
# /etc/criu/runc.conf (libdir) and /etc/criu/cuda_plugin.conf, as on a node, where no ctr caller's
# environment reaches CRIU (runc has CRIU read that file). The workload verifies its device memory after each
# restore and counts on from where it was checkpointed.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/containerd_lib.sh"
ct_setup runc containerd
criu_conf_setup
ctrd_setup
log "$(containerd --version)"

ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }

# ctrd_restore ID: a new container ID from the checkpoint image, its task restored and running.
ctrd_restore() {
	local id=$1 t0
	t0=$(date +%s%N)
	rm -f "$T/restore.log"
	ctrd_ containers restore --live --rw "$id" "$CKPT" </dev/null >"$T/restore-$id.log" 2>&1 ||
		fail "ctr containers restore $id failed: $(cat "$T/restore-$id.log")"
	[ -f "$T/restore.log" ] || fail "no CRIU restore.log from the restore of $id"
	expect_summary "$T/restore.log" restore 1 \
		"no restore summary from the plugin: is it loaded through /etc/criu/runc.conf?"
	[ -z "$(plugin_errors "$T/restore.log")" ] || fail "plugin errors in the restore log"
	[ "$(ctrd_status "$id")" = RUNNING ] || fail "restored task $id is '$(ctrd_status "$id")'"
	log "restored $id in $(ms_since "$t0") ms"
}

ctrd_remove() { # ID
	local pid
	pid=$(ctrd_pid "$1")
	ctrd_ tasks kill -s KILL "$1" >/dev/null 2>&1 || true
	[ -z "$pid" ] || wait_for "pid $pid to exit" 10 test ! -e "/proc/$pid"
	wait_for "task $1 to stop" 10 sh -c "[ \"\$(ctr --address $CTRD_SOCK -n $CTRD_NS tasks ls | awk '\$1 == \"$1\" { print \$3 }')\" = STOPPED ]"
	ctrd_ tasks delete "$1" >/dev/null 2>&1 || fail "ctr tasks delete $1 failed"
	ctrd_ containers delete "$1" >/dev/null 2>&1 || fail "ctr containers delete $1 failed"
}

CKPT=checkpoint/cc-one:1
ctrd_run cc-one "$(memcheck_cmd one 64)"
wait_for "the workload to fill its device memory" 20 test -f "$T/state/one"
expect_healthy "$T/state/one"
host_pid=$(ctrd_pid cc-one)

# 1. Checkpoint into an image (the container runs on), remove, restore under the same name.
# The workload runs on after the checkpoint: its iteration before it is what a restore must reach.
before=$(state_value "$T/state/one" iterations)
t0=$(date +%s%N)
ctrd_ containers checkpoint --task --rw cc-one "$CKPT" </dev/null >"$T/checkpoint.log" 2>&1 ||
	fail "ctr containers checkpoint failed: $(cat "$T/checkpoint.log")"
log "checkpointed cc-one in $(ms_since "$t0") ms"
[ -f "$T/dump.log" ] || fail "no CRIU dump.log from the checkpoint"
expect_summary "$T/dump.log" dump 1 \
	"no dump summary from the plugin: is it loaded through /etc/criu/runc.conf?"
[ -z "$(plugin_errors "$T/dump.log")" ] || fail "plugin errors in the dump log"
# The GPU state is in the checkpoint image: the CRIU images are one blob of it.
index=$(ctrd_ images ls | awk -v r="$CKPT" '$1 == r { print $3 }')
[ -n "$index" ] || fail "no checkpoint image $CKPT in containerd's store"
criu_blob=$(ctrd_ content get "$index" | jq -r '.manifests[] | select(.mediaType | endswith("criu.checkpoint.criu.tar")) | .digest')
[ -n "$criu_blob" ] || fail "the checkpoint image $CKPT has no CRIU images"
ctrd_ content get "$criu_blob" | tar -t >"$T/criu-blob.list" || fail "cannot read the CRIU images of $CKPT"
grep -qx 'cuda-plugin.img' "$T/criu-blob.list" || fail "the checkpoint image has no cuda-plugin.img"
[ "$(ctrd_status cc-one)" = RUNNING ] || fail "after the checkpoint cc-one is '$(ctrd_status cc-one)'"
expect_healthy "$T/state/one"
ctrd_remove cc-one
expect_still "$T/state/one"
blank_state "$T/state/one"
ctrd_restore cc-one
[ "$(ctrd_pid cc-one)" != "$host_pid" ] || log "note: the restored task got the same host pid"
expect_resumed "$T/state/one" "$before" "restored as cc-one"
[ "$(state_value "$T/state/one" pid)" = 1 ] || fail "the workload is not pid 1 of the container"

# 2. The same checkpoint image restored into a new container.
ctrd_remove cc-one
blank_state "$T/state/one"
ctrd_restore cc-new
expect_resumed "$T/state/one" "$before" "restored as cc-new"
ctrd_remove cc-new
log PASS
