# Helpers of the containerd tests (sourced after lib.sh): a containerd of the test's own, its client ctr,
# the busybox image in containerd's store, and CRIU's configuration files.
#
# containerd runs with the test's --root, --state and --address (under $T) and with the plugins that would
# write elsewhere (CRI, /opt/containerd) disabled: nothing of a containerd on the machine is used or
# touched. runc's state goes to $T too (`ctr run --runc-root`). Only the shims' sockets and ctr's FIFOs go
# to containerd's fixed /run/containerd/s and /run/containerd/fifo: the test removes those directories
# when it created them.

CTRD_NS=cuda-criu-ct
CTRD_IMAGE=localhost/cuda-criu-ct:test
CTRD_SOCK=""
CTRD_PID=""

ctrd_() { ctr --address "$CTRD_SOCK" --namespace "$CTRD_NS" "$@"; }

# runc_wrapper: $T/bin/runc, the runtime binary the containers are given. It adds only what the test
# needs and a node would not: our CRIU (`runc --criu`) and FAKEGPU_DIR for the fake libcuda that the
# plugin loads inside CRIU. Neither the plugin's directory nor its options go through it. It also copies
# CRIU's log of the last checkpoint and restore to $T/dump.log and $T/restore.log: containerd's shim
# removes its CRIU work directory after a checkpoint.
runc_wrapper() {
	mkdir -p "$T/bin"
	cat >"$T/bin/runc" <<EOR
#!/bin/bash
export FAKEGPU_DIR=$FAKEGPU_DIR
work="" cmd=""
prev=""
for a in "\$@"; do
	[ "\$prev" = --work-path ] && work=\$a
	case "\$a" in checkpoint | restore) [ -n "\$cmd" ] || cmd=\$a ;; esac
	prev=\$a
done
rc=0
$(command -v runc) --criu $CRIU "\$@" || rc=\$?
if [ -n "\$cmd" ] && [ -n "\$work" ]; then
	log=\$work/dump.log
	[ "\$cmd" = restore ] && log=\$work/restore.log
	cp "\$log" "$T/\${log##*/}" 2>/dev/null
fi
exit \$rc
EOR
	chmod +x "$T/bin/runc"
}

ctrd_setup() {
	command -v ctr >/dev/null || skip "ctr is not installed (test-containers/setup.sh installs containerd)"
	local d=$T/containerd
	mkdir -p "$d"
	CTRD_SOCK=$d/containerd.sock
	cat >"$d/config.toml" <<EOF
version = 2
root = "$d/root"
state = "$d/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$CTRD_SOCK"
[ttrpc]
  address = "$CTRD_SOCK.ttrpc"
[debug]
  address = "$d/debug.sock"
[metrics]
  address = ""
EOF
	[ -d /run/containerd ] || on_exit 'rmdir /run/containerd/s /run/containerd/fifo /run/containerd'
	# Without the plugin's variables: only CRIU's configuration may enable the plugin.
	env -u CRIU_LIBS_DIR -u CUDA_CRIU_LIBCUDA setsid containerd --config "$d/config.toml" </dev/null >"$T/containerd.log" 2>&1 &
	CTRD_PID=$!
	on_exit 'ctrd_stop'
	wait_for "containerd to serve on $CTRD_SOCK" 20 eval 'ctrd_ version >/dev/null'
	runc_wrapper
	ctrd_import_image
}

# At exit: every task and container of our namespace removed, containerd stopped, and any shim of it
# left (a task that would not die) killed. Each ctr call has a time limit: a shim that hangs must not
# hang the test.
ctrd_stop() {
	local id pid
	ctrd_t() { timeout 20 ctr --address "$CTRD_SOCK" --namespace "$CTRD_NS" "$@"; }
	for id in $(ctrd_t tasks ls -q 2>/dev/null); do
		ctrd_t tasks kill -s KILL "$id"
		ctrd_t tasks delete -f "$id"
	done
	for id in $(ctrd_t containers ls -q 2>/dev/null); do ctrd_t containers delete "$id"; done
	kill "$CTRD_PID" 2>/dev/null
	wait "$CTRD_PID" 2>/dev/null
	for pid in $(cat "$T"/containerd/state/io.containerd.runtime.v2.task/"$CTRD_NS"/*/shim.pid 2>/dev/null); do
		kill -KILL "$pid"
	done
}

# The busybox image: an OCI archive of setup.sh's tarball as its only layer, imported into containerd's
# store (there is no registry here).
ctrd_import_image() {
	oci_image_tar "$T/image.tar" "$CTRD_IMAGE"
	ctrd_ images import "$T/image.tar" >"$T/import.log" 2>&1 || fail "ctr images import failed: $(cat "$T/import.log")"
}

# ctrd_run ID SHELL-COMMAND: a GPU test container (fake GPU) started detached, stdio on /dev/null, its
# own network namespace with only a loopback, the runtime our runc wrapper.
ctrd_run() {
	local id=$1 cmd=$2
	ctrd_ run -d --null-io --runc-binary "$T/bin/runc" --runc-root "$T/runc-root" \
		--mount "type=bind,src=$(readlink -f /lib/x86_64-linux-gnu),dst=/lib/x86_64-linux-gnu,options=rbind:ro" \
		--mount "type=bind,src=$(dirname "$FAKE_LIB"),dst=/opt/fakegpu,options=rbind:ro" \
		--mount "type=bind,src=$(dirname "$MEMCHECK"),dst=/opt/workloads,options=rbind:ro" \
		--mount "type=bind,src=$T/state,dst=/state,options=rbind:rw" \
		--mount "type=bind,src=$CT_RUN,dst=$CT_RUN,options=rbind:rw" \
		--env LD_LIBRARY_PATH=/opt/fakegpu --env "FAKEGPU_DIR=$FAKEGPU_DIR" \
		"$CTRD_IMAGE" "$id" /bin/sh -c "$cmd" </dev/null >"$T/run-$id.log" 2>&1 ||
		fail "ctr run $id failed: $(cat "$T/run-$id.log")"
}

ctrd_status() { ctrd_ tasks ls 2>/dev/null | awk -v id="$1" '$1 == id { print $3 }'; }
ctrd_pid() { ctrd_ tasks ls 2>/dev/null | awk -v id="$1" '$1 == id { print $2 }'; }
