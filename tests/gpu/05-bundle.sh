# The bundle as a newcomer runs it (sourced by run-gpu-tests.sh: each test_NAME function is the test NAME,
# with - for _), first: with no LD_LIBRARY_PATH, on a machine that has none of CRIU's libraries, criu and
# cuda-criu run from the bundle as they are, and cuda-criu finds the criu and the plugin beside it.

# bundle_ldd FILE: the libraries FILE needs that the loader does not find, or finds elsewhere than in the
# bundle's lib/ although lib/ holds them; nothing when all is well.
bundle_ldd() {
	local name path
	env -u LD_LIBRARY_PATH ldd "$1" 2>&1 | while read -r name _ path _; do
		if [ "$path" = not ]; then
			echo "$name not found"
		elif [ -f "$bundle/lib/$name" ] && [ "$(realpath "$path")" != "$(realpath "$bundle/lib/$name")" ]; then
			echo "$name from $path"
		fi
	done
}

# sbin/criu --version and criu check run with no LD_LIBRARY_PATH; every binary and library of the bundle
# finds what lib/ holds in lib/ (ldd).
test_bundle_criu() {
	local name=bundle-criu dir=$work/bundle-criu f bad="" rc version
	mkdir -p "$dir"
	for f in "$bundle"/sbin/* "$bundle/bin/cuda-criu" "$bundle"/plugin/*.so "$bundle"/intree/*.so "$bundle"/lib/*; do
		[ -f "$f" ] || continue
		bad+=$(bundle_ldd "$f" | sed "s|^|${f#"$bundle"/}: |; s|\$|;|" | tr '\n' ' ')
	done
	[ -z "$bad" ] || { failed $name "libraries not from the bundle: $bad"; return; }
	if ! env -u LD_LIBRARY_PATH "$bundle/sbin/criu" --version >"$dir/version.txt" 2>&1; then
		failed $name "sbin/criu --version without LD_LIBRARY_PATH: $(cat "$dir/version.txt")"; return
	fi
	version=$(sed -n 's/^Version: //p' "$dir/version.txt")
	[ -n "$version" ] || { failed $name "sbin/criu --version printed no version: $(cat "$dir/version.txt")"; return; }
	# criu check may report a missing kernel feature (exit 1), but it must have run: not a loader error (127).
	env -u LD_LIBRARY_PATH "$bundle/sbin/criu" check >"$dir/check.txt" 2>&1
	rc=$?
	if [ $rc -gt 1 ] || grep -q 'error while loading shared libraries' "$dir/check.txt"; then
		failed $name "sbin/criu check without LD_LIBRARY_PATH exited $rc: $(tail -n 5 "$dir/check.txt")"; return
	fi
	passed $name "CRIU $version runs without LD_LIBRARY_PATH; criu check exit $rc: $(tail -n 1 "$dir/check.txt")"
}

# bin/cuda-criu check and selftest with no LD_LIBRARY_PATH, no --criu, no --libdir and no libdir set in
# CRIU's configuration: both name and use the bundle's sbin/criu and plugin/cuda_plugin.so.
test_bundle_cli() {
	local name=bundle-cli dir=$work/bundle-cli rc line
	local alone=(env -u LD_LIBRARY_PATH -u CRIU_LIBS_DIR -u CRIU_CONFIG_FILE HOME="$dir/home"
		CUDA_CRIU_CRIU_CONFIG_DIR="$dir/no-conf")
	mkdir -p "$dir/home" "$dir/no-conf"
	"${alone[@]}" "$bundle/bin/cuda-criu" check --runtimes none >"$dir/check.txt" 2>&1
	rc=$?
	sed 's/^/  | /' "$dir/check.txt"
	if ! awk -v b="$bundle" '$1 == "ok" && $2 == "criu" && $3 == b "/sbin/criu:" { c = 1 }
		$1 == "ok" && $2 == "plugin" && $4 == "loads" && $5 == b "/plugin/cuda_plugin.so" { p = 1 }
		END { exit !(c && p) }' "$dir/check.txt"; then
		failed $name "cuda-criu check (exit $rc) does not name both $bundle/sbin/criu and $bundle/plugin/cuda_plugin.so: $(grep -E '^[a-z]+ +(criu|plugin) ' "$dir/check.txt" | tr -s ' ')"
		return
	fi
	"${alone[@]}" timeout -k 10 600 "$bundle/bin/cuda-criu" selftest --mb 256 --dir "$dir" >"$dir/selftest.txt" 2>&1
	rc=$?
	sed 's/^/  | /' "$dir/selftest.txt" | tail -n 12
	[ $rc = 0 ] || { failed $name "cuda-criu selftest exited $rc"; return; }
	grep -E '^ok +setup ' "$dir/selftest.txt" | grep -qF "($bundle/sbin/criu), plugin $bundle/plugin/cuda_plugin.so," ||
		{ failed $name "cuda-criu selftest's setup does not name the bundle's criu and plugin"; return; }
	passed $name "cuda-criu check and selftest (256 MiB) find the bundle's criu and plugin without LD_LIBRARY_PATH"
}
