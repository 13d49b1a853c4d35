#!/usr/bin/env bash
# Runs clang-tidy (config: .clang-tidy) over the sources of plugin/ and cli/ and fails on any finding.
#   scripts/tidy.sh [BUILD_DIR] [files...]     BUILD_DIR default: build
# BUILD_DIR must hold compile_commands.json of a configured tree (cmake exports it by default here) and
# the generated protobuf-c header (build it once, or at least the cuda_criu_core target).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
build=${1:-build}
[ $# -gt 0 ] && shift
[ -f "$build/compile_commands.json" ] || { echo "no $build/compile_commands.json: configure with cmake first" >&2; exit 2; }
TIDY=${CLANG_TIDY:-$(command -v clang-tidy-14 || command -v clang-tidy || true)}
[ -n "$TIDY" ] || { echo "SKIP: no clang-tidy (apt-get install clang-tidy)"; exit 77; }

if [ $# -gt 0 ]; then
	files=("$@")
else
	mapfile -t files < <(git ls-files 'plugin/*.cpp' 'cli/*.cpp'; git ls-files --others --exclude-standard 'plugin/*.cpp' 'cli/*.cpp')
fi
# Only files the build compiles (a file being added may not be in compile_commands.json yet).
known=()
for f in "${files[@]}"; do
	if grep -q "\"file\": \"$top/$f\"" "$build/compile_commands.json"; then
		known+=("$f")
	else
		echo "tidy: $f is not in $build/compile_commands.json: not checked" >&2
	fi
done
# g++ flags clang does not know are dropped; the GCC-only warnings are g++'s business.
out=$(mktemp)
trap 'rm -f "$out"' EXIT
rc=0
"$TIDY" -p "$build" --quiet --extra-arg=-Wno-unknown-warning-option --extra-arg=-Wno-unused-command-line-argument \
	"${known[@]}" >"$out" 2>/dev/null || rc=$?
if grep -qE '(warning|error):' "$out"; then
	cat "$out"
	echo "tidy: $(grep -cE '(warning|error):' "$out") finding(s) in ${#known[@]} files" >&2
	exit 1
fi
[ $rc -eq 0 ] || { cat "$out"; echo "tidy: clang-tidy failed (exit $rc)" >&2; exit 1; }
echo "tidy: ${#known[@]} files clean"
