#!/usr/bin/env bash
# cuda-criu check: the lines and the JSON, on a machine without a GPU (no driver), with the fake GPU,
# with patched and stock CRIU, with our plugin, CRIU's own plugin and none, and a broken option file.
source "$(dirname "$0")/lib.sh"
e2e_strict_setup

# py CODE < JSON: runs CODE with the parsed document in d (and fails on a document that does not parse).
status_of() { py "print([c['status'] for c in d['checks'] if c['name'] == '$1'][0])" <"$2"; }
# The runtime lines depend on the machine's runtimes; section 8 checks them, the others leave them out.
CHECK=("$CUDA_CRIU" check --criu "$CRIU" --libdir "$PLUGIN_DIR" --runtimes none)
CRIU_ROOT=$(cd "$(dirname "$CRIU")/.." && pwd) # install prefix of CRIU: lib/criu-intree has CRIU's own plugin

# 1. No driver at all (the library path names nothing): driver checks warn, unless --require-gpu.
if [ ! -d /proc/driver/nvidia/gpus ]; then
	rc=0
	env -u CUDA_CRIU_LIBCUDA LD_LIBRARY_PATH=/nonexistent "${CHECK[@]}" --json >"$T/nogpu.json" || rc=$?
	[ $rc -eq 0 ] || fail "check without a GPU exited $rc: $(cat "$T/nogpu.json")"
	[ "$(status_of driver "$T/nogpu.json")" = warn ] || fail "no driver: not a warning"
	py "assert d['driver'] is None and d['gpus'] == [], d" <"$T/nogpu.json" || fail "no driver: JSON facts"
	py "assert d['result'] == 'warn', d['result']" <"$T/nogpu.json" || fail "no driver: result is not warn"
	rc=0
	env -u CUDA_CRIU_LIBCUDA LD_LIBRARY_PATH=/nonexistent "${CHECK[@]}" --require-gpu >"$T/nogpu.txt" || rc=$?
	[ $rc -eq 1 ] || fail "--require-gpu without a GPU exited $rc"
	grep -qE '^fail +driver +cannot load libcuda.so.1' "$T/nogpu.txt" || fail "--require-gpu: $(cat "$T/nogpu.txt")"
	grep -qE '^      hint: install the NVIDIA driver' "$T/nogpu.txt" || fail "--require-gpu: no hint"
	log "no GPU: driver warns, --require-gpu fails: ok"
else
	log "this machine has an NVIDIA GPU: the no-GPU part is skipped"
fi

# 2. The fake GPU with two devices, patched CRIU, our plugin: no failure, every GPU listed.
start_fake_gpu --gpus 2
"${CHECK[@]}" >"$T/fake.txt" || fail "check with the fake GPU failed: $(cat "$T/fake.txt")"
grep -vE '^(ok|warn|fail)  ' "$T/fake.txt" | grep -vE '^      hint: |^result: ' &&
	fail "lines not in the form 'ok|warn|fail  name  detail'"
for name in driver checkpoint-api gpu0 gpu1 criu criu-device-hooks criu-patch plugin plugin-options privileges \
	kernel ptrace; do
	grep -qE "^ok +$name " "$T/fake.txt" || fail "check '$name' is not ok: $(grep " $name " "$T/fake.txt")"
done
grep -qE '^ok +gpu0 +GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12} NVIDIA Fake H200, 16.0 GiB' \
	"$T/fake.txt" || fail "gpu0 line: $(grep gpu0 "$T/fake.txt")"
grep -qE '^ok +criu +.*: CRIU 4\.2\.1$' "$T/fake.txt" || fail "criu version line"
"${CHECK[@]}" --json >"$T/fake.json" || fail "check --json failed"
# The thp line follows this machine's setting (section 9); every other check is ok.
py "thp = [c for c in d['checks'] if c['name'] == 'thp'][0]
assert all(c['status'] == 'ok' for c in d['checks'] if c['name'] != 'thp'), d['checks']
assert d['result'] == thp['status'], (d['result'], thp)
assert [g['ordinal'] for g in d['gpus']] == [0, 1], d['gpus']
assert all(g['free_bytes'] == 0 for g in d['gpus']), d['gpus']  # unknown: the fake has no NVML
assert all(g['uuid'].startswith('GPU-') and g['memory_bytes'] == 16 << 30 for g in d['gpus']), d['gpus']
assert d['driver']['checkpoint_api'] is True and d['driver']['cuda_version'] == '13.0', d['driver']
assert d['criu']['version'] == '4.2.1' and d['criu']['device_hooks'] and d['criu']['patched'], d['criu']
assert all(c['hint'] is None for c in d['checks'] if c['status'] == 'ok')" <"$T/fake.json" || fail "check --json content"
log "fake GPU: every check ok (thp aside), JSON parses and holds the GPUs and CRIU: ok"
# With NVML (the fake one): each GPU's free memory.
LD_LIBRARY_PATH=$FAKE_NVML_DIR FAKENVML_FREE=$((5 << 30)) "${CHECK[@]}" >"$T/nvml.txt" || fail "check with NVML failed"
grep -qE '^ok +gpu1 +GPU-.* NVIDIA Fake H200, 16.0 GiB \(5.0 GiB free\), ' "$T/nvml.txt" || fail "gpu1 line with NVML: $(grep gpu1 "$T/nvml.txt")"
LD_LIBRARY_PATH=$FAKE_NVML_DIR FAKENVML_FREE=$((5 << 30)) "${CHECK[@]}" --json |
	py "assert [g['free_bytes'] for g in d['gpus']] == [5 << 30] * 2, d['gpus']" || fail "check --json with NVML"
log "fake GPU with NVML: free memory per GPU: ok"

# 3. A driver without the checkpoint API (the fake's old/libcuda.so.1, CUDA 12.4) fails.
rc=0
CUDA_CRIU_LIBCUDA=$(dirname "$FAKE_LIB")/old/libcuda.so.1 "${CHECK[@]}" >"$T/old.txt" || rc=$?
[ $rc -eq 1 ] || fail "old driver: exit $rc"
grep -qE '^ok +driver +.*CUDA 12\.4' "$T/old.txt" || fail "old driver: driver line"
grep -qE '^fail +checkpoint-api +the driver lacks cuCheckpointProcessLock' "$T/old.txt" || fail "old driver: api line"
grep -qE '^      hint: .*r570' "$T/old.txt" || fail "old driver: no hint"
log "driver without the checkpoint API: fail with a hint: ok"

# 4. Stock CRIU 4.1.1 (if built): ok with a warning about the missing patch.
CRIU411=$CRIU_ROOT/../../4.1.1/install/sbin/criu
if [ -x "$CRIU411" ]; then
	"$CUDA_CRIU" check --criu "$CRIU411" --libdir "$PLUGIN_DIR" --json >"$T/stock.json" || fail "stock CRIU: check failed"
	[ "$(status_of criu-patch "$T/stock.json")" = warn ] || fail "stock CRIU: criu-patch is not a warning"
	py "assert d['criu']['version'] == '4.1.1' and d['criu']['patched'] is False, d['criu']" <"$T/stock.json" ||
		fail "stock CRIU: JSON"
	log "stock CRIU 4.1.1: criu-patch warns: ok"
fi

# 5. Plugin directories: CRIU's own cuda_plugin.so is told apart from ours; a missing one fails.
rc=0
"$CUDA_CRIU" check --criu "$CRIU" --libdir "$CRIU_ROOT/lib/criu-intree" >"$T/intree.txt" || rc=$?
[ $rc -eq 1 ] || fail "CRIU's own plugin: exit $rc"
grep -qE "^fail +plugin +.*is CRIU's own CUDA plugin" "$T/intree.txt" || fail "CRIU's own plugin: $(grep plugin "$T/intree.txt")"
# A directory name with a quote, a newline and a byte that is not UTF-8 still gives valid JSON.
odd="$T/odd\"dir"$'\n'$'\xff'
mkdir -p "$odd"
rc=0
"$CUDA_CRIU" check --criu "$CRIU" --libdir "$odd" --json >"$T/odd.json" || rc=$?
[ $rc -eq 1 ] || fail "empty plugin directory: exit $rc"
py "c = [c for c in d['checks'] if c['name'] == 'plugin'][0]
assert c['status'] == 'fail' and 'odd\"dir\n\ufffd' in c['detail'] and c['hint'], c" <"$T/odd.json" ||
	fail "escaping in --json: $(cat "$T/odd.json")"
log "plugin checks (ours, CRIU's own, none) and JSON escaping: ok"

# 6. A broken option file fails plugin-options, naming the file and the line.
printf 'lock-timeout = 5\nparallel = lots\n' >"$T/bad.conf"
rc=0
CUDA_CRIU_CONFIG=$T/bad.conf "${CHECK[@]}" >"$T/badconf.txt" || rc=$?
[ $rc -eq 1 ] || fail "bad option file: exit $rc"
grep -qE "^fail +plugin-options +$T/bad.conf:2: parallel" "$T/badconf.txt" || fail "bad option file: $(grep options "$T/badconf.txt")"
log "broken option file: fail naming file and line: ok"

# 7. Usage errors exit 2.
rc=0; "$CUDA_CRIU" check --bogus 2>"$T/usage.err" || rc=$?
[ $rc -eq 2 ] && grep -q "unknown option '--bogus'" "$T/usage.err" || fail "check --bogus: exit $rc"
rc=0; "$CUDA_CRIU" check --runtimes runc,docker 2>"$T/usage.err" || rc=$?
[ $rc -eq 2 ] && grep -q "unknown runtime 'docker'" "$T/usage.err" || fail "check --runtimes docker: exit $rc"
# --containerd naming nothing: the line fails, naming what was given (containerd_cri checks a real one).
rc=0; "${CHECK[@]}" --containerd "$T/no-containerd.sock" >"$T/ctrd.txt" || rc=$?
[ $rc -eq 1 ] && grep -qE "^fail +runtime-containerd +--containerd $T/no-containerd.sock: No such file" "$T/ctrd.txt" ||
	fail "check --containerd with nothing there: exit $rc: $(cat "$T/ctrd.txt")"

# 8. Runtimes: whether the CRIU each one runs loads our plugin, and the fix when not. CRIU's
# configuration is a private directory (CUDA_CRIU_CRIU_CONFIG_DIR, in place of /etc/criu), $HOME and
# $CRIU_CONFIG_FILE; criu is found through PATH, as the runtimes find it.
mkdir -p "$T/etc-criu" "$T/bin" "$T/home/.criu" "$T/empty"
ln -s "$CRIU" "$T/bin/criu"
# rt NAME [VAR=value...]: check --runtimes NAME in that environment; its JSON in $T/rt.json.
rt() {
	local name=$1
	shift
	env -u CRIU_LIBS_DIR -u CRIU_CONFIG_FILE HOME="$T/no-home" PATH="$T/bin:$PATH" \
		CUDA_CRIU_CRIU_CONFIG_DIR="$T/etc-criu" "$@" \
		"$CUDA_CRIU" check --criu "$CRIU" --libdir "$PLUGIN_DIR" --runtimes "$name" --json >"$T/rt.json" ||
		fail "check --runtimes $name: $(cat "$T/rt.json")"
}
# expect_rt NAME STATUS SOURCE_REGEX [DETAIL_REGEX]: the check line and JSON entry of NAME in $T/rt.json.
expect_rt() {
	NAME=$1 STATUS=$2 SOURCE=$3 DETAIL=${4:-.} py "import os, re
c = [c for c in d['checks'] if c['name'] == 'runtime-' + os.environ['NAME']][0]
r = [r for r in d['runtimes'] if r['name'] == os.environ['NAME']][0]
assert re.fullmatch(os.environ['STATUS'], c['status']), c
assert re.search(os.environ['SOURCE'], r['libdir_source']), r
assert re.search(os.environ['DETAIL'], c['detail']), c
assert (c['status'] == 'ok') == r['loads_plugin'] and (c['hint'] is None) == (c['status'] == 'ok'), (c, r)" \
		<"$T/rt.json" || fail "runtime-$1: expected $2 ($3, ${4:-}): $(cat "$T/rt.json")"
}
if [ -x /usr/sbin/runc ] || [ -x /usr/bin/runc ]; then
	# Will load: libdir from $CRIU_CONFIG_FILE, from $HOME/.criu/default.conf, or $CRIU_LIBS_DIR.
	echo "libdir $PLUGIN_DIR" >"$T/ours.conf"
	rt runc CRIU_CONFIG_FILE="$T/ours.conf"
	expect_rt runc ok "^libdir in \\\$CRIU_CONFIG_FILE $T/ours.conf\$" "loads $PLUGIN_DIR/cuda_plugin.so"
	py "assert d['runtimes'][0]['plugin_dir'] == '$PLUGIN_DIR', d['runtimes']" <"$T/rt.json" || fail "plugin_dir"
	echo "libdir=$PLUGIN_DIR # ours" >"$T/home/.criu/default.conf"
	rt runc HOME="$T/home"
	expect_rt runc ok "^libdir in $T/home/.criu/default.conf\$"
	rt runc CRIU_LIBS_DIR="$PLUGIN_DIR"
	expect_rt runc ok '^\$CRIU_LIBS_DIR$'
	# Will not load: the runtime's own file (runc.conf) is parsed last and wins over $CRIU_CONFIG_FILE.
	echo "libdir $T/empty" >"$T/etc-criu/runc.conf"
	rt runc CRIU_CONFIG_FILE="$T/ours.conf"
	expect_rt runc warn "^libdir in $T/etc-criu/runc.conf\$" "will not load cuda_plugin.so: no cuda_plugin.so in $T/empty"
	py "h = [c for c in d['checks'] if c['name'] == 'runtime-runc'][0]['hint']
assert 'install cuda_plugin.so into $T/empty' in h and '$T/etc-criu/runc.conf' in h, h" <"$T/rt.json" ||
		fail "runc: the fix does not name the directory and runc.conf"
	# CRIU's own plugin is not ours; and a libdir set anywhere hides $CRIU_LIBS_DIR.
	echo "libdir $CRIU_ROOT/lib/criu-intree" >"$T/etc-criu/runc.conf"
	rt runc CRIU_LIBS_DIR="$PLUGIN_DIR"
	expect_rt runc warn 'runc.conf$' "is CRIU's own CUDA plugin"
	# No criu in PATH: runc cannot checkpoint at all.
	echo "libdir $PLUGIN_DIR" >"$T/etc-criu/runc.conf"
	rt runc PATH=/nonexistent
	expect_rt runc warn 'runc.conf$' "no criu in PATH"
	log "runtime-runc: loads (CRIU_CONFIG_FILE, HOME, CRIU_LIBS_DIR), runc.conf wins, CRIU's own plugin, no criu: ok"
fi
if [ -x /usr/bin/crun ] && ! crun --version | grep -q +CRIU; then
	rt crun
	expect_rt crun warn '^$' "built without CRIU .*: it cannot checkpoint"
	log "runtime-crun: a crun without CRIU cannot checkpoint: ok"
fi
if command -v podman >/dev/null; then
	# podman passes no environment to CRIU: $CRIU_CONFIG_FILE never counts.
	rm -f "$T/etc-criu/runc.conf"
	rt podman CRIU_CONFIG_FILE="$T/ours.conf"
	case "$(podman info --format '{{.Host.OCIRuntime.Name}}')" in
	runc) expect_rt podman warn "^CRIU's default" "run by podman" ;;
	crun) expect_rt podman warn "" "crun .*run by podman" ;;
	esac
	log "runtime-podman: its OCI runtime, without the caller's environment: ok"
fi
if command -v containerd >/dev/null; then
	rt containerd
	case "$(containerd --version | awk '{print $3}')" in
	v1.* | 1.*) expect_rt containerd "ok|warn" "" "only ctr and nerdctl checkpoint" ;;
	*) expect_rt containerd "ok|warn" "" "its CRI (checkpoints for the kubelet|is disabled)" ;;
	esac
	log "runtime-containerd: its version and its runc: ok"
fi

# 9. Transparent huge pages: the mode that applies to PMD-sized pages (the per-size control unless it
# inherits), read here from sysfs as well; ok unless never (the plugin puts the driver's buffer on huge
# pages itself), else a warning saying that madvise is enough. huge-pages=off: a warning whatever the mode.
# The lines and JSON of section 2.
THP=/sys/kernel/mm/transparent_hugepage
if [ -r $THP/enabled ]; then
	sel() { sed -n 's/.*\[\(.*\)\].*/\1/p' "$1"; }
	mode=$(sel $THP/enabled)
	pmd_file=$THP/hugepages-$(($(cat $THP/hpage_pmd_size) / 1024))kB/enabled
	if [ -r "$pmd_file" ] && [ "$(sel "$pmd_file")" != inherit ]; then mode=$(sel "$pmd_file"); else pmd_file=$THP/enabled; fi
	if [ "$mode" != never ]; then
		grep -qE "^ok +thp +transparent huge pages $mode( \(.*\))?: the plugin puts each dumped process's checkpoint buffer on huge pages and populates it with [0-9]+ threads$" \
			"$T/fake.txt" || fail "thp line ($mode): $(grep -A1 ' thp ' "$T/fake.txt")"
	else
		grep -qE "^warn +thp +transparent huge pages never( \(.*\))?: the plugin populates the driver's checkpoint buffer" \
			"$T/fake.txt" || fail "thp line (never): $(grep -A1 ' thp ' "$T/fake.txt")"
		grep -A1 -E '^warn +thp ' "$T/fake.txt" | grep -qF "echo madvise > $pmd_file" ||
			fail "thp hint: $(grep -A1 ' thp ' "$T/fake.txt")"
	fi
	MODE=$mode py "import os
c = [c for c in d['checks'] if c['name'] == 'thp'][0]
t, mode = d['thp'], os.environ['MODE']
assert t['effective'] == mode and t['enabled'] in ('always', 'madvise', 'never'), t
assert set(t) == {'enabled', 'defrag', 'pmd_size_enabled', 'effective'}, t
assert c['status'] == ('warn' if mode == 'never' else 'ok'), c
assert mode != 'never' or 'echo madvise > /sys/kernel/mm/transparent_hugepage/' in c['hint'], c" <"$T/fake.json" ||
		fail "thp in --json: $(cat "$T/fake.json")"
	CUDA_CRIU_HUGE_PAGES=off "${CHECK[@]}" >"$T/off.txt" 2>&1 || true
	grep -A1 -E '^warn +thp +huge-pages off: ' "$T/off.txt" | grep -qF "CUDA_CRIU_HUGE_PAGES" ||
		fail "thp with huge-pages off: $(grep -A1 ' thp ' "$T/off.txt")"
	log "thp: $mode, reported as this machine has it, madvise named where never, huge-pages=off warned: ok"
else
	py "assert d['thp'] is None and [c for c in d['checks'] if c['name'] == 'thp'][0]['status'] == 'warn'" \
		<"$T/fake.json" || fail "thp without THP in the kernel"
	log "thp: no transparent huge pages in this kernel: warn: ok"
fi
# The other modes, from made-up files mounted over the THP directory in a mount namespace of the check's
# own (the machine's setting is never touched). fake_thp NAME ENABLED [PMD_SIZE_ENABLED]: the JSON in
# $T/thp-NAME.json, the lines in $T/thp-NAME.txt.
fake_thp() {
	local d=$T/thp-$1
	mkdir -p "$d"
	if [ -n "$2" ]; then
		printf '%s\n' "$2" >"$d/enabled"
		echo "always defer defer+madvise [madvise] never" >"$d/defrag"
	fi
	if [ -n "${3:-}" ]; then
		echo 2097152 >"$d/hpage_pmd_size"
		mkdir -p "$d/hugepages-2048kB"
		printf '%s\n' "$3" >"$d/hugepages-2048kB/enabled"
	fi
	local f
	for f in json txt; do
		unshare -m --propagation private sh -c 'mount --bind "$1" '$THP' && shift && exec "$@"' sh "$d" \
			"${CHECK[@]}" $([ $f = json ] && echo --json) >"$T/thp-$1.$f" || return 1
	done
}
if [ -d $THP ] && fake_thp probe "[always] madvise never" 2>/dev/null; then
	thp_is() { # NAME STATUS EFFECTIVE HINT_PART...: the thp check and JSON of fake_thp NAME
		local name=$1 status=$2 effective=$3
		shift 3
		STATUS=$status EFFECTIVE=$effective HINTS=$(printf '%s\n' "$@") py "import os
c = [c for c in d['checks'] if c['name'] == 'thp'][0]
assert c['status'] == os.environ['STATUS'], c
assert (d['thp'] or {}).get('effective') == (os.environ['EFFECTIVE'] or None), d['thp']
assert all(h in (c['hint'] or '') for h in os.environ['HINTS'].splitlines()), c" <"$T/thp-$name.json" ||
			fail "thp $name: $(cat "$T/thp-$name.json")"
	}
	fake_thp always "[always] madvise never"
	thp_is always ok always
	grep -qE "^ok +thp +transparent huge pages always \(defrag madvise\): the plugin puts each dumped process's checkpoint buffer on huge pages and populates it with [0-9]+ threads$" \
		"$T/thp-always.txt" || fail "thp always: $(grep -A1 ' thp ' "$T/thp-always.txt")"
	fake_thp madvise "always [madvise] never"
	thp_is madvise ok madvise
	fake_thp never "always madvise [never]" "always [inherit] madvise never"
	thp_is never warn never "echo madvise > $THP/enabled" "the Debian and Ubuntu default" "1.1-1.2 s this way"
	py "assert d['thp'] == {'enabled': 'never', 'defrag': 'madvise', 'pmd_size_enabled': 'inherit', 'effective': 'never'}, d['thp']" \
		<"$T/thp-never.json" || fail "thp never: JSON facts"
	# The PMD size's own control overrides enabled, either way, and is the file the hint names.
	fake_thp pmd-never "[always] madvise never" "always inherit madvise [never]"
	thp_is pmd-never warn never "echo madvise > $THP/hugepages-2048kB/enabled"
	grep -qE "^warn +thp +transparent huge pages never \($THP/hugepages-2048kB/enabled; enabled: always; defrag madvise\): " \
		"$T/thp-pmd-never.txt" || fail "thp pmd-never: $(grep -A1 ' thp ' "$T/thp-pmd-never.txt")"
	fake_thp pmd-always "always [madvise] never" "[always] inherit madvise never"
	thp_is pmd-always ok always
	# No THP in the kernel (no files): a warning that says so, and no facts.
	fake_thp none ""
	thp_is none warn "" CONFIG_TRANSPARENT_HUGEPAGE
	grep -qE "^warn +thp +open $THP/enabled: No such file or directory: the plugin populates the driver's checkpoint buffer with [0-9]+ threads, on small pages$" "$T/thp-none.txt" ||
		fail "thp none: $(grep -A1 ' thp ' "$T/thp-none.txt")"
	log "thp from made-up files: always and madvise ok; never and a PMD-size never warn naming madvise; no THP warns: ok"
else
	log "cannot mount over $THP in a mount namespace: the made-up THP modes are skipped"
fi

# 10. Run from a bundle's layout (PREFIX/bin/cuda-criu, PREFIX/sbin/criu, PREFIX/plugin/), with no criu in
# PATH and no libdir set: check names the criu and the plugin beside it; --criu, --libdir and
# $CRIU_LIBS_DIR still win over them.
bundle_layout "$T/bundle"
mkdir -p "$T/no-conf" "$T/empty"
in_bundle() {
	env -u CRIU_LIBS_DIR -u CRIU_CONFIG_FILE HOME="$T/no-home" PATH=/usr/bin:/bin CUDA_CRIU_CRIU_CONFIG_DIR="$T/no-conf" \
		"$@" "$T/bundle/bin/cuda-criu" check --runtimes none >"$T/bundle.txt" 2>&1 || true
}
in_bundle
grep -qE "^ok +criu +$T/bundle/sbin/criu: CRIU 4\.2\.1\$" "$T/bundle.txt" || fail "bundle: criu line: $(cat "$T/bundle.txt")"
grep -qE "^ok +plugin +criu loads $T/bundle/plugin/cuda_plugin.so \(beside cuda-criu, for criu -L" "$T/bundle.txt" ||
	fail "bundle: plugin line: $(grep -A1 ' plugin ' "$T/bundle.txt")"
in_bundle CRIU_LIBS_DIR="$T/empty"
grep -qE "^fail +plugin +no cuda_plugin.so in $T/empty \(\\\$CRIU_LIBS_DIR\)" "$T/bundle.txt" ||
	fail "bundle with CRIU_LIBS_DIR: plugin line: $(grep ' plugin ' "$T/bundle.txt")"
env PATH=/usr/bin:/bin "$T/bundle/bin/cuda-criu" check --runtimes none --criu "$CRIU" --libdir "$T/empty" >"$T/bundle.txt" 2>&1 || true
grep -qE "^ok +criu +$CRIU: " "$T/bundle.txt" && grep -qE "^fail +plugin +no cuda_plugin.so in $T/empty \(criu -L\)" "$T/bundle.txt" ||
	fail "bundle with --criu and --libdir: $(grep -E ' (criu|plugin) ' "$T/bundle.txt")"
log "from a bundle's layout: its criu and plugin found beside cuda-criu; --criu, --libdir, CRIU_LIBS_DIR still win: ok"
log PASS
