#!/bin/bash
# Checks that includes of our own headers go one way, as docs/architecture.md says:
#   abi -> core -> image, driver -> os -> base
# image and driver include only os and base (not each other), os only base, base nothing of ours; cli
# includes core and below, never abi. Prints each include against the rule and fails if there is one.
set -euo pipefail
root=${1:?usage: check_layers.sh SOURCE_DIR}

allowed() { # layer of the including file -> the layers it may include
	case $1 in
	abi) echo "abi core image driver os base" ;;
	core) echo "core image driver os base" ;;
	image | driver) echo "$1 os base" ;;
	os) echo "os base" ;;
	base) echo "base" ;;
	cli) echo "cli roundtrip core image driver os base" ;;
	esac
}

bad=0
checked=0
while IFS= read -r file; do
	rel=${file#"$root"/}
	case $rel in
	plugin/*) layer=$(cut -d/ -f2 <<<"$rel") ;;
	cli/*) layer=cli ;;
	esac
	ok=$(allowed "$layer")
	[ -n "$ok" ] || continue
	checked=$((checked + 1))
	while IFS=: read -r line target; do
		to=${target%%/*}
		[ "$to" != "$target" ] || continue # a header beside it, or a system header
		case $to in abi | core | image | driver | os | base | roundtrip) ;; *) continue ;; esac
		if ! grep -qw -- "$to" <<<"$ok"; then
			echo "$rel:$line: $layer includes $target (the $layer layer may include only: $ok)"
			bad=$((bad + 1))
		fi
	done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" | sed 's/^\([0-9]*\):[^"]*"\([^"]*\)".*/\1:\2/' || true)
done < <(find "$root/plugin" "$root/cli" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.c' \) | sort)

[ "$checked" -gt 0 ] || { echo "no sources found under $root"; exit 1; }
if [ "$bad" -gt 0 ]; then
	echo "$bad include(s) against the layer rule of docs/architecture.md"
	exit 1
fi
echo "checked $checked files: every include goes down the layers"
