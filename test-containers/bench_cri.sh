#!/usr/bin/env bash
# bench.py --cri without a GPU: from a bundle laid out as scripts/gpu-bundle.sh lays it out and a CRI kit laid
# out as gpu-bundle.sh --cri lays it out (containerd 2.1 and its shim from containerd2-setup.sh, a static
# busybox, the CRI client with its messages' code), for each of ours and ours-zstd, a CUDA workload
# (cuda_memcheck, fake GPU) and a server (serve: the stand-in with serving_workload.py's command line and HTTP
# front) each as a pod's container on a containerd "node", checkpointed through the CRI, its archive pushed
# as a checkpoint image to a registry on the loopback, pulled by a second containerd, restored there in a new
# pod with the page cache dropped, and verified (the workload's data, the server's answers as before its
# checkpoint). The figures of each path are in the report, the plugin's options reached CRIU through
# /etc/criu/cuda_plugin.conf (ours-zstd's dump compressed), and the files the benchmark wrote into /etc are
# as they were before it.
source "$(dirname "$0")/lib.sh"
ct_setup runc docker-registry
FAIL_LOGS+=('work/logs/*-restore-failed.log') # CRIU's log of a restore that failed (bench_cri.py keeps it)
CD2=$CT_OUT/containerd2
[ -x "$CD2/usr/bin/containerd" ] || fail "no containerd 2.1 in $CD2: run test-containers/setup.sh"
/usr/bin/python3 -c 'import grpc_tools, h2' 2>/dev/null ||
	fail "python3-grpc-tools or python3-h2 is not installed (test-containers/setup.sh installs them)"
[ -x /bin/busybox ] || fail "no static busybox (busybox-static; test-containers/setup.sh installs it)"

B=$T/bundle K=$T/cri-kit
bench_bundle "$B"
mkdir -p "$K/bin" "$K/py"
ln -s "$CD2/usr/bin/containerd" "$CD2/usr/bin/containerd-shim-runc-v2" /bin/busybox "$K/bin/"
cp "$CT_SRC/cri/cri.py" "$K/py/"
cp "$CT_SRC/cri/containerd-node.toml" "$K/"
/usr/bin/python3 "$CT_SRC/cri/cri.py" generate "$CD2/usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto" \
	"$K/py" >"$T/gen.log" 2>&1 || fail "cannot generate the CRI client: $(cat "$T/gen.log")"

etc_digest() { for f in /etc/criu/runc.conf /etc/criu/cuda_plugin.conf; do echo "$f $(sha256sum 2>/dev/null <"$f" || echo absent)"; done; }
etc_before=$(etc_digest)
keep_etc /etc/criu/runc.conf /etc/criu/cuda_plugin.conf
# The fake GPU for the workloads (their library folder is bound into the containers) and for the plugin.
BENCH_WORK=$T/work BENCH_CRI_KIT=$K STANDIN_FRONT=$B/serving_front.py LD_LIBRARY_PATH=$(dirname "$FAKE_LIB") \
	CUDA_CRIU_LIBCUDA=$FAKE_LIB timeout 200 /usr/bin/python3 "$B/bench.py" --scenarios 1g,serve --scale 0.05 \
	--variants ours,ours-zstd --rounds 0 --cri --out "$T/out" >"$T/bench.log" 2>&1 ||
	fail "bench.py --cri failed: $(tail -5 "$T/bench.log")"
[ "$(etc_digest)" = "$etc_before" ] || fail "bench.py left /etc/criu/runc.conf or /etc/criu/cuda_plugin.conf changed"

/usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert not d["failures"], d["failures"]
rows = {c["what"]: c for c in d["cold_start"] if ": through the CRI, " in c["what"]}
assert sorted(rows) == [f"{s}: through the CRI, {v}" for s in ("1g", "serve") for v in ("ours", "ours-zstd")], sorted(rows)
for what, r in rows.items():
    for k in ("checkpoint_cmd_s", "image_push_s", "pull_s", "restore_cmd_s", "ready_s", "archive_gib", "read_gib"):
        assert isinstance(r.get(k), (int, float)) and r[k] >= 0, (what, k, r.get(k))
    assert 0 < r["pull_s"] < 60 and 0 < r["ready_s"] < 60 and abs(r["seconds"] - r["pull_s"] - r["ready_s"]) < 1e-6, r
    assert r["archive_gib"] > 0, r
    if what.startswith("1g"):  # the plugin dumped and restored the CUDA process
        assert r["procs"] == 1 and r["gpu_state_gib"] > 0 and r["restore_failed"] == 0, r
' "$T/out/results.json" || fail "results.json: $(head -c 3000 "$T/out/results.json")"
expect_log "$T/out/results.txt" "1g: through the CRI, ours-zstd +pull +[0-9.]+ \+ StartContainer to the first answer +[0-9.]+ = +[0-9.]+; CheckpointContainer" \
	"the report has no line for the path through the CRI"
expect_bench_options "$T/work/logs" cri "$T/bench.log"
log PASS
