#!/usr/bin/env bash
# The plugin's own rules (docs/hardening.md): it runs no program (no exec/system/popen/posix_spawn in its
# imports; fork only for the dump and restore guards, which run the plugin's own code and exec nothing), writes cuda-plugin.img with the permissions CRIU gives its images, and never writes
# through a symlink planted in the image directory.
source "$(dirname "$0")/lib.sh"
e2e_setup
SO=$PLUGIN_DIR/cuda_plugin.so

# 1. No way to start a program.
bad=$(nm -D --undefined-only "$SO" | awk '{print $NF}' | sed 's/@.*//' |
	grep -xE 'system|popen|vfork|posix_spawnp?|exec[lv]p?e?|execvpe|fexecve|execveat' || true)
[ -z "$bad" ] || fail "cuda_plugin.so imports functions that start programs: $bad"
log "imports no exec/system/popen/posix_spawn"

start_fake_gpu
# 2. Same permissions as CRIU's own images, whatever the umask CRIU runs with.
for mask in 022 077; do
	start_memcheck perm-$mask 16
	pid=$LAST_PID
	(umask $mask && dump "$pid" "$T/img-$mask") || fail "dump with umask $mask failed"
	wait_gone "$pid"
	ours=$(stat -c %a "$T/img-$mask/cuda-plugin.img")
	criu_mode=$(stat -c %a "$T/img-$mask/inventory.img")
	[ "$ours" = "$criu_mode" ] || fail "umask $mask: cuda-plugin.img is $ours, CRIU's inventory.img $criu_mode"
	log "umask $mask: cuda-plugin.img mode $ours, like CRIU's images"
done

# 3. A symlink planted where cuda-plugin.img goes: the dump fails saying so, the target is untouched,
# and the workload runs on.
victim=$T/victim-file
echo "do not overwrite" >"$victim"
start_memcheck symlink 16
pid=$LAST_PID
mkdir -p "$T/img-link"
ln -s "$victim" "$T/img-link/cuda-plugin.img"
if dump "$pid" "$T/img-link"; then
	fail "the dump wrote its image through a symlink"
fi
[ "$(cat "$victim")" = "do not overwrite" ] || fail "the symlink's target was written"
expect_log "$T/dump.log" "Error \(cuda_plugin\): .*cuda-plugin.img" "no plugin error naming the image file"
log "planted symlink: $(grep -E 'Error \(cuda_plugin\)' "$T/dump.log" | head -n1 | sed 's/.*Error (cuda_plugin): //')"
[ "$(cuda_state "$pid")" = running ] || fail "workload left $(cuda_state "$pid")"
expect_healthy "$STATE"
log PASS
