#!/usr/bin/env bash
# Builds CRIU from Debian's source package into build/criu/<version>/install.
#
#   scripts/build-criu.sh [VERSION...]          (default: 4.2.1)
#   scripts/build-criu.sh --asan [VERSION...]   the same CRIU built with AddressSanitizer (make ASAN=1), into
#                                               build/criu-asan/<version>/install: scripts/test-sanitized.sh
#
# Each version is downloaded once (cached in build/downloads), checked against its sha256, patched with
# criu-patches/<version>/series (or criu-patches/series for the default version) and installed into a
# prefix inside the build tree, so that it never clashes with a distribution's criu. A second run with the
# same sources and patches does nothing.
#
# The source index and the tarball come from the machine's own Debian mirror (the URI of its Debian main
# entry in /etc/apt, or DEBIAN_MIRROR), through apt's proxy when apt has one.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$top/build}
jobs=${JOBS:-$(nproc)}

declare -A SHA256=(
	[4.2.1]=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
	[4.1.1]=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
)
# The Debian suite whose source index carries each version.
declare -A SUITE=([4.2.1]=sid [4.1.1]=trixie)

log() { printf '[build-criu] %s\n' "$*" >&2; }
die() { printf '[build-criu] error: %s\n' "$*" >&2; exit 1; }

patch_dir() { # the patch series applied to one version
	if [ "$1" = 4.2.1 ]; then echo "$top/criu-patches"; else echo "$top/criu-patches/$1"; fi
}

patch_list() {
	local dir; dir=$(patch_dir "$1")
	[ -f "$dir/series" ] || return 0
	grep -v -e '^#' -e '^[[:space:]]*$' "$dir/series" | sed "s|^|$dir/|"
}

# Fingerprint of everything that decides the build: the tarball and the patches (their names and contents,
# not where the checkout lies: checkouts that share a CRIU build must agree on it).
fingerprint() {
	{ echo "${SHA256[$1]}"; patch_list "$1" | xargs -r sha256sum | sed 's|  .*/|  |'; } | sha256sum | cut -d' ' -f1
}

# Our source-only apt entry (the Debian suites that carry the CRIU versions).
SRC_LIST=/etc/apt/sources.list.d/cuda-criu-src.sources

# debian_mirror [APT_DIR]: the URI of the machine's Debian main entry: the first entry, in apt's order, of
# type deb or deb-src, with component main and an http(s) URI ending in /debian (not /debian-security), in
# APT_DIR/sources.list and APT_DIR/sources.list.d/*.list, *.sources (APT_DIR: /etc/apt). Our own entry
# ($SRC_LIST) does not count: it only repeats what was found before. Prints nothing when there is none.
debian_mirror() {
	local dir=${1:-/etc/apt} f
	for f in "$dir/sources.list" "$dir"/sources.list.d/*; do
		[ -f "$f" ] && [ "$(basename "$f")" != "$(basename "$SRC_LIST")" ] || continue
		case "$f" in
		*.sources) awk '
			function flush(  n, u, i, x) {
				if (types ~ /(^| )deb(-src)?( |$)/ && comps ~ /(^| )main( |$)/ && enabled != "no") {
					n = split(uris, u, " ")
					for (i = 1; i <= n; i++) { x = u[i]; sub(/\/+$/, "", x); if (x ~ /^https?:\/\/.*\/debian$/) print x }
				}
				types = uris = comps = enabled = ""
			}
			/^[ \t]*#/ { next }
			/^[ \t]*$/ { flush(); next }
			{
				key = tolower($1); sub(/:$/, "", key); val = $0; sub(/^[^:]*:[ \t]*/, "", val)
				if (key == "types") types = val; else if (key == "uris") uris = val
				else if (key == "components") comps = val; else if (key == "enabled") enabled = tolower(val)
			}
			END { flush() }' "$f" ;;
		*.list) awk '
			$1 == "deb" || $1 == "deb-src" {
				i = 2
				if ($2 ~ /^\[/) { while (i < NF && $i !~ /\]$/) i++; i++ } # [ options ]
				uri = $i; main = 0
				for (j = i + 2; j <= NF; j++) if ($j == "main") main = 1
				sub(/\/+$/, "", uri)
				if (main && uri ~ /^https?:\/\/.*\/debian$/) print uri
			}' "$f" ;;
		esac
	done | sed -n 1p # (sed reads on: no SIGPIPE for the writers)
}

# apt_proxy URI: the proxy apt uses for URI's scheme (Acquire::http::Proxy, Acquire::https::Proxy), if any.
apt_proxy() {
	local p=""
	eval "$(apt-config shell p "Acquire::${1%%:*}::Proxy")"
	[ "$p" = DIRECT ] || echo "$p"
}

fetch() { # version -> path of the verified orig tarball
	local ver=$1 suite=${SUITE[$1]} file="criu_$1.orig.tar.xz" dest="$build/downloads"
	mkdir -p "$dest"
	if [ -f "$dest/$file" ] && echo "${SHA256[$ver]}  $dest/$file" | sha256sum -c --status; then
		echo "$dest/$file"; return
	fi
	local list=$SRC_LIST mirror=${DEBIAN_MIRROR:-$(debian_mirror)}
	[ -n "$mirror" ] || die "no Debian main entry (deb, component main, URI ending in /debian) in" \
		"/etc/apt/sources.list or /etc/apt/sources.list.d/: set DEBIAN_MIRROR (e.g. http://mirror.example.org/debian)"
	if ! grep -qs "Suites:.*$suite" "$list" || ! grep -qxs "URIs: $mirror" "$list"; then
		log "adding a source-only apt entry for $suite from $mirror ($list)"
		local suites; suites=$(sed -n 's/^Suites: //p' "$list" 2>/dev/null)
		cat >"$list" <<EOT
Types: deb-src
URIs: $mirror
Suites: $(echo $suites $suite | tr ' ' '\n' | sort -u | xargs)
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOT
		apt-get update -qq
	elif ! apt-cache showsrc criu 2>/dev/null | grep -q "criu_$ver.orig"; then
		apt-get update -qq
	fi
	# The source index gives the pool directory; the orig tarball is all we need (the matching
	# .debian.tar.xz is not used).
	local dir
	dir=$(apt-cache showsrc criu 2>/dev/null | awk -v f="$file" '
		/^Package:/ {d=""; found=0} /^Directory:/ {d=$2} index($0, " " f) {found=1}
		/^$/ && found && d {print d; exit} END {if (found && d) print d}' | head -n1)
	[ -n "$dir" ] || die "criu $ver is not in the $suite source index (apt-cache showsrc criu)"
	local proxy; proxy=$(apt_proxy "$mirror")
	log "downloading $mirror/$dir/$file${proxy:+ through $proxy}"
	curl -fsSL --retry 3 ${proxy:+--proxy "$proxy"} -o "$dest/$file.part" "$mirror/$dir/$file" ||
		die "download of $mirror/$dir/$file failed"
	echo "${SHA256[$ver]}  $dest/$file.part" | sha256sum -c --status ||
		die "$file: sha256 mismatch (expected ${SHA256[$ver]})"
	mv "$dest/$file.part" "$dest/$file"
	echo "$dest/$file"
}

# 1: build_one makes the sanitized variant (set by --asan).
asan=0

build_one() {
	local ver=$1
	[ -n "${SHA256[$ver]:-}" ] || die "unknown CRIU version $ver (known: ${!SHA256[*]})"
	local root="$build/criu/$ver" fp; fp=$(fingerprint "$ver")
	# The sanitized CRIU (CRIU's own ASAN=1: its parasite and restorer blobs, and the in-tree plugin, which
	# has flags of its own, stay uninstrumented) lies apart from build/criu, which the ordinary test runs use.
	local make_opts=()
	if [ "$asan" = 1 ]; then
		root="$build/criu-asan/$ver" fp=$(echo "$fp asan" | sha256sum | cut -d' ' -f1)
		make_opts=(ASAN=1)
	fi
	if [ -x "$root/install/sbin/criu" ] && [ "$(cat "$root/stamp" 2>/dev/null)" = "$fp" ]; then
		log "criu $ver is up to date in $root/install"; return
	fi
	local tarball; tarball=$(fetch "$ver")
	rm -rf "$root"; mkdir -p "$root"
	tar -xf "$tarball" -C "$root"
	mv "$root/criu-$ver" "$root/src"
	local p
	for p in $(patch_list "$ver"); do
		log "applying $(basename "$p")"
		patch -d "$root/src" -p1 --forward --quiet <"$p" || die "patch $p does not apply to criu $ver"
	done
	log "building criu $ver ${make_opts[*]} ($jobs jobs)"
	# The in-tree CUDA plugin is built too: it is the baseline of the benchmarks.
	make -C "$root/src" -j"$jobs" "${make_opts[@]}" criu cuda_plugin >"$root/build.log" 2>&1 ||
		{ tail -n 30 "$root/build.log" >&2; die "criu $ver build failed (log: $root/build.log)"; }
	make -C "$root/src" "${make_opts[@]}" PREFIX="$root/install" install-criu >>"$root/build.log" 2>&1 ||
		die "criu $ver install failed (log: $root/build.log)"
	install -D -m 755 "$root/src/plugins/cuda/cuda_plugin.so" "$root/install/lib/criu-intree/cuda_plugin.so"
	echo "$fp" >"$root/stamp"
	log "criu $ver installed in $root/install ($("$root/install/sbin/criu" --version | head -n1))"
}

# Sourced (the tests of debian_mirror): the functions only.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

[ "${1:-}" != --asan ] || { asan=1; shift; }
[ $# -gt 0 ] || set -- 4.2.1
"$top/scripts/install-deps.sh"
for v in "$@"; do build_one "$v"; done
