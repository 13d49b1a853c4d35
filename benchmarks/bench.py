#!/usr/bin/env python3
"""Dump and restore GPU workloads with our cuda_plugin.so and with CRIU's in-tree CUDA plugin, side by side.

Runs on a machine with an NVIDIA GPU, from the root of the bundle that scripts/gpu-bundle.sh builds:

    python3 build/gpu-bundle/bench.py --cuda-checkpoint PATH [--rounds 3]
        [--scenarios NAME,...] [--variants ours,in-tree,ours-criu:1]
        [--cold-rounds N] [--replicas N] [--registry] [--cri] [--time-limit S] [--plan] [--out DIR]

Each scenario is dumped and restored --rounds times with each variant, alternating the order from round to
round; every round trip starts its workload afresh. The baseline is CRIU's in-tree plugin built from the same
CRIU source tree, which runs the cuda-checkpoint command line for every driver operation: with
--cuda-checkpoint it runs NVIDIA's utility from that path (public NVIDIA/cuda-checkpoint repository,
bin/x86_64_Linux/cuda-checkpoint; never part of this project). Without it the baseline runs our `cuda-criu`
through its cuda-checkpoint compatible command line, and the report says so.

Variants (--variants, comma-separated; NAME:N runs NAME in the last N rounds only):
    ours               this plugin as it comes (it writes the GPU state itself: gpu-image=plugin)
    ours-criu          this plugin with CUDA_CRIU_GPU_IMAGE=criu (the GPU state in CRIU's pages images)
    ours-copy          this plugin with CUDA_CRIU_MAP_IMAGE=off (CRIU reads the pages into fresh memory)
    ours-zstd          this plugin with CUDA_CRIU_COMPRESS=zstd (the GPU image's chunks compressed, written back)
    in-tree            the baseline
    in-tree+cuda-criu  the in-tree plugin driving our cuda-checkpoint compatible command line
(--compare-gpu-image, --compare-copy and --compare-cli add the last three.)

Scenarios (--help lists every one with a line each, from add_scenario() in bench_common.py):
1g, 4g, 16g, 32g (cuda_memcheck with that much device memory), p1, p4, p16, p32 (a tree of that
many CUDA processes of 256 MiB each: growth with processes), 4x2g (a tree of 4 processes x 2 GiB),
torch (PyTorch with 4 GiB of weights), llm (an LLM server's shape: GPT-2 from GPT2Config() with random weights
and an 8 GiB KV-cache arena made with torch.zeros, answering with a greedy generation: framework_workload.py;
llm24 with a 24 GiB arena),
1gpu..8gpu (one 4 GiB process per GPU), coldstart (torch.compile start-up against restore-to-ready),
serve and serve16 (an inference server started as vLLM and SGLang start one: a Llama model of ~6 or ~16 GB
of bf16 weights read from safetensors files written once into /var/tmp, a 16 GiB KV-cache arena of zeros
(serve-kv4: 4 GiB, so that 4 replicas fit one 80 GB GPU),
torch.compile and a CUDA graph per decode batch size 1, 2, 4, 8, answering HTTP: serving_workload.py; its
restore-to-ready is the first answer, which must equal the one before the dump, as must every batch size's;
before its round trips, three starts from scratch to the first answer: empty compile caches, then warm
caches with the weights in the page cache, then with the page cache dropped, with the bytes read from disk
(--no-cold-starts: none);
serve2 (serve in two processes, as vLLM V1 and SGLang run it: an HTTP front without CUDA and the engine, a
Unix socket between them and the token ids in a ring in /dev/shm; the whole tree is dumped and restored).
--replicas N, for the serving scenarios, after their round trips: with each variant, a server started as pid 1
of its own pid, mount and network namespaces (with its own /proc) is dumped and its image restored N times at
once by plain CRIU, each replica in new namespaces (bench_replicas.py; docs/containers.md), until each replica
has answered, in its own network namespace, as the server did before its dump; what each replica holds in
memory is reported. Against it, N cold starts at once (warm caches, serving one port with SO_REUSEPORT) until
each has answered.
--registry, for each scenario of one process, after its round trips: with each variant of this plugin, the workload
in a podman container is checkpointed into a checkpoint image, pushed to a registry on the loopback, pulled by a
second podman store (a "second host"), and restored from it there with the page cache dropped after the pull;
the pull, the restore to the first answer and the layer's size and compression in the registry (bench_registry.py;
podman and docker-registry from the bundle's podman-kit.tar.xz: scripts/gpu-bundle.sh --podman); with
--registry-layers gzip,zstd the image is pushed, pulled and restored once per layer compression.
--cri, for each scenario of one process, after its round trips: Kubernetes' own path with each variant of this
plugin: the workload as a pod's container on a containerd 2 "node", CheckpointContainer, a checkpoint image of
the archive pushed to a registry on the loopback, and on a second containerd (which pulls it) a new pod whose
container is created from that image and started, which restores it, with the page cache dropped after the
pull (bench_cri.py; containerd, its shim and the CRI client from the bundle's cri-kit.tar.xz:
scripts/gpu-bundle.sh --cri).
--fragment-gib F runs everything with F GiB of memory fragmented first (bin/thp_populate --hold).
--scale multiplies every size.

Figures per run: dump and restore seconds (wall time of `criu dump` / `criu restore`), split into CRIU's own
work and the seconds spent in the CUDA plugin's hooks (from the timestamps of CRIU's log); from our plugin's
own log lines the driver's checkpoint call, the GPU image's write time, bytes written and zero share, the
restore+unlock, the GPU image's check, the memory preflight's figure and the plugin's own time per
process; the workload's peak resident memory and the page cache added while dump and restore run (sampled
every 50 ms); the image's size on disk (apparent and allocated: the GPU image
files are sparse) and where it was (disk, or a tmpfs when it would not fit); CRIU's peak resident memory; restore-to-ready. With --cold-rounds N the last N rounds
restore the same image a second time with the page cache dropped (sync, drop_caches); --cold-cache drops it
before every restore instead. The workload's data is verified after every restore. Medians, ratios
(ours / baseline), rates in GB/s, results.json (every raw figure), results.txt and the plots go to --out
(default: $OUT or ./bench-out): bench.png, restore to the first answer against a start from scratch per
variant, with the page cache warm and dropped; bench-phases.png, dump and restore by phase, the image, ratios,
GB/s per phase and replicas; growth.png and scaling.png when those scenarios ran. One colour per variant in
all of them. --from-json FILE... reports and plots earlier results without running anything; --plan prints
the plan and its expected duration and stops.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import textwrap
import time

import bench_common as C
from bench_common import (DESCRIPTIONS, GIB, KNOWN_VARIANTS, OTHER_SCENARIOS, SCENARIO_HELP, SCENARIOS, UTILITY,
                          VARIANT_ROUNDS, VARIANTS, footprint, log)
from bench_report import report
from bench_cri import through_cri
from bench_registry import through_registry
from bench_replicas import replicas
from bench_run import become_subreaper, cold_start, gpu_count, incremental_trip, round_trip, serve_cold_start


# --- the plan and its expected duration ----------------------------------------------------------------
# A model of one round trip on the H200 machine, from what was measured there (docs/benchmarks.md, the
# issue's figures): criu dump ~0.3 s + 0.96 s/GiB of image with either plugin (4 GiB: ~5 s, the LLM: ~10.6 s
# with the in-tree plugin); restore 0.6 s + 0.55 s/GiB with CRIU reading the pages, 0.8 s + 0.12 s/GiB with
# ours (mapped restore, GPU image); disk ~1.25 GB/s for the sync and the cold read; workload start-up from
# cuda_memcheck's ~2 s to transformers' ~15 s.


def estimate(scenario, variant, cold_too):
    kind, size, procs, *_ = SCENARIOS[scenario]
    gpu, image, zero = footprint(scenario)
    gpu_image = variant in ("ours", "ours-copy", "ours-zstd")
    mapped = variant in ("ours", "ours-criu")
    start_s = {"memcheck": 1.5 + 0.3 * gpu, "torch": 12 + 0.5 * size, "llm": 15.0, "serve": 40.0 + 2 * gpu}[kind]
    dump_s = 0.3 + 0.96 * image
    restore_s = 0.8 + 0.12 * image if mapped else 0.6 + 0.55 * image
    on_disk = image - gpu * zero if gpu_image else image
    t = start_s + 0.5 + dump_s + 2.0 + 0.05 * image
    sync_s = on_disk / 1.4  # the dump's image is still dirty in the page cache
    # Measured at 4 GiB: ours (mapped) 1.09 s warm, 3.41 s cold; CRIU reading the pages 3.54 s, 4.09 s.
    cold_s = restore_s + (0.5 if mapped else 0.15) * on_disk
    if C.COLD_CACHE:
        return t + sync_s + cold_s
    return t + restore_s + ((sync_s + cold_s + 1.0) if cold_too else 0.0)


def replicas_estimate(scenario, n, cold_starts=True):
    """--replicas n: per variant a start, a dump and n restores at once; then n cold starts at once."""
    return sum(estimate(scenario, v, False) + 10.0 * n for v in VARIANTS) + (60.0 + 20.0 * n if cold_starts else 0.0)


def registry_estimate(scenario, layers=1):
    """--registry: per variant of this plugin a start, a checkpoint, and per layer compression a push
    (~0.4 GB/s), a pull (~0.3 GB/s) and a cold restore."""
    gpu, image, zero = footprint(scenario)
    return sum(estimate(scenario, v, False) + layers * (estimate(scenario, v, True) - estimate(scenario, v, False)
                                                        + (image - gpu * zero) * 6.0)
               for v in VARIANTS if v.startswith("ours"))


def plan(rounds, scenarios, cold_rounds):
    """The round trips in the order they run: (round, scenario, variant, cold too). Rounds outermost, so
    that a run cut short still has whole rounds; the order of the variants alternates from round to round;
    a variant NAME:N and the second, cold restores (--cold-rounds) come in the last rounds."""
    trips = []
    for rnd in range(rounds):
        for s in scenarios:
            order = list(VARIANTS) if rnd % 2 == 0 else list(reversed(VARIANTS))
            for v in order:
                n = VARIANT_ROUNDS.get(v)
                if n is not None and rnd < rounds - n:
                    continue
                trips.append((rnd, s, v, rnd >= rounds - cold_rounds))
    return trips


def under_time_limit(trips, n, left, correction, colds):
    """Whether round trip n of plan()'s trips runs, and with its cold restore, when `left` seconds are left
    before the time limit: (runs, cold). correction(scenario): how much longer than expected its round trips
    took so far; colds: (scenario, variant) -> the cold restores it has had. The round trips of the variants
    that run every round come first: a cold restore or a variant NAME:N only runs when every such round trip
    still to come is expected to fit. A variant's first cold restore comes before another one's second: a
    second one only runs where the first ones of the other variants still to come fit too."""
    _, s, v, cold = trips[n]
    corr = correction(s)
    essential = VARIANT_ROUNDS.get(v) is None
    rest = trips[n + 1:]
    # What is left beyond the essential round trips, this one's among them.
    left_extra = left - sum(correction(t[1]) * estimate(t[1], t[2], False) for t in trips[n:]
                            if VARIANT_ROUNDS.get(t[2]) is None)

    def extra_cost(scenario, variant, c, whole):  # with a margin of 25 %
        return 1.25 * correction(scenario) * (estimate(scenario, variant, c)
                                              - (0.0 if whole else estimate(scenario, variant, False)))

    firsts = {(t[1], t[2]) for t in rest if t[3] and not colds.get((t[1], t[2]))} - {(s, v)}
    left_cold = left_extra - (sum(extra_cost(ts, tv, True, False) for ts, tv in firsts) if colds.get((s, v)) else 0.0)
    if cold and extra_cost(s, v, True, not essential) > left_cold:
        cold = False
    if (not essential and extra_cost(s, v, cold, True) > left_extra) or estimate(s, v, cold) * corr > left:
        return False, cold
    return True, cold


def print_plan(trips, rounds, coldstart, time_limit=0, replicas=0, cold_starts=True, registry=(), layers=1, cri=()):
    total = sum(estimate(s, v, c) for _, s, v, c in trips)
    log(f"plan: {len(trips)} round trip(s) (each starts its workload, dumps it, restores it"
        f"{', and restores it again from a cold page cache in the last rounds' if any(c for *_, c in trips) else ''}):")
    for s in dict.fromkeys(s for _, s, _, _ in trips):
        gpu, image, _ = footprint(s)
        parts = [f"{v}{' +cold' if c else ''} {estimate(s, v, c):.0f} s" for _, s2, v, c in trips if s2 == s]
        log(f"  {s} (~{gpu:.1f} GiB on the GPU, ~{image:.1f} GiB image): " + ", ".join(parts))
    if coldstart:
        extra = rounds * (25 + 20 * len(VARIANTS))
        log(f"  coldstart: ~{extra:.0f} s")
        total += extra
    for s in [s for s in dict.fromkeys(s for _, s, _, _ in trips) if replicas and SCENARIOS[s][0] == "serve"]:
        extra = replicas_estimate(s, replicas, cold_starts)
        against = f" against {replicas} cold starts" if cold_starts else ""
        log(f"  {s}, {replicas} replicas of one image{against}: ~{extra:.0f} s")
        total += extra
    for s in registry:
        extra = registry_estimate(s, layers)
        log(f"  {s} through a registry: ~{extra:.0f} s")
        total += extra
    for s in cri:
        extra = registry_estimate(s)
        log(f"  {s} through the CRI: ~{extra:.0f} s")
        total += extra
    log(f"expected duration: about {total / 60:.1f} min ({total:.0f} s) on the H200 machine")
    if time_limit and total > time_limit:
        essential = sum(estimate(s, v, False) for _, s, v, _ in trips if VARIANT_ROUNDS.get(v) is None)
        log(f"--time-limit {time_limit:.0f} s: the cold restores and the variants NAME:N are left out where "
            f"they would not fit; the round trips of the other variants alone: about {essential:.0f} s")
    return total


def set_utilities(nvidia):
    """Points the baseline at NVIDIA's utility (a folder in C.WORK holding a cuda-checkpoint link to it)."""
    for v in VARIANTS:
        UTILITY[v] = DESCRIPTIONS[v]
    if not nvidia:
        log("baseline: no --cuda-checkpoint given, the in-tree plugin drives our command line")
        return
    nvidia = os.path.abspath(nvidia)
    if not os.access(nvidia, os.X_OK):
        sys.exit(f"bench.py: --cuda-checkpoint {nvidia} is not an executable file")
    folder = os.path.join(C.WORK, "nvidia-utility")
    os.makedirs(folder, exist_ok=True)
    os.symlink(nvidia, os.path.join(folder, "cuda-checkpoint"))
    import hashlib
    with open(nvidia, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    if C.BASELINE in VARIANTS:
        VARIANTS[C.BASELINE] = dict(VARIANTS[C.BASELINE], path=folder)
        UTILITY[C.BASELINE] = f"CRIU's in-tree plugin driving NVIDIA's cuda-checkpoint ({nvidia}, sha256 {digest}...)"
        log(f"baseline: {UTILITY[C.BASELINE]}")


def choose_variants(args):
    """VARIANTS and VARIANT_ROUNDS from --variants and the --compare-* flags."""
    wanted = [x.strip() for x in args.variants.split(",") if x.strip()]
    wanted += [v for flag, v in ((args.compare_gpu_image, "ours-criu"), (args.compare_copy, "ours-copy"),
                                 (args.compare_cli, "in-tree+cuda-criu")) if flag]
    for item in wanted:
        name, _, n = item.partition(":")
        if name not in KNOWN_VARIANTS:
            sys.exit(f"bench.py: unknown variant {name!r} (known: {', '.join(KNOWN_VARIANTS)})")
        if name in VARIANTS:
            continue
        if n and (not n.isdigit() or int(n) < 1):
            sys.exit(f"bench.py: {item!r}: NAME:N wants a number of rounds N >= 1")
        VARIANTS[name] = dict(KNOWN_VARIANTS[name])
        VARIANT_ROUNDS[name] = min(int(n), args.rounds) if n else None


def machine_info(args):
    info = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "kernel": os.uname().release,
            "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])}
    try:
        info["gpus"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                       "--format=csv,noheader"], capture_output=True, text=True,
                                      check=False).stdout.strip().replace("\n", "; ")
    except FileNotFoundError:
        info["gpus"] = "no nvidia-smi"
    for what, path in (("thp", "/sys/kernel/mm/transparent_hugepage/enabled"),
                       ("thp_defrag", "/sys/kernel/mm/transparent_hugepage/defrag")):
        try:
            with open(path) as f:
                info[what] = f.read().strip()
        except OSError:
            pass
    info["cpus"] = os.cpu_count()
    info["scale"] = args.scale
    info["memory_limits"] = memory_limits()
    return info


def memory_limits():
    """The memory limits of this process's cgroup and of those above it, where set (cgroup v2 memory.max and
    memory.high, v1 memory.limit_in_bytes): a limit makes the kernel take back page cache long before the
    machine's memory is full."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.strip().split(":", 2) for line in f]
    except OSError:
        return {}
    where = [("/sys/fs/cgroup", p, ("memory.max", "memory.high")) for n, c, p in lines if n == "0" and not c]
    where += [("/sys/fs/cgroup/memory", p, ("memory.limit_in_bytes",)) for _, c, p in lines if c == "memory"]
    limits = {}
    for root, path, names in where:
        while True:
            for name in names:
                try:
                    with open(f"{root}{path}/{name}") as f:
                        value = f.read().strip()
                except OSError:
                    continue
                if value.isdigit() and int(value) < 1 << 60:  # v1 writes "no limit" as a huge number
                    limits[f"{path} {name}"] = int(value)
            if path in ("", "/"):
                break
            path = os.path.dirname(path.rstrip("/")) or "/"
    return limits


def hold_fragmented(gib, info):
    """bin/thp_populate --hold: gib GiB fragmented and held for the whole run (killed at its end)."""
    p = subprocess.Popen([os.path.join(C.BUNDLE, "bin", "thp_populate"), "--fragment-gib", str(gib), "--hold"],
                         stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    if not line.startswith("fragmented"):
        p.kill()
        sys.exit(f"bench.py: thp_populate --hold did not fragment memory (exit {p.wait()})")
    info["fragmented"] = line
    log(line)
    return p


def first_answers(results):
    """For the servers: restore to first answer per variant, warm and cold page cache (medians), beside their
    cold starts."""
    rows = []
    for s in dict.fromkeys(r["scenario"] for r in results if SCENARIOS.get(r["scenario"], ("",))[0] == "serve"):
        for v in VARIANTS:
            runs = [r for r in results if r["scenario"] == s and r["variant"] == v]
            for key, how, read_key in (("restore_to_ready_s", "image in the page cache", None),
                                       ("restore_cold_to_ready_s", "page cache dropped", "cold_read_gib")):
                vals = [r[key] for r in runs if key in r]
                read = [r[read_key] for r in runs if read_key in r]
                if vals:
                    rows.append({"what": f"{s}: restore to first answer, {v}, {how}", "round": 0,
                                 "seconds": statistics.median(vals), **({"read_gib": statistics.median(read)}
                                                                        if read else {})})
    return rows


def scenarios_help(width):
    """--help's list of the scenarios, one line each: from the table the run takes them from, so that the two
    always agree."""
    lines = ["scenarios (for --scenarios and --incremental):"]
    entries = {**SCENARIO_HELP, **OTHER_SCENARIOS}
    indent = 4 + max(map(len, entries))
    for name, description in entries.items():
        lines += textwrap.wrap(description, width, initial_indent=f"  {name:<{indent - 4}}  ",
                               subsequent_indent=" " * indent, break_on_hyphens=False)
    return "\n".join(lines)


def main():
    # The text as argparse would wrap it, and the scenarios' list one entry a line (argparse would run it on).
    width = max(40, shutil.get_terminal_size().columns - 2)
    ap = argparse.ArgumentParser(description=textwrap.fill(__doc__.splitlines()[0], width),
                                 epilog=scenarios_help(width), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scenarios", default="4g,4x2g,llm",
                    help="comma-separated names from the list of scenarios below (default: %(default)s)")
    ap.add_argument("--variants", default="ours,in-tree",
                    help="comma-separated, in order: ours, ours-criu, ours-copy, ours-zstd, in-tree (the baseline), "
                    "in-tree+cuda-criu; NAME:N runs NAME in the last N rounds only (default: %(default)s)")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every workload size (a quick dry run: 0.01)")
    ap.add_argument("--cuda-checkpoint", metavar="PATH",
                    help="NVIDIA's cuda-checkpoint utility, for the baseline (without it: our command line)")
    ap.add_argument("--compare-cli", action="store_true",
                    help="also run the in-tree plugin with our cuda-checkpoint compatible command line")
    ap.add_argument("--compare-copy", action="store_true",
                    help="also run ours with the GPU state read into fresh memory (CUDA_CRIU_MAP_IMAGE=off)")
    ap.add_argument("--compare-gpu-image", action="store_true",
                    help="also run ours with CUDA_CRIU_GPU_IMAGE=criu (variant ours-criu: the GPU state in CRIU's "
                    "pages images, as before the GPU image)")
    ap.add_argument("--cold-cache", action="store_true",
                    help="drop the page cache before every restore (the image is read from disk)")
    ap.add_argument("--cold-rounds", type=int, default=0, metavar="N",
                    help="in the last N rounds, restore each image a second time with the page cache dropped "
                    "(warm and cold restores from one run)")
    ap.add_argument("--time-limit", type=float, default=0, metavar="SECONDS",
                    help="start no round trip that is not expected to end within this many seconds of the start "
                    "(cold restores are left out first, each variant's second before another's first); the report "
                    "comes within it")
    ap.add_argument("--incremental", default="", metavar="SCENARIOS",
                    help="after the round trips, for each of these scenarios and variants: a full dump left "
                    "running, then a dump against it (--track-mem --prev-images-dir), its restore verified")
    ap.add_argument("--fragment-gib", type=float, default=0, metavar="F",
                    help="run everything with F GiB of memory fragmented first and held (bin/thp_populate --hold: "
                    "the free memory in 4 KiB holes, as on a host that has run a long time)")
    ap.add_argument("--replicas", type=int, default=0, metavar="N",
                    help="for the serving scenarios: N replicas restored at once from one image, against N cold "
                    "starts at once")
    ap.add_argument("--registry", action="store_true",
                    help="for each scenario of one process: its checkpoint image through a registry, pulled and "
                    "restored by a second podman store with the page cache dropped (each variant of this plugin)")
    ap.add_argument("--registry-layers", default="gzip", metavar="LIST",
                    help="with --registry: the layer compressions to push the image with, each pulled and restored "
                    "on its own (podman push --compression-format: gzip, podman's default, and zstd)")
    ap.add_argument("--cri", action="store_true",
                    help="for each scenario of one process: Kubernetes' path through containerd 2's CRI, checkpointed "
                    "on one node, its checkpoint image pulled and restored in a new pod on another (each variant of "
                    "this plugin)")
    ap.add_argument("--no-cold-starts", action="store_true",
                    help="the serving scenarios without their starts from scratch: neither the three of the round "
                    "trips nor the N at once of --replicas (their round trips and replicas only)")
    ap.add_argument("--plan", action="store_true", help="print the round trips and the expected duration, then stop")
    ap.add_argument("--from-json", nargs="+", metavar="FILE",
                    help="no runs: report and plot the results.json files of earlier runs together")
    args = ap.parse_args()
    if args.from_json:
        results, cold, failures = [], [], []
        for path in args.from_json:
            with open(path) as f:
                data = json.load(f)
            results += data["runs"]
            cold += data.get("cold_start", [])
            failures += data.get("failures", [])
            UTILITY.update(data.get("utilities", {}))
            C.BASELINE = data.get("baseline", C.BASELINE)
        for r in results:
            VARIANTS.setdefault(r["variant"], KNOWN_VARIANTS.get(r["variant"], {"libdir": "", "path": None}))
        os.makedirs(args.out, exist_ok=True)
        report(results, cold, args.out, failures, f"from {', '.join(args.from_json)}")
        return
    for name, (kind, size, procs, *extra) in SCENARIOS.items():
        SCENARIOS[name] = (kind, max(1, int(size * args.scale)) if kind != "torch" else size * args.scale, procs,
                           *extra)
    choose_variants(args)
    C.COLD_CACHE = args.cold_cache
    wanted = [s for s in args.scenarios.split(",") if s]
    known = [*SCENARIOS, *OTHER_SCENARIOS]
    unknown = [s for s in wanted + args.incremental.split(",") if s and s not in known]
    if unknown:
        sys.exit(f"bench.py: unknown scenario(s) {', '.join(unknown)} (known: {', '.join(known)})")
    if args.replicas > 0 and not any(SCENARIOS.get(s, ("",))[0] == "serve" for s in wanted):
        serving = ", ".join(s for s, (kind, *_) in SCENARIOS.items() if kind == "serve")
        sys.exit(f"bench.py: --replicas needs a serving scenario ({serving}) in --scenarios")
    cold_rounds = min(max(0, args.cold_rounds), args.rounds)
    registry = [s for s in wanted if args.registry and s in SCENARIOS and SCENARIOS[s][2] == 1]
    if args.registry and not registry:
        sys.exit("bench.py: --registry needs a scenario of one process in --scenarios")
    cri = [s for s in wanted if args.cri and s in SCENARIOS and SCENARIOS[s][2] == 1]
    if args.cri and not cri:
        sys.exit("bench.py: --cri needs a scenario of one process in --scenarios")
    layers = [x for x in args.registry_layers.split(",") if x]
    if not layers or any(x not in ("gzip", "zstd") for x in layers):
        sys.exit(f"bench.py: --registry-layers {args.registry_layers}: a list of gzip and zstd")
    if args.plan:
        trips = plan(args.rounds, [s for s in wanted if s in SCENARIOS], cold_rounds)
        print_plan(trips, args.rounds, "coldstart" in wanted, args.time_limit, args.replicas, not args.no_cold_starts,
                   registry, len(layers), cri)
        return
    if os.geteuid() != 0:
        sys.exit("bench.py: run as root (CRIU needs it)")
    t_start = time.monotonic()
    if args.time_limit:
        C.DEADLINE = t_start + args.time_limit - 10
    become_subreaper()
    # A TERM (a time limit) still reports what was measured so far.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt("terminated")))
    shutil.rmtree(C.WORK, ignore_errors=True)
    os.makedirs(os.path.join(C.WORK, "logs"))
    set_utilities(args.cuda_checkpoint)
    if C.COLD_CACHE:
        log("the page cache is dropped before every restore")
    os.makedirs(args.out, exist_ok=True)
    gpus = gpu_count()
    for s in [s for s in wanted if s.endswith("gpu") and s in SCENARIOS and SCENARIOS[s][2] > gpus]:
        log(f"{s}: skipped, this machine has {gpus} GPU(s)")
        wanted.remove(s)
    info = machine_info(args)
    fragmenter = hold_fragmented(args.fragment_gib, info) if args.fragment_gib > 0 else None
    log(f"machine: {info.get('gpus')}; kernel {info['kernel']}; THP {info.get('thp', '?')}"
        + "".join(f"; {k} {v / GIB:.1f} GiB" for k, v in info["memory_limits"].items()))
    trips = plan(args.rounds, [s for s in wanted if s in SCENARIOS], cold_rounds)
    print_plan(trips, args.rounds, "coldstart" in wanted, args.time_limit, args.replicas, not args.no_cold_starts,
               registry, len(layers), cri)
    results, cold, failures = [], [], []
    done = {}  # scenario -> [expected, measured] seconds of its round trips so far
    colds = {}  # (scenario, variant) -> its cold restores so far
    reserve = 20.0  # the report, the plot and the logs' archive

    def correction(scenario):
        """Measured against expected so far, for this scenario (else all): how far to trust the model."""
        est, act = done.get(scenario) or [sum(x) for x in zip([0.0, 0.0], *done.values())]
        return min(3.0, max(0.7, act / est)) if est else 1.0
    try:
        for s in [s for s in wanted if s in SCENARIOS and SCENARIOS[s][0] == "serve" and not args.no_cold_starts]:
            try:
                serve_cold_start(s, cold)
            except Exception as e:  # noqa: BLE001
                log(f"{s} cold start: FAILED: {e}")
                failures.append({"scenario": s, "variant": "cold start", "round": 0, "error": str(e)})
        for n, (rnd, s, v, cold_too) in enumerate(trips):
            corr = correction(s)
            elapsed = time.monotonic() - t_start
            if args.time_limit:
                left = args.time_limit - elapsed - reserve
                wanted_cold = cold_too
                runs, cold_too = under_time_limit(trips, n, left, correction, colds)
                if wanted_cold and not cold_too and runs:
                    log(f"{s} {v} round {rnd}: no cold restore, not enough time left before the time limit")
                if not runs:
                    log(f"{s} {v} round {rnd}: skipped, expected {estimate(s, v, cold_too) * corr:.0f} s, "
                        f"{max(0.0, left):.0f} s left before the time limit")
                    failures.append({"scenario": s, "variant": v, "round": rnd, "error": "skipped: time limit"})
                    continue
            rest = sum(correction(t[1]) * estimate(*t[1:]) for t in trips[n:])
            log(f"[{n + 1}/{len(trips)}] {s} {v} round {rnd}{' (+ cold restore)' if cold_too else ''}; "
                f"{elapsed:.0f} s so far, ~{rest:.0f} s to go")
            try:
                r = round_trip(v, s, rnd, cold_too)
            except Exception as e:  # noqa: BLE001 (one failed round trip does not end the run)
                log(f"{s} {v} round {rnd}: FAILED: {e}")
                failures.append({"scenario": s, "variant": v, "round": rnd, "error": str(e)})
                continue
            results.append(r)
            colds[(s, v)] = colds.get((s, v), 0) + bool(cold_too)
            d = done.setdefault(s, [0.0, 0.0])
            d[0] += estimate(s, v, cold_too)
            d[1] += r["trip_s"]
        if "coldstart" in wanted:
            cold_start(args.rounds, cold)
        for s in [s for s in wanted if args.replicas > 0 and SCENARIOS.get(s, ("",))[0] == "serve"]:
            try:
                replicas(s, args.replicas, cold, failures, not args.no_cold_starts)
            except Exception as e:  # noqa: BLE001
                log(f"{s} cold starts at once: FAILED: {e}")
                failures.append({"scenario": f"{s} ({args.replicas} cold starts)", "variant": "cold start",
                                 "round": 0, "error": str(e)})
        for s in registry:
            try:
                through_registry(s, layers, cold, failures)
            except Exception as e:  # noqa: BLE001
                log(f"{s} through a registry: FAILED: {e}")
                failures.append({"scenario": f"{s} (registry)", "variant": "all", "round": 0, "error": str(e)})
        for s in cri:
            try:
                through_cri(s, cold, failures)
            except Exception as e:  # noqa: BLE001
                log(f"{s} through the CRI: FAILED: {e}")
                failures.append({"scenario": f"{s} (CRI)", "variant": "all", "round": 0, "error": str(e)})
        for s in [x for x in args.incremental.split(",") if x]:
            for rnd in range(args.rounds):
                for v in VARIANTS:
                    try:
                        results.append(incremental_trip(v, s, rnd))
                    except Exception as e:  # noqa: BLE001
                        log(f"{s} {v} incremental round {rnd}: FAILED: {e}")
                        failures.append({"scenario": s + " (incremental)", "variant": v, "round": rnd, "error": str(e)})
    except KeyboardInterrupt as e:
        log(f"stopped early ({e}): reporting what was measured")
    finally:
        cold += first_answers(results)
        info["elapsed_s"] = round(time.monotonic() - t_start, 1)
        if results or cold or failures:
            report(results, cold, args.out, failures,
                   f"machine: {info.get('gpus')}; kernel {info['kernel']}; THP {info.get('thp', '?')}; "
                   f"{info['elapsed_s']:.0f} s in all" + (f"; {info['fragmented']}" if "fragmented" in info else ""))
            with open(os.path.join(args.out, "results.json")) as f:
                data = json.load(f)
            data["meta"] = info
            with open(os.path.join(args.out, "results.json"), "w") as f:
                json.dump(data, f, indent=1)
        if fragmenter:
            fragmenter.kill()
            fragmenter.wait()
        subprocess.run(["tar", "-czf", os.path.join(args.out, "bench-logs.tar.gz"), "-C", C.WORK, "logs"], check=False)
        log(f"done in {time.monotonic() - t_start:.0f} s; results in {args.out}")


if __name__ == "__main__":
    main()