#!/usr/bin/env bash
# bench.py --registry without a GPU: from a bundle laid out as scripts/gpu-bundle.sh lays it out, for each of
# ours and ours-zstd, a CUDA workload (cuda_memcheck, fake GPU) and a server (serve: the stand-in with
# serving_workload.py's command line and HTTP front) each in a podman container, checkpointed into a
# checkpoint image, pushed with gzip and with zstd layers to registries on the loopback, each pulled by an
# empty store at the same paths (the "second host"), restored there with the page cache dropped, and
# verified (the workload's data, the server's answers as before its checkpoint). The figures of each path through the registry are in the report, the
# plugin's options reached CRIU through /etc/criu/cuda_plugin.conf (ours-zstd's dump compressed), and the
# files the benchmark wrote into /etc are as they were before it.
source "$(dirname "$0")/lib.sh"
# bench.py is one call of 8 round trips through registries (~90 s on 2 idle cores): its own timeout bounds it.
CALL_BOUND=210
ct_setup runc podman docker-registry

B=$T/bundle
bench_bundle "$B"

# What the benchmark writes into /etc for its runs, as it is before (present or not).
etc_digest() { for f in /etc/criu/runc.conf /etc/criu/cuda_plugin.conf /etc/containers/policy.json; do echo "$f $(sha256sum 2>/dev/null <"$f" || echo absent)"; done; }
etc_before=$(etc_digest)
keep_etc /etc/criu/runc.conf /etc/criu/cuda_plugin.conf /etc/containers/policy.json
# The fake GPU for the workloads (their library folder is bound into the containers) and for the plugin.
BENCH_WORK=$T/work STANDIN_FRONT=$B/serving_front.py LD_LIBRARY_PATH=$(dirname "$FAKE_LIB") CUDA_CRIU_LIBCUDA=$FAKE_LIB \
	timeout 200 python3 "$B/bench.py" --scenarios 1g,serve --scale 0.05 --variants ours,ours-zstd --rounds 0 \
	--registry --registry-layers gzip,zstd --out "$T/out" >"$T/bench.log" 2>&1 || fail "bench.py --registry failed: $(tail -5 "$T/bench.log")"
[ "$(etc_digest)" = "$etc_before" ] ||
	fail "bench.py left /etc/criu/runc.conf, /etc/criu/cuda_plugin.conf or /etc/containers/policy.json changed"

python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert not d["failures"], d["failures"]
rows = {c["what"]: c for c in d["cold_start"] if ": through a registry, " in c["what"]}
assert sorted(rows) == [f"{s}: through a registry, {v}, {c} layers" for s in ("1g", "serve") for v in ("ours", "ours-zstd")
                        for c in ("gzip", "zstd")], sorted(rows)
for what, r in rows.items():
    for k in ("checkpoint_cmd_s", "push_s", "pull_s", "restore_cmd_s", "ready_s", "layer_gib", "image_gib", "read_gib"):
        assert isinstance(r.get(k), (int, float)) and r[k] >= 0, (what, k, r.get(k))
    assert 0 < r["pull_s"] < 60 and 0 < r["ready_s"] < 60 and abs(r["seconds"] - r["pull_s"] - r["ready_s"]) < 1e-6, r
    assert what.endswith(", " + r["layer_compression"] + " layers") and r["layer_gib"] > 0, r
    if what.startswith("1g"):  # the plugin dumped and restored the CUDA process
        assert r["procs"] == 1 and r["gpu_state_gib"] > 0 and r["restore_failed"] == 0, r
' "$T/out/results.json" || fail "results.json: $(head -c 3000 "$T/out/results.json")"
expect_log "$T/out/results.txt" "1g: through a registry, ours-zstd, zstd layers +pull +[0-9.]+ \+ restore to the first answer +[0-9.]+ = +[0-9.]+ \([0-9.]+x ours's\); layer [0-9.]+ GiB in the registry \(zstd\)" \
	"the report has no line for the path through the registry"
expect_bench_options "$T/work/logs" registry "$T/bench.log"
log PASS
