# The benchmark's serving scenario end to end without a GPU: bench.py from a bundle laid out as
# scripts/gpu-bundle.sh lays it out, real CRIU and our plugin, and a stand-in server with
# serving_workload.py's command line, answers and HTTP front (serving_standin.py). The three starts from
# scratch to the first answer, the round trip with its restore to the first answer, warm and with the page
# cache dropped, each answer after the restore compared with the one before, the report's rows; two
# replicas restored at once from one image, each pid 1 of its own pid, mount and network namespaces
# (bench_replicas.py), each asked in its own network namespace, against two cold starts at once; the
# server in two processes (serve2); and a server whose answers change across the restore fails its round
# trip and its replicas by name.
source "$(dirname "$0")/lib.sh"
e2e_setup

B=$T/bundle
mkdir -p "$B/sbin" "$B/plugin" "$B/intree" "$B/bin"
ln -s "$CRIU" "$B/sbin/criu"
ln -s "$PLUGIN_DIR/cuda_plugin.so" "$B/plugin/cuda_plugin.so"
ln -s "$CUDA_CRIU" "$B/bin/cuda-criu"
top=$(cd "$(dirname "$0")/../.." && pwd)
cp "$top"/benchmarks/bench*.py "$B/"
cp "$top/tests/e2e/serving_standin.py" "$B/serving_workload.py"
export BENCH_WORK=$T/work STANDIN_FRONT=$top/tests/gpu/serving_workload.py

# bench_run NAME [env...]: bench.py --scenarios serve --variants ours, one round with a cold restore, into
# $T/NAME; its output in $T/NAME.log.
bench_run() {
	local name=$1
	shift
	env "$@" timeout 300 python3 "$B/bench.py" --scenarios serve --variants ours --rounds 1 --cold-rounds 1 \
		--replicas 2 --out "$T/$name" >"$T/$name.log" 2>&1 || fail "$name: bench.py failed: $(tail -5 "$T/$name.log")"
	[ -f "$T/$name/results.json" ] || fail "$name: no results.json"
}

bench_run ok
py '
runs, rows = d["runs"], {c["what"]: c for c in d["cold_start"]}
assert not d["failures"], d["failures"]
assert len(runs) == 1 and runs[0]["scenario"] == "serve", runs
r = runs[0]
for k in ("dump_s", "restore_s", "restore_to_ready_s", "restore_cold_s", "restore_cold_to_ready_s", "cold_read_gib"):
    assert isinstance(r.get(k), (int, float)), (k, r.get(k))
assert 0 < r["restore_to_ready_s"] < 60 and 0 < r["restore_cold_to_ready_s"] < 60, r
for how in ("empty compile caches", "weights in the page cache", "page cache dropped"):
    c = rows["serve: cold start, " + how]
    assert 0 < c["seconds"] < 60 and c["compile_s"] == 0.1 and "read_gib" in c, c
for how in ("image in the page cache", "page cache dropped"):
    assert rows["serve: restore to first answer, ours, " + how]["seconds"] > 0, rows
for what in ("serve: 2 replicas restored at once from one image, ours", "serve: 2 cold starts at once (warm caches)"):
    assert 0 < rows[what]["seconds"] < 60, (what, rows)
for k in ("restore_shmem_gib", "restore_shmem_after_gib"):  # what a restore holds in host memory
    assert isinstance(r.get(k), float), (k, r)
for k in ("restores_cache_gib", "restores_shmem_gib", "restores_shmem_after_gib"):
    assert isinstance(rows["serve: 2 replicas restored at once from one image, ours"].get(k), float), k
' <"$T/ok/results.json" || fail "results.json lacks figures: $(head -c 2000 "$T/ok/results.json")"
expect_log "$T/ok/results.txt" "serve: restore to first answer, ours, page cache dropped +[0-9.]+  \([0-9.]+ GiB read from disk\)" \
	"the report has no restore-to-first-answer row"
log "round trip: restore to first answer $(py 'print(round(d["runs"][0]["restore_to_ready_s"], 2))' <"$T/ok/results.json") s warm, $(py 'print(round(d["runs"][0]["restore_cold_to_ready_s"], 2))' <"$T/ok/results.json") s cold; cold starts and report rows: ok"
log "2 replicas of one image answering in $(py 'print(round({c["what"]: c for c in d["cold_start"]}["serve: 2 replicas restored at once from one image, ours"]["seconds"], 2))' <"$T/ok/results.json") s"

# The server in two processes (serve2): serving_workload.py's own front, the stand-in's engine, a Unix
# socket pair between them and the token ids in a ring in /dev/shm whose name is gone once both map it.
# Under a time limit that the round trip fits (the limit's own path through the plan).
env timeout 300 python3 "$B/bench.py" --scenarios serve2 --variants ours --rounds 1 --no-cold-starts \
	--time-limit 290 --out "$T/two" >"$T/two.log" 2>&1 || fail "serve2: bench.py failed: $(tail -5 "$T/two.log")"
py '
assert not d["failures"], d["failures"]
r = d["runs"][0]
assert r["scenario"] == "serve2" and 0 < r["restore_to_ready_s"] < 60, r
' <"$T/two/results.json" || fail "serve2: $(head -c 2000 "$T/two/results.json")"
log "a server in two processes (front and engine, socket pair, ring in /dev/shm): dumped as one tree, restored, its answers (with the ring's token ids) the same; first answer $(py 'print(round(d["runs"][0]["restore_to_ready_s"], 2))' <"$T/two/results.json") s after the restore started"

bench_run lies STANDIN_LIE_AFTER_RESTORE=1
py '
f = d["failures"]
assert len(f) == 2 and f[0]["scenario"] == "serve" and "after the restore differs" in f[0]["error"], f
assert f[1]["scenario"] == "serve (2 replicas)" and "answer" in f[1]["error"], f
assert not d["runs"], d["runs"]
' <"$T/lies/results.json" || fail "an answer changed across the restore was not caught: $(head -c 2000 "$T/lies/results.json")"
log "a server whose answer changes across the restore: its round trip and its replicas fail by name"
log PASS
