#!/usr/bin/env bash
# benchmarks/bench.py under --time-limit (under_time_limit, no run): every variant's round trips come first,
# then the cold restores, and a variant's first cold restore before another one's second (a run cut by its
# time limit once gave one variant both its cold restores and the other none).
#
#   bench_time_limit.sh PATH/TO/bench.py
set -euo pipefail
bench=${1:?usage: bench_time_limit.sh PATH/TO/bench.py}
python3 - "$bench" <<'PY'
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[1])))
import bench  # noqa: E402
import bench_common as C  # noqa: E402

for v in ("ours", "ours-zstd"):
    C.VARIANTS[v] = C.KNOWN_VARIANTS[v]
    C.VARIANT_ROUNDS[v] = None
trips = bench.plan(3, ["serve"], 2)
assert [(r, v, c) for r, _, v, c in trips] == [
    (0, "ours", False), (0, "ours-zstd", False), (1, "ours-zstd", True), (1, "ours", True),
    (2, "ours", True), (2, "ours-zstd", True)], trips
same = lambda s: 1.0  # noqa: E731 (every round trip as long as expected)
warm = {v: bench.estimate("serve", v, False) for v in C.VARIANTS}
extra = {v: 1.25 * (bench.estimate("serve", v, True) - warm[v]) for v in C.VARIANTS}
failures = []


def expect(what, got, want):
    if got != want:
        failures.append(f"{what}: {got}, expected {want}")


# Trip 4 (round 2, ours, cold): its own warm time and the last trip's (ours-zstd's) are kept first.
enough = warm["ours"] + warm["ours-zstd"] + extra["ours"] + extra["ours-zstd"] + 1.0
expect("time for both", bench.under_time_limit(trips, 4, enough, same, {}), (True, True))
tight = warm["ours"] + warm["ours-zstd"] + extra["ours"] + 1.0
expect("ours' first cold restore", bench.under_time_limit(trips, 4, tight, same, {}), (True, True))
# Its second, where ours-zstd's first would no longer fit after it: ours runs warm, ours-zstd gets its cold one.
expect("ours' second cold restore", bench.under_time_limit(trips, 4, tight, same, {("serve", "ours"): 1}),
       (True, False))
# Where ours-zstd has had its cold restore, nothing is held back for it.
expect("ours' second, ours-zstd done",
       bench.under_time_limit(trips, 4, tight, same, {("serve", "ours"): 1, ("serve", "ours-zstd"): 1}),
       (True, True))
# Never a round trip that cannot fit, nor one that would take an essential one's time.
expect("no time at all", bench.under_time_limit(trips, 4, 10.0, same, {}), (False, False))
expect("slower than expected", bench.under_time_limit(trips, 4, enough, lambda s: 3.0, {}), (False, False))


def run(limit, correction=same):
    """The whole plan against a clock where each round trip takes what it was expected to."""
    left, colds, ran = limit, {}, []
    for n, (_, s, v, _) in enumerate(trips):
        runs, cold = bench.under_time_limit(trips, n, left, correction, colds)
        if runs:
            left -= bench.estimate(s, v, cold)
            colds[(s, v)] = colds.get((s, v), 0) + cold
            ran.append((v, cold))
    return left, colds, ran


all_warm = sum(bench.estimate(s, v, False) for _, s, v, _ in trips)
for spare in (0.0, 1.0, 1.3, 2.0, 3.0):  # time for about this many cold restores beyond the round trips
    left, colds, ran = run(all_warm + spare * sum(extra.values()) / 2 + 1.0)
    expect(f"{spare} cold restores' time: every round trip runs", len(ran), len(trips))
    expect(f"{spare} cold restores' time: within the limit", left >= 0, True)
    if spare >= 2.0:
        expect(f"{spare} cold restores' time: each variant has one", sorted(colds.values())[0] >= 1, True)
    expect(f"{spare} cold restores' time: never one variant's second before another's first",
           max(colds.values(), default=0) - min([colds.get(("serve", v), 0) for v in C.VARIANTS]) <= 1, True)
if failures:
    print("FAIL\n  " + "\n  ".join(failures))
    sys.exit(1)
print("PASS: cold restores go to the variants that have none first")
PY
