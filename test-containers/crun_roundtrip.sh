#!/usr/bin/env bash
# crun: a container running a CUDA workload (fake GPU) is checkpointed with our plugin, removed, and
# restored under its own name; the workload verifies its device memory and counts on.
#
# crun drives CRIU through libcriu (`criu swrk` from PATH, started with crun's environment), and only
# when it was built with CRIU support (`crun --version` lists +CRIU). Debian 12's crun 1.8.1 is not:
# it has no `checkpoint`/`restore` commands, and the test skips saying so. A crun with +CRIU needs
# libcriu.so.2 at run time (Debian's libcriu2 talks to any newer criu over its RPC). Only crun releases
# with CRIU configuration-file support (libcriu's criu_set_config_file, CRIU 4.2) have CRIU read
# /etc/criu/crun.conf or /etc/criu/runc.conf; older ones have it read no configuration file, so the
# plugin must be in CRIU's default plugin directory or named by CRIU_LIBS_DIR in crun's environment,
# which is what this test does (as the runc tests do).
source "$(dirname "$0")/lib.sh"
ct_setup crun
crun --version | grep -q '+CRIU' ||
	skip "$(crun --version | head -n1) is built without CRIU support ('crun --version' lists no +CRIU, 'crun checkpoint' is an unknown command): Debian 12's crun cannot checkpoint; use runc, or a crun built with libcriu (+CRIU)"

mkdir -p "$T/bin"
ln -s "$CRIU" "$T/bin/criu"
CRUN_ROOT=$T/crun-root
crun_() { PATH=$T/bin:$PATH crun --root "$CRUN_ROOT" "$@"; }
on_exit 'crun --root "$CRUN_ROOT" delete -f ct-crun'

make_bundle "$T/bundle" "$(memcheck_cmd one 64)"
crun_ run -d --bundle "$T/bundle" ct-crun </dev/null >/dev/null 2>&1 || fail "crun run failed"
wait_for "the workload to fill its device memory" 20 test -f "$T/state/one"
expect_healthy "$T/state/one"

criu_env crun_ checkpoint --image-path "$T/img" --work-path "$T/work-dump" ct-crun >"$T/checkpoint.log" 2>&1 ||
	{ cp "$T/work-dump/dump.log" "$T/dump.log" 2>/dev/null; fail "crun checkpoint failed: $(cat "$T/checkpoint.log")"; }
cp "$T/work-dump/dump.log" "$T/dump.log"
expect_summary "$T/dump.log" dump 1 "no dump summary from the plugin"
[ -f "$T/img/cuda-plugin.img" ] || fail "no cuda-plugin.img in the checkpoint"
crun_ delete -f ct-crun >/dev/null 2>&1 || true
at_dump=$(state_value "$T/state/one" iterations)
expect_still "$T/state/one"

criu_env crun_ restore -d --bundle "$T/bundle" --image-path "$T/img" --work-path "$T/work-restore" ct-crun \
	</dev/null >"$T/restore-cmd.log" 2>&1 ||
	{ cp "$T/work-restore/restore.log" "$T/restore.log" 2>/dev/null; fail "crun restore failed: $(cat "$T/restore-cmd.log")"; }
cp "$T/work-restore/restore.log" "$T/restore.log"
expect_summary "$T/restore.log" restore 1 "no restore summary"
expect_resumed "$T/state/one" "$at_dump" "checkpoint and restore with crun"
log PASS
