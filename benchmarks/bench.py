#!/usr/bin/env python3
"""Dump and restore GPU workloads with our cuda_plugin.so and with CRIU's in-tree CUDA plugin, side by side.

Runs on a machine with an NVIDIA GPU, from the root of the bundle that scripts/gpu-bundle.sh builds:

    python3 build/gpu-bundle/bench.py --cuda-checkpoint PATH [--rounds 3]
        [--scenarios 1g,4g,16g,4x2g,torch,coldstart] [--compare-cli] [--out DIR]

Each scenario is dumped and restored --rounds times with each plugin, alternating within a round. The
baseline is CRIU's in-tree plugin built from the same CRIU source tree, which runs the cuda-checkpoint
command line for every driver operation: with --cuda-checkpoint it runs NVIDIA's utility from that path
(public NVIDIA/cuda-checkpoint repository, bin/x86_64_Linux/cuda-checkpoint; never part of this project).
Without it the baseline runs our `cuda-criu` through its cuda-checkpoint compatible command line, and the
report says so. --compare-cli adds the in-tree plugin driving our command line as a third variant.

Figures per run: dump and restore seconds (wall time of `criu dump` / `criu restore`), split into CRIU's own
work (memory pages, files, the process tree) and the seconds spent in the CUDA plugin's hooks (device
phases, from the timestamps of CRIU's log), image size, and CRIU's peak resident memory. The workload's data
is verified after every restore. Medians, ratios (ours / baseline), results.json and bench.png go to --out
(default: $OUT or ./bench-out).
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

BUNDLE = os.path.dirname(os.path.abspath(__file__))
CRIU = os.path.join(BUNDLE, "sbin", "criu")
MEMCHECK = os.path.join(BUNDLE, "bin", "cuda_memcheck")
TORCH = os.path.join(BUNDLE, "torch_workload.py")
# variant -> CRIU's plugin directory and the folder put first in PATH (where the in-tree plugin finds the
# cuda-checkpoint command line); "in-tree" is the baseline. main() fills in the baseline's utility.
VARIANTS = {
    "ours": {"libdir": os.path.join(BUNDLE, "plugin"), "path": None},
    "in-tree": {"libdir": os.path.join(BUNDLE, "intree"), "path": os.path.join(BUNDLE, "bin")},
}
BASELINE = "in-tree"
UTILITY = {"in-tree": "CRIU's in-tree plugin driving cuda-criu (this project's cuda-checkpoint compatible command line)"}
# scenario -> (workload kind, size, CUDA processes[, extra workload arguments])
SCENARIOS = {
    "1g": ("memcheck", 1024, 1),
    "4g": ("memcheck", 4096, 1),
    "16g": ("memcheck", 16384, 1),
    "4x2g": ("memcheck", 2048, 4),
    "torch": ("torch", 4, 1),
}
# Scaling: one 4 GiB process per GPU, on 1, 2, 4 and 8 GPUs (those the machine has).
GPU_COUNTS = (1, 2, 4, 8)
SCENARIOS.update({f"{n}gpu": ("memcheck", 4096, n, ("--child-device", "spread")) for n in GPU_COUNTS})
WORK = os.environ.get("BENCH_WORK", "/var/tmp/cuda-criu-bench")
COLD_CACHE = False  # --cold-cache


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def state(path):
    try:
        with open(path) as f:
            return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    except FileNotFoundError:
        return {}


def wait_for(what, pred, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return time.monotonic()
        time.sleep(0.02)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


def reap():
    """Collects every exited child (this script is a subreaper: restored trees end up its children)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def gone(pid):
    """Gone and reaped: a zombie still holds its pid, and a restore needs that pid free."""
    reap()
    return not os.path.exists(f"/proc/{pid}")


def become_subreaper():
    import ctypes
    PR_SET_CHILD_SUBREAPER = 36
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def start(cmd, out, env=None):
    with open(out, "w") as f:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True, env=env)
    return p


def criu_env(variant):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.join(BUNDLE, "lib")
    env.update(VARIANTS[variant].get("env", {}))
    if VARIANTS[variant]["path"]:
        env["PATH"] = VARIANTS[variant]["path"] + ":" + env.get("PATH", "")
    return env


def run_criu(variant, args, timeout=900):
    """Runs criu; returns (exit code, wall seconds, peak RSS MiB)."""
    t0 = time.monotonic()
    p = subprocess.Popen([CRIU] + args, env=criu_env(variant), stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = t0 + timeout
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            p.kill()
            pid, status, usage = os.wait4(p.pid, 0)
            break
        time.sleep(0.005)
    wall = time.monotonic() - t0
    return os.waitstatus_to_exitcode(status), wall, usage.ru_maxrss / 1024


HOOK_LINE = re.compile(r"^\((\d+\.\d+)\) plugin: `cuda_plugin' hook (\d+) ")
STAMP = re.compile(r"^\((\d+\.\d+)\) (.*)$")


def device_seconds(logfile, hooks):
    """Seconds CRIU spent inside the CUDA plugin's hooks: from each 'hook N' line of CRIU's log to the next
    line that is not the plugin's own."""
    total, start_t = 0.0, None
    with open(logfile, errors="replace") as f:
        for line in f:
            m = HOOK_LINE.match(line)
            if m:
                if start_t is not None:
                    total += float(m.group(1)) - start_t
                start_t = float(m.group(1)) if int(m.group(2)) in hooks else None
                continue
            s = STAMP.match(line)
            if s and start_t is not None and "cuda_plugin" not in s.group(2):
                total += float(s.group(1)) - start_t
                start_t = None
    return total


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


class Workload:
    def __init__(self, kind, size, procs, name, extra=(), env=None):
        self.state = os.path.join(WORK, f"{name}.state")
        self.files = [self.state] + [f"{self.state}.{k}" for k in range(procs - 1)]
        for f in self.files:
            if os.path.exists(f):
                os.unlink(f)
        if kind == "memcheck":
            cmd = [MEMCHECK, "--mb", str(size), "--state", self.state, "--interval-ms", "50"]
            if procs > 1:
                cmd += ["--children", str(procs - 1)]
        else:
            cmd = [sys.executable, TORCH, "--gb", str(size), "--state", self.state, "--interval-ms", "50"]
        self.t0 = time.monotonic()
        self.proc = start(cmd + list(extra), os.path.join(WORK, f"{name}.out"), env)
        self.ready_at = wait_for(f"{name} to be ready",
                                 lambda: all(state(f).get("status") for f in self.files), 1800)
        for f in self.files:
            if state(f).get("status") != "ok":
                raise RuntimeError(f"{name}: {state(f)}")
        self.pid = self.proc.pid
        self.pids = [int(state(f)["pid"]) for f in self.files]

    def iterations(self):
        return [int(state(f).get("iterations", -1)) for f in self.files]

    def healthy_after(self, before, timeout=300):
        """Seconds until every process has done a verified iteration past `before`."""
        t = wait_for("verified iterations after the restore",
                     lambda: all(i > b for i, b in zip(self.iterations(), before)), timeout)
        for f in self.files:
            if state(f).get("status") != "ok":
                raise RuntimeError(f"data check failed after restore: {state(f)}")
        return t

    def kill(self):
        for p in self.pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_for("the workload to exit", lambda: all(gone(p) for p in self.pids), 60)


def dump_and_restore(variant, w, name):
    """Dumps the running workload w with one plugin, restores it, waits until it has verified its data
    again, then kills it. Returns the figures of that round trip."""
    img = os.path.join(WORK, "img-" + name)
    shutil.rmtree(img, ignore_errors=True)
    os.makedirs(img)
    libdir = VARIANTS[variant]["libdir"]
    rc, dump_s, dump_rss = run_criu(variant, ["dump", "-t", str(w.pid), "-D", img, "-L", libdir, "-v4", "-o", "dump.log"])
    if rc != 0:
        w.kill()
        raise RuntimeError(f"{name}: criu dump failed (exit {rc}); see {img}/dump.log")
    before = w.iterations()
    wait_for("the dumped processes to exit", lambda: all(gone(p) for p in w.pids), 60)
    image = dir_bytes(img)
    if COLD_CACHE:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    t0 = time.monotonic()
    rc, restore_s, restore_rss = run_criu(variant, ["restore", "-D", img, "-d", "-L", libdir, "-v4", "-o", "restore.log"])
    if rc != 0:
        raise RuntimeError(f"{name}: criu restore failed (exit {rc}); see {img}/restore.log")
    r = {
        "dump_s": dump_s, "restore_s": restore_s, "restore_to_ready_s": w.healthy_after(before) - t0,
        "device_dump_s": device_seconds(os.path.join(img, "dump.log"), {10, 11}),
        "device_restore_s": device_seconds(os.path.join(img, "restore.log"), {9}),
        "image_gib": image / (1 << 30), "criu_peak_mib": max(dump_rss, restore_rss),
    }
    r["criu_dump_s"] = max(0.0, r["dump_s"] - r["device_dump_s"])
    r["criu_restore_s"] = max(0.0, r["restore_s"] - r["device_restore_s"])
    w.kill()
    for logname in ("dump.log", "restore.log"):
        shutil.copy(os.path.join(img, logname), os.path.join(WORK, "logs", f"{name}-{logname}"))
    shutil.rmtree(img)
    return r


def round_trip(variant, scenario, rnd):
    kind, size, procs, *extra = SCENARIOS[scenario]
    name = f"{scenario}-{variant}-{rnd}"
    w = Workload(kind, size, procs, name, extra[0] if extra else ())
    time.sleep(0.5)
    r = {"variant": variant, "scenario": scenario, "round": rnd, **dump_and_restore(variant, w, name)}
    log(f"{name}: dump {r['dump_s']:.2f} s (device {r['device_dump_s']:.2f}), restore {r['restore_s']:.2f} s "
        f"(device {r['device_restore_s']:.2f}), image {r['image_gib']:.2f} GiB, data verified")
    return r


def cold_start(rounds, out):
    """Start-up of a PyTorch workload with an expensive start (torch.compile + CUDA graphs) from scratch,
    with empty and with warm compile caches, against restore-to-ready with each plugin. Appends to out."""
    cache = os.path.join(WORK, "inductor-cache")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=os.path.join(cache, "triton"),
               TORCHINDUCTOR_COMPILE_THREADS="1")
    compiled = ["--compile", "reduce-overhead"]
    for rnd in range(rounds):
        for caches in ("empty", "warm"):
            if caches == "empty":
                shutil.rmtree(cache, ignore_errors=True)
            w = Workload("torch", 2, 1, f"cold-{caches}-{rnd}", compiled, env)
            out.append({"what": f"cold start, {caches} caches", "round": rnd, "seconds": w.ready_at - w.t0})
            log(f"cold start with {caches} compile caches: {w.ready_at - w.t0:.2f} s")
            w.kill()
        for variant in VARIANTS:
            name = f"compiled-{variant}-{rnd}"
            ready = dump_and_restore(variant, Workload("torch", 2, 1, name, compiled, env), name)["restore_to_ready_s"]
            out.append({"what": f"restore-to-ready, {variant}", "round": rnd, "seconds": ready})
            log(f"{name}: restore-to-ready {ready:.2f} s, data verified")
    return out


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def med(rows, key):
    vals = [r[key] for r in rows]
    return statistics.median(vals) if vals else float("nan")


def report(results, cold, out_dir):
    keys = [("dump_s", "dump s"), ("criu_dump_s", "criu dump s"), ("device_dump_s", "hooks dump s"),
            ("restore_s", "restore s"), ("criu_restore_s", "criu rest. s"), ("device_restore_s", "hooks rest. s"),
            ("image_gib", "image GiB"), ("criu_peak_mib", "criu peak MiB")]
    lines = []
    head = f"{'scenario':<18}" + "".join(f"{label:>15}" for _, label in keys)
    scenarios = [s for s in SCENARIOS if any(r["scenario"] == s for r in results)]
    table = {}
    for s in scenarios:
        for v in VARIANTS:
            rows = [r for r in results if r["scenario"] == s and r["variant"] == v]
            table[(s, v)] = {k: med([r for r in rows if k in r], k) for k, _ in keys}
    for v, what in UTILITY.items():
        lines.append(f"{v}: {what}")
    lines.append(f"medians over rounds; ratio = ours / {BASELINE} (below 1: ours is faster or smaller); "
                 "criu = CRIU's own work, hooks = inside the CUDA plugin's hooks")
    lines.append(head)
    for s in scenarios:
        for v in VARIANTS:
            lines.append(f"{s + ' ' + v:<18}" + "".join(f"{table[(s, v)][k]:>15.2f}" for k, _ in keys))
        lines.append(f"{s + ' ratio':<18}" + "".join(
            f"{table[(s, 'ours')][k] / table[(s, BASELINE)][k]:>15.2f}" if table[(s, BASELINE)][k] else f"{'-':>15}"
            for k, _ in keys))
    if cold:
        lines.append("")
        lines.append("expensive start (torch.compile mode=reduce-overhead, 2 GiB): medians, seconds")
        for what in dict.fromkeys(c["what"] for c in cold):
            lines.append(f"  {what:<34} {statistics.median(c['seconds'] for c in cold if c['what'] == what):8.2f}")
    text = "\n".join(lines)
    print(text, flush=True)
    with open(os.path.join(out_dir, "results.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"runs": results, "cold_start": cold, "utilities": UTILITY,
                   "medians": {f"{s}/{v}": m for (s, v), m in table.items()}}, f, indent=1)
    plot(table, scenarios, cold, os.path.join(out_dir, "bench.png"))
    counts = [n for n in GPU_COUNTS if f"{n}gpu" in scenarios]
    if counts:
        plot_scaling(table, counts, os.path.join(out_dir, "scaling.png"))


def plot_scaling(table, counts, path):
    """Seconds against the number of GPUs (one process per GPU), ours and in-tree."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not available: no scaling plot")
        return
    panels = [("device_dump_s", "device phases of dump, s"), ("device_restore_s", "device phases of restore, s"),
              ("dump_s", "criu dump, s"), ("restore_s", "criu restore, s")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4))
    for ax, (key, title) in zip(axes, panels):
        for v in VARIANTS:
            ys = [table[(f"{n}gpu", v)][key] for n in counts]
            ax.plot(counts, ys, marker="o", label=v)
            for n, y in zip(counts, ys):
                ax.annotate(f"{y:.2f}", (n, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
        ax.set_xticks(counts)
        ax.set_xlabel("GPUs (one 4 GiB process each)")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"plot: {path}")


def plot(table, scenarios, cold, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not available: no plot")
        return
    panels = [("dump_s", "criu dump, s"), ("restore_s", "criu restore, s"), ("device_dump_s", "device phases of dump, s"),
              ("device_restore_s", "device phases of restore, s")]
    fig, axes = plt.subplots(1, len(panels) + (1 if cold else 0), figsize=(5 * (len(panels) + 1), 4.5))
    width = 0.8 / len(VARIANTS)
    for ax, (key, title) in zip(axes, panels):
        xs = range(len(scenarios))
        for i, v in enumerate(VARIANTS):
            vals = [table[(s, v)][key] for s in scenarios]
            bars = ax.bar([x + (i - (len(VARIANTS) - 1) / 2) * width for x in xs], vals, width, label=v)
            ax.bar_label(bars, fmt="%.1f", fontsize=7)
        ax.set_xticks(list(xs), scenarios)
        ax.set_title(title)
        ax.legend()
    if cold:
        ax = axes[-1]
        whats = list(dict.fromkeys(c["what"] for c in cold))
        vals = [statistics.median(c["seconds"] for c in cold if c["what"] == w) for w in whats]
        bars = ax.barh(whats, vals, color=["#999999", "#bbbbbb", "#1f77b4", "#ff7f0e"][:len(whats)])
        ax.bar_label(bars, fmt="%.1f s", fontsize=8)
        ax.set_title("expensive start: cold start vs restore-to-ready")
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"plot: {path}")


def set_utilities(nvidia, compare_cli):
    """Points the baseline at NVIDIA's utility (a folder in WORK holding a cuda-checkpoint link to it)."""
    if not nvidia:
        log("baseline: no --cuda-checkpoint given, the in-tree plugin drives our command line")
        return
    nvidia = os.path.abspath(nvidia)
    if not os.access(nvidia, os.X_OK):
        sys.exit(f"bench.py: --cuda-checkpoint {nvidia} is not an executable file")
    folder = os.path.join(WORK, "nvidia-utility")
    os.makedirs(folder, exist_ok=True)
    os.symlink(nvidia, os.path.join(folder, "cuda-checkpoint"))
    import hashlib
    with open(nvidia, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    VARIANTS[BASELINE]["path"] = folder
    UTILITY[BASELINE] = f"CRIU's in-tree plugin driving NVIDIA's cuda-checkpoint ({nvidia}, sha256 {digest}...)"
    if compare_cli:
        VARIANTS["in-tree+cuda-criu"] = {"libdir": os.path.join(BUNDLE, "intree"), "path": os.path.join(BUNDLE, "bin")}
        UTILITY["in-tree+cuda-criu"] = "CRIU's in-tree plugin driving cuda-criu (this project's command line)"
    log(f"baseline: {UTILITY[BASELINE]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scenarios", default="1g,4g,16g,4x2g,torch,coldstart")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every workload size (a quick dry run: 0.01)")
    ap.add_argument("--cuda-checkpoint", metavar="PATH",
                    help="NVIDIA's cuda-checkpoint utility, for the baseline (without it: our command line)")
    ap.add_argument("--compare-cli", action="store_true",
                    help="also run the in-tree plugin with our cuda-checkpoint compatible command line")
    ap.add_argument("--compare-copy", action="store_true",
                    help="also run ours with the GPU state read into fresh memory (CUDA_CRIU_MAP_IMAGE=off)")
    ap.add_argument("--cold-cache", action="store_true",
                    help="drop the page cache before every restore (the image is read from disk)")
    ap.add_argument("--from-json", nargs="+", metavar="FILE",
                    help="no runs: report and plot the results.json files of earlier runs together")
    args = ap.parse_args()
    if args.from_json:
        results, cold = [], []
        for path in args.from_json:
            with open(path) as f:
                data = json.load(f)
            results += data["runs"]
            cold += data["cold_start"]
            UTILITY.update(data.get("utilities", {}))
            for v in data.get("utilities", {}):
                VARIANTS.setdefault(v, {"libdir": "", "path": None})
        os.makedirs(args.out, exist_ok=True)
        report(results, cold, args.out)
        return
    for name, (kind, size, procs, *extra) in SCENARIOS.items():
        SCENARIOS[name] = (kind, max(1, int(size * args.scale)) if kind == "memcheck" else size * args.scale, procs,
                           *extra)
    if os.geteuid() != 0:
        sys.exit("bench.py: run as root (CRIU needs it)")
    become_subreaper()
    # A TERM (a time limit) still reports what was measured so far.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt("terminated")))
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(os.path.join(WORK, "logs"))
    set_utilities(args.cuda_checkpoint, args.compare_cli)
    if args.compare_copy:
        VARIANTS["ours-copy"] = dict(VARIANTS["ours"], env={"CUDA_CRIU_MAP_IMAGE": "off"})
        UTILITY["ours-copy"] = "ours with CUDA_CRIU_MAP_IMAGE=off (the GPU state read into fresh memory)"
    global COLD_CACHE
    COLD_CACHE = args.cold_cache
    if COLD_CACHE:
        log("the page cache is dropped before every restore")
    os.makedirs(args.out, exist_ok=True)
    wanted = args.scenarios.split(",")
    gpus = gpu_count()
    for s in [s for s in wanted if s.endswith("gpu") and s in SCENARIOS and SCENARIOS[s][2] > gpus]:
        log(f"{s}: skipped, this machine has {gpus} GPU(s)")
        wanted.remove(s)
    results, cold = [], []
    try:
        for rnd in range(args.rounds):
            for s in [s for s in wanted if s in SCENARIOS]:
                # Alternate which plugin goes first, so that neither always meets a cold or warm machine.
                order = list(VARIANTS) if rnd % 2 == 0 else list(reversed(VARIANTS))
                for v in order:
                    results.append(round_trip(v, s, rnd))
        if "coldstart" in wanted:
            cold_start(args.rounds, cold)
    except KeyboardInterrupt as e:
        log(f"stopped early ({e}): reporting what was measured")
    finally:
        if results or cold:
            report(results, cold, args.out)
        subprocess.run(["tar", "-czf", os.path.join(args.out, "bench-logs.tar.gz"), "-C", WORK, "logs"], check=False)


if __name__ == "__main__":
    main()
