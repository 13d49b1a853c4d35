#!/usr/bin/env bash
# The plugin exports exactly CR_PLUGIN_DESC, links no libcuda and no C++ runtime (libzstd, a C library, for
# the GPU image's compression), and needs nothing
# from CRIU at link time (CRIU's functions are looked up at run time).
set -euo pipefail
so=$1
fail=0
exported=$(nm -D --defined-only "$so" | awk '{print $3}' | sort)
if [ "$exported" != "CR_PLUGIN_DESC" ]; then
	echo "FAIL: exported symbols: $(echo $exported)"; fail=1
fi
needed=$(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort | xargs)
for lib in $needed; do
	case $lib in
	libc.so.6 | libm.so.6 | ld-linux-*.so.* | libprotobuf-c.so.1 | libzstd.so.1) ;;
	*) echo "FAIL: unexpected NEEDED $lib"; fail=1 ;;
	esac
done
# Undefined symbols must all come from those libraries: none from CRIU, none from libcuda.
undef=$(nm -D --undefined-only "$so" | awk '$1 == "U" {print $2}' | grep -v -E '@(GLIBC|LIBPROTOBUF_C)_|^ZSTD_' || true)
if [ -n "$undef" ]; then
	echo "FAIL: undefined symbols not from libc, protobuf-c or zstd: $(echo $undef)"; fail=1
fi
[ $fail -eq 0 ] && echo "symbols ok: exports CR_PLUGIN_DESC only; needs $needed"
exit $fail
