#!/usr/bin/env bash
# cuda-criu's manual: the overview lists every command; each command's page has every section, is the
# same through `help COMMAND` and `COMMAND --help`, and mentions each option the command accepts (the
# list of commands and options comes from the binary: `cuda-criu help --commands`).
source "$(dirname "$0")/lib.sh"
e2e_strict_setup

"$CUDA_CRIU" --help >"$T/overview" || fail "--help failed"
"$CUDA_CRIU" help >"$T/help" || fail "help failed"
cmp -s "$T/overview" "$T/help" || fail "--help and help differ"
for section in NAME SYNOPSIS DESCRIPTION COMMANDS "GLOBAL OPTIONS" ENVIRONMENT "EXIT STATUS" EXAMPLES; do
	grep -qx "$section" "$T/overview" || fail "overview: no $section section"
done

# Each command with a page and the options it takes, a line each, from the command table that also
# drives the parser: "check --json --require-gpu ...".
mapfile -t pages < <("$CUDA_CRIU" help --commands)
[ ${#pages[@]} -ge 14 ] || fail "help --commands lists ${#pages[@]} commands: ${pages[*]}"
for cmd in check inspect ps status lock checkpoint restore unlock suspend resume compat selftest roundtrip help; do
	printf '%s\n' "${pages[@]}" | grep -q "^$cmd\b" || fail "help --commands does not list $cmd"
done
if printf '%s\n' "${pages[@]}" | grep -q "^__"; then fail "help --commands lists an internal command"; fi
for entry in "${pages[@]}"; do
	set -- $entry
	cmd=$1
	shift
	grep -qE "^    $cmd +[a-z]" "$T/overview" || fail "overview does not list $cmd"
	"$CUDA_CRIU" help "$cmd" >"$T/$cmd.help" || fail "help $cmd failed"
	"$CUDA_CRIU" "$cmd" --help >"$T/$cmd.flag" || fail "$cmd --help failed"
	# `compat --help` is cuda-checkpoint's own usage text (it takes that tool's command line).
	if [ "$cmd" = compat ]; then
		grep -q -- "--action ACTION --pid PID" "$T/$cmd.flag" || fail "compat --help is not the cuda-checkpoint usage"
	else
		cmp -s "$T/$cmd.help" "$T/$cmd.flag" || fail "help $cmd and $cmd --help differ"
	fi
	for section in NAME SYNOPSIS DESCRIPTION OPTIONS "EXIT STATUS" EXAMPLES; do
		grep -qx "$section" "$T/$cmd.help" || fail "$cmd: no $section section"
	done
	grep -qE "^    cuda-criu $cmd - " "$T/$cmd.help" || fail "$cmd: NAME line"
	for opt in "$@"; do
		grep -q -- "$opt" "$T/$cmd.help" || fail "$cmd: page does not mention $opt"
	done
	[ "$(wc -l <"$T/$cmd.help")" -ge 12 ] || fail "$cmd: page of $(wc -l <"$T/$cmd.help") lines"
done
grep -q "or by index (this machine.s" "$T/restore.help" || fail "restore: does not say that GPU indices are accepted"
log "overview and ${#pages[@]} command pages, each complete: ok"

rc=0; "$CUDA_CRIU" help nosuch 2>"$T/err" || rc=$?
[ $rc -eq 2 ] && grep -q "no command 'nosuch'" "$T/err" || fail "help nosuch: exit $rc"
rc=0; "$CUDA_CRIU" 2>/dev/null || rc=$?
[ $rc -eq 2 ] || fail "no command: exit $rc"
"$CUDA_CRIU" --version | grep -qE '^cuda-criu [0-9]+\.[0-9]+\.[0-9]+$' || fail "--version"
log PASS
