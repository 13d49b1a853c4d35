#!/usr/bin/env python3
"""Dump and restore GPU workloads with our cuda_plugin.so and with CRIU's in-tree CUDA plugin, side by side.

Runs on a machine with an NVIDIA GPU, from the root of the bundle that scripts/gpu-bundle.sh builds:

    python3 build/gpu-bundle/bench.py --cuda-checkpoint PATH [--rounds 3]
        [--scenarios 1g,4g,16g,4x2g,torch,llm,coldstart] [--variants ours,in-tree,ours-criu:1]
        [--cold-rounds N] [--time-limit S] [--plan] [--out DIR]

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
    in-tree            the baseline
    in-tree+cuda-criu  the in-tree plugin driving our cuda-checkpoint compatible command line
(--compare-gpu-image, --compare-copy and --compare-cli add the last three.)

Scenarios: 1g, 4g, 16g (cuda_memcheck with that much device memory), 4x2g (a tree of 4 processes x 2 GiB),
torch (PyTorch with 4 GiB of weights), llm (an LLM server's shape: GPT-2 from GPT2Config() with random weights
and an 8 GiB KV-cache arena made with torch.zeros, answering with a greedy generation: framework_workload.py),
1gpu..8gpu (one 4 GiB process per GPU), coldstart (torch.compile start-up against restore-to-ready).
--scale multiplies every size.

Figures per run: dump and restore seconds (wall time of `criu dump` / `criu restore`), split into CRIU's own
work and the seconds spent in the CUDA plugin's hooks (from the timestamps of CRIU's log); from our plugin's
own log lines the driver's checkpoint call, the GPU image's write time, bytes written and zero share, the
restore+unlock and the GPU image's check; the image's size on disk (apparent and allocated: the GPU image
files are sparse); CRIU's peak resident memory; restore-to-ready. With --cold-rounds N the last N rounds
restore the same image a second time with the page cache dropped (sync, drop_caches); --cold-cache drops it
before every restore instead. The workload's data is verified after every restore. Medians, ratios
(ours / baseline), rates in GB/s, results.json (every raw figure), results.txt and bench.png go to --out
(default: $OUT or ./bench-out). --from-json FILE... reports earlier results without running anything;
--plan prints the plan and its expected duration and stops.
"""
import argparse
import json
import math
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
FRAMEWORK = os.path.join(BUNDLE, "framework_workload.py")
# Every variant there is: CRIU's plugin directory, the folder put first in PATH (where the in-tree plugin finds
# the cuda-checkpoint command line) and the environment of criu. main() fills in the baseline's utility and
# picks VARIANTS, in order, from --variants.
KNOWN_VARIANTS = {
    "ours": {"libdir": os.path.join(BUNDLE, "plugin"), "path": None},
    "ours-criu": {"libdir": os.path.join(BUNDLE, "plugin"), "path": None, "env": {"CUDA_CRIU_GPU_IMAGE": "criu"}},
    "ours-copy": {"libdir": os.path.join(BUNDLE, "plugin"), "path": None, "env": {"CUDA_CRIU_MAP_IMAGE": "off"}},
    "in-tree": {"libdir": os.path.join(BUNDLE, "intree"), "path": os.path.join(BUNDLE, "bin")},
    "in-tree+cuda-criu": {"libdir": os.path.join(BUNDLE, "intree"), "path": os.path.join(BUNDLE, "bin")},
}
DESCRIPTIONS = {
    "ours": "this plugin (gpu-image=plugin: it writes the GPU state itself, zero chunks skipped)",
    "ours-criu": "this plugin with CUDA_CRIU_GPU_IMAGE=criu (the GPU state in CRIU's pages images)",
    "ours-copy": "this plugin with CUDA_CRIU_MAP_IMAGE=off (the GPU state read into fresh memory)",
    "in-tree": "CRIU's in-tree plugin driving cuda-criu (this project's cuda-checkpoint compatible command line)",
    "in-tree+cuda-criu": "CRIU's in-tree plugin driving cuda-criu (this project's command line)",
}
VARIANTS = {}       # name -> KNOWN_VARIANTS entry, in the order of --variants
VARIANT_ROUNDS = {}  # name -> the number of last rounds it runs in (None: all)
BASELINE = "in-tree"
UTILITY = {}        # name -> description, for the report
# scenario -> (workload kind, size, CUDA processes[, extra workload arguments]); sizes: MiB for memcheck and
# llm (the KV-cache arena), GiB for torch.
SCENARIOS = {
    "1g": ("memcheck", 1024, 1),
    "4g": ("memcheck", 4096, 1),
    "16g": ("memcheck", 16384, 1),
    "4x2g": ("memcheck", 2048, 4),
    "torch": ("torch", 4, 1),
    "llm": ("llm", 8192, 1),
}
# Scaling: one 4 GiB process per GPU, on 1, 2, 4 and 8 GPUs (those the machine has).
GPU_COUNTS = (1, 2, 4, 8)
SCENARIOS.update({f"{n}gpu": ("memcheck", 4096, n, ("--child-device", "spread")) for n in GPU_COUNTS})
WORK = os.environ.get("BENCH_WORK", "/var/tmp/cuda-criu-bench")
COLD_CACHE = False  # --cold-cache
DEADLINE = None  # --time-limit: no wait goes past this (time.monotonic()), so that the report still comes
GIB = 1 << 30
# Machine limits of the H200 machine (docs design.md, section 2), GB/s: to compare the phases' rates with.
LIMITS = [
    ("first touch, 1 thread", 1.9), ("first touch, 16 threads", 12.2),
    ("one file per thread, 16 threads", 13.1), ("O_DIRECT disk", 1.25),
]
LIMITS_TEXT = ("machine limits (design.md section 2), GB/s: first touch of fresh memory 1.9 / 6.3 / 9.5 / 12.2 at "
               "1 / 4 / 8 / 16 threads; buffered writes, one file per thread 2.8 / 10.0 / 11.8 / 13.1, into one "
               "file ~3.0-3.4; O_DIRECT to the disk ~1.2-1.3 (a cold image is read back at about that rate); "
               "the driver's checkpoint ~1.2-1.7, its restore ~4-4.5")


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def state(path):
    try:
        with open(path) as f:
            return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    except FileNotFoundError:
        return {}


def bounded(timeout):
    return min(timeout, max(1.0, DEADLINE - time.monotonic())) if DEADLINE else timeout


def wait_for(what, pred, timeout):
    timeout = bounded(timeout)
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


def run_criu(variant, args, timeout=240):
    """Runs criu; returns (exit code, wall seconds, peak RSS MiB)."""
    t0 = time.monotonic()
    p = subprocess.Popen([CRIU] + args, env=criu_env(variant), stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = t0 + bounded(timeout)
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


# Our plugin's own lines in CRIU's log (plugin/core/dump_session.cpp: summary() and store_gpu_image();
# restore_session.cpp: summary()). Sizes are human_bytes(): "%.1f MiB" below 1 GiB, else "%.1f GiB".
_SIZE = r"([\d.]+) (MiB|GiB)"
DUMP_SUMMARY = re.compile(r"cuda_plugin: dump: (\d+) CUDA process\(es\), " + _SIZE +
                          r" of GPU state, lock ([\d.]+) s, checkpoint ([\d.]+) s \(wall")
GPU_IMAGE_LINE = re.compile(r"GPU image: " + _SIZE + r" of GPU state, " + _SIZE + r" written \(([\d.]+)% zero "
                            r"pages\) into (\d+) file\(s\) in ([\d.]+) s, ([\d.]+) GB/s")
GPU_IN_CRIU = re.compile(r"GPU state in CRIU's pages images \((.*)\)\s*$")
RESTORE_SUMMARY = re.compile(r"cuda_plugin: restore: (\d+) CUDA process\(es\), (\d+) failed, restore\+unlock "
                             r"([\d.]+) s \(wall, all processes\); driver load ([\d.]+) s")
GPU_CHECKED = re.compile(r"GPU image checked in ([\d.]+) s")


def _gib(value, unit):
    return float(value) / (1024 if unit == "MiB" else 1)


def parse_dump_log(logfile):
    """Our plugin's figures from a dump log; {} for the in-tree plugin's."""
    r = {}
    with open(logfile, errors="replace") as f:
        for line in f:
            m = DUMP_SUMMARY.search(line)
            if m:
                r.update(procs=int(m.group(1)), gpu_state_gib=_gib(m.group(2), m.group(3)),
                         lock_s=float(m.group(4)), checkpoint_s=float(m.group(5)))
            m = GPU_IMAGE_LINE.search(line)
            if m and "write_s" not in r:
                r.update(gpu_image_gib=_gib(m.group(1), m.group(2)), written_gib=_gib(m.group(3), m.group(4)),
                         zero_pct=float(m.group(5)), gpu_files=int(m.group(6)), write_s=float(m.group(7)),
                         write_gbps=float(m.group(8)), gpu_image="plugin")
            m = GPU_IN_CRIU.search(line)
            if m and "gpu_image" not in r:
                r["gpu_image"] = "criu: " + m.group(1)
    return r


def parse_restore_log(logfile, suffix=""):
    r = {}
    with open(logfile, errors="replace") as f:
        for line in f:
            m = RESTORE_SUMMARY.search(line)
            if m:
                r.update({f"restore_failed{suffix}": int(m.group(2)), f"restore_unlock{suffix}_s": float(m.group(3)),
                          f"driver_load{suffix}_s": float(m.group(4))})
                c = GPU_CHECKED.search(line)
                if c:
                    r["gpu_check" + suffix + "_s"] = float(c.group(1))
    return r


GPU_FILE = re.compile(r"^cuda-gpu(-\d+)?\.img$")


def image_sizes(path):
    """GiB on disk: the whole image apparent (file sizes) and allocated (blocks: the GPU image files are
    sparse), and the GPU image files (cuda-gpu*.img) alone."""
    sizes = {"image_gib": 0.0, "image_alloc_gib": 0.0, "gpu_files_gib": 0.0, "gpu_files_alloc_gib": 0.0}
    for d, _, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(d, name))
            apparent, alloc = st.st_size / GIB, st.st_blocks * 512 / GIB
            sizes["image_gib"] += apparent
            sizes["image_alloc_gib"] += alloc
            if GPU_FILE.match(name):
                sizes["gpu_files_gib"] += apparent
                sizes["gpu_files_alloc_gib"] += alloc
    return sizes


def drop_page_cache():
    """Writes every dirty page back and drops the page cache; returns the seconds it took."""
    t0 = time.monotonic()
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    return time.monotonic() - t0


class Workload:
    def __init__(self, kind, size, procs, name, extra=(), env=None):
        self.state = os.path.join(WORK, f"{name}.state")
        self.files = [self.state] + [f"{self.state}.{k}" for k in range(procs - 1)]
        self.clear_state()
        if kind == "memcheck":
            cmd = [MEMCHECK, "--mb", str(size), "--state", self.state, "--interval-ms", "50"]
            if procs > 1:
                cmd += ["--children", str(procs - 1)]
        elif kind == "llm":
            cmd = [sys.executable, FRAMEWORK, "transformers", "--config", "gpt2", "--kv-mb", str(size),
                   "--state", self.state, "--interval-ms", "50"]
            env = dict(env or os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                       TRANSFORMERS_VERBOSITY="error")
        else:
            cmd = [sys.executable, TORCH, "--gb", str(size), "--state", self.state, "--interval-ms", "50"]
        self.t0 = time.monotonic()
        self.out = os.path.join(WORK, f"{name}.out")
        self.proc = start(cmd + list(extra), self.out, env)
        self.pids = [self.proc.pid]
        self.ready_at = wait_for(f"{name} to be ready",
                                 lambda: all(state(f).get("status") for f in self.files) or
                                 self.proc.poll() is not None, 600)
        for f in self.files:
            if state(f).get("status") != "ok":
                code = self.proc.poll()
                self.kill()
                raise RuntimeError(f"{name}: {state(f) or 'no state file'} (exit {code}; output in {self.out})")
        self.pid = self.proc.pid
        self.pids = [int(state(f)["pid"]) for f in self.files]

    def clear_state(self):
        for f in self.files:
            if os.path.exists(f):
                os.unlink(f)

    def iterations(self):
        return [int(state(f).get("iterations", -1)) for f in self.files]

    def healthy_after(self, before, timeout=120):
        """Seconds until every process has done a verified iteration past `before`."""
        t = wait_for("verified iterations after the restore",
                     lambda: all(i > b for i, b in zip(self.iterations(), before)) or
                     any(state(f).get("status", "ok") != "ok" for f in self.files), timeout)
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


def restore(variant, w, img, logname, before):
    """criu restore of img; returns (wall s, hooks s, peak RSS MiB, restore-to-ready s)."""
    libdir = VARIANTS[variant]["libdir"]
    t0 = time.monotonic()
    rc, secs, rss = run_criu(variant, ["restore", "-D", img, "-d", "-L", libdir, "-v4", "-o", logname])
    if rc != 0:
        raise RuntimeError(f"criu restore failed (exit {rc}); see {logname}")
    ready = w.healthy_after(before) - t0
    return secs, device_seconds(os.path.join(img, logname), {9}), rss, ready


def dump_and_restore(variant, w, name, cold_too=False):
    """Dumps the running workload w with one variant, restores it, waits until it has verified its data
    again, then kills it; with cold_too restores the same image once more with the page cache dropped.
    Returns the figures of that round trip."""
    img = os.path.join(WORK, "img-" + name)
    shutil.rmtree(img, ignore_errors=True)
    os.makedirs(img)
    libdir = VARIANTS[variant]["libdir"]
    r = {}
    try:
        rc, dump_s, dump_rss = run_criu(variant, ["dump", "-t", str(w.pid), "-D", img, "-L", libdir, "-v4",
                                                  "-o", "dump.log"])
        if rc != 0:
            raise RuntimeError(f"criu dump failed (exit {rc}); see {name}-dump.log")
        before = w.iterations()
        wait_for("the dumped processes to exit", lambda: all(gone(p) for p in w.pids), 60)
        # The state files as the dump left them: put back before the cold restore (a workload that keeps
        # its state file open needs it there, at its size, and its progress is judged from these values).
        at_dump = {f: open(f, "rb").read() for f in w.files if os.path.exists(f)}
        r.update(dump_s=dump_s, device_dump_s=device_seconds(os.path.join(img, "dump.log"), {10, 11}))
        r["criu_dump_s"] = max(0.0, dump_s - r["device_dump_s"])
        r.update(parse_dump_log(os.path.join(img, "dump.log")))
        r.update(image_sizes(img))
        if COLD_CACHE:
            r["sync_s"] = drop_page_cache()
        r["cold_cache"] = COLD_CACHE
        restore_s, device_s, restore_rss, ready = restore(variant, w, img, "restore.log", before)
        r.update(restore_s=restore_s, device_restore_s=device_s, criu_restore_s=max(0.0, restore_s - device_s),
                 restore_to_ready_s=ready, criu_peak_mib=max(dump_rss, restore_rss))
        r.update(parse_restore_log(os.path.join(img, "restore.log")))
        w.kill()
        if cold_too and not COLD_CACHE:
            # The same image again, read from the disk: its processes' pids are free again.
            try:
                for f, data in at_dump.items():
                    with open(f, "r+b" if os.path.exists(f) else "wb") as out:
                        out.write(data)
                        out.truncate(len(data))
                r["sync_s"] = drop_page_cache()
                restore_s, device_s, restore_rss, ready = restore(variant, w, img, "restore-cold.log", before)
                r.update(restore_cold_s=restore_s, device_restore_cold_s=device_s,
                         criu_restore_cold_s=max(0.0, restore_s - device_s), restore_cold_to_ready_s=ready)
                r.update(parse_restore_log(os.path.join(img, "restore-cold.log"), "_cold"))
            except Exception as e:  # noqa: BLE001 (the warm figures stand)
                r["cold_error"] = str(e)
                log(f"{name}: the restore with the page cache dropped failed: {e}")
            w.kill()
    finally:
        try:
            w.kill()
        except RuntimeError as e:
            log(f"{name}: {e}")
        for logname in ("dump.log", "restore.log", "restore-cold.log"):
            if os.path.exists(os.path.join(img, logname)):
                shutil.copy(os.path.join(img, logname), os.path.join(WORK, "logs", f"{name}-{logname}"))
        shutil.rmtree(img, ignore_errors=True)
    return r


def round_trip(variant, scenario, rnd, cold_too):
    kind, size, procs, *extra = SCENARIOS[scenario]
    name = f"{scenario}-{variant}-{rnd}"
    t0 = time.monotonic()
    r = {"variant": variant, "scenario": scenario, "round": rnd}
    w = Workload(kind, size, procs, name, extra[0] if extra else ())
    r["start_s"] = w.ready_at - w.t0
    time.sleep(0.5)
    r.update(dump_and_restore(variant, w, name, cold_too))
    r["trip_s"] = time.monotonic() - t0
    msg = (f"{name}: dump {r['dump_s']:.2f} s (hooks {r['device_dump_s']:.2f}"
           + (f", driver checkpoint {r['checkpoint_s']:.2f}" if "checkpoint_s" in r else "")
           + (f", GPU image write {r['write_s']:.2f}: {r['written_gib']:.2f} of {r['gpu_image_gib']:.1f} GiB, "
              f"{r['zero_pct']:.1f}% zero" if "write_s" in r else "")
           + f"), restore {r['restore_s']:.2f} s (hooks {r['device_restore_s']:.2f})"
           + (f", cold {r['restore_cold_s']:.2f} s" if "restore_cold_s" in r else "")
           + f", image {r['image_gib']:.2f} GiB ({r['image_alloc_gib']:.2f} allocated), data verified"
           + f"; {r['trip_s']:.0f} s")
    log(msg)
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


# --- the plan and its expected duration ----------------------------------------------------------------
# A model of one round trip on the H200 machine, from what was measured there (docs/benchmarks.md, the
# issue's figures): criu dump ~0.3 s + 0.96 s/GiB of image with either plugin (4 GiB: ~5 s, the LLM: ~10.6 s
# with the in-tree plugin); restore 0.6 s + 0.55 s/GiB with CRIU reading the pages, 0.8 s + 0.12 s/GiB with
# ours (mapped restore, GPU image); disk ~1.25 GB/s for the sync and the cold read; workload start-up from
# cuda_memcheck's ~2 s to transformers' ~15 s.

def footprint(scenario):
    """(GPU GiB, image GiB, share of zero pages in the GPU state) that a scenario is expected to have."""
    kind, size, procs, *_ = SCENARIOS[scenario]
    if kind == "memcheck":
        gpu = size / 1024 * procs + 0.4 * procs
        return gpu, gpu + 0.05 * procs, 0.05
    if kind == "torch":
        return size + 0.6, size + 1.6, 0.14
    return size / 1024 + 1.5, size / 1024 + 2.7, 0.8  # llm: GPT-2, the arena, the CUDA context; python


def estimate(scenario, variant, cold_too):
    kind, size, procs, *_ = SCENARIOS[scenario]
    gpu, image, zero = footprint(scenario)
    gpu_image = variant in ("ours", "ours-copy")
    mapped = variant in ("ours", "ours-criu")
    start_s = {"memcheck": 1.5 + 0.3 * gpu, "torch": 12 + 0.5 * size, "llm": 15.0}[kind]
    dump_s = 0.3 + 0.96 * image
    restore_s = 0.8 + 0.12 * image if mapped else 0.6 + 0.55 * image
    on_disk = image - gpu * zero if gpu_image else image
    t = start_s + 0.5 + dump_s + 2.0 + 0.05 * image
    sync_s = on_disk / 1.4  # the dump's image is still dirty in the page cache
    # Measured at 4 GiB: ours (mapped) 1.09 s warm, 3.41 s cold; CRIU reading the pages 3.54 s, 4.09 s.
    cold_s = restore_s + (0.5 if mapped else 0.15) * on_disk
    if COLD_CACHE:
        return t + sync_s + cold_s
    return t + restore_s + ((sync_s + cold_s + 1.0) if cold_too else 0.0)


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


def print_plan(trips, rounds, coldstart, time_limit=0):
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
    log(f"expected duration: about {total / 60:.1f} min ({total:.0f} s) on the H200 machine")
    if time_limit and total > time_limit:
        essential = sum(estimate(s, v, False) for _, s, v, _ in trips if VARIANT_ROUNDS.get(v) is None)
        log(f"--time-limit {time_limit:.0f} s: the cold restores and the variants NAME:N are left out where "
            f"they would not fit; the round trips of the other variants alone: about {essential:.0f} s")
    return total


# --- the report --------------------------------------------------------------------------------------------

# Every figure a run may have, with its label in the first table (None: in results.json and the later
# tables only).
FIGURES = [
    ("dump_s", "dump s"), ("criu_dump_s", "criu"), ("device_dump_s", "hooks"), ("checkpoint_s", "drv ckpt"),
    ("write_s", "img write"), ("restore_s", "restore s"), ("criu_restore_s", "criu"),
    ("device_restore_s", "hooks"), ("restore_cold_s", "cold rest."), ("restore_to_ready_s", "ready s"),
    ("image_gib", "image GiB"), ("image_alloc_gib", "alloc GiB"), ("criu_peak_mib", "peak MiB"),
    ("lock_s", None), ("gpu_state_gib", None), ("gpu_image_gib", None), ("written_gib", None),
    ("zero_pct", None), ("gpu_files", None), ("write_gbps", None), ("gpu_files_gib", None),
    ("gpu_files_alloc_gib", None), ("restore_unlock_s", None), ("driver_load_s", None), ("gpu_check_s", None),
    ("criu_restore_cold_s", None), ("device_restore_cold_s", None), ("restore_cold_to_ready_s", None),
    ("restore_unlock_cold_s", None), ("gpu_check_cold_s", None), ("sync_s", None), ("start_s", None),
    ("trip_s", None),
]


def med(rows, key):
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return statistics.median(vals) if vals else float("nan")


def normalize(r):
    """A run of --cold-cache had one restore, cold: its figures count as the cold restore's."""
    if not r.get("cold_cache") or "restore_cold_s" in r:
        return r
    r = dict(r)
    for warm, cold in (("restore_s", "restore_cold_s"), ("criu_restore_s", "criu_restore_cold_s"),
                       ("device_restore_s", "device_restore_cold_s"), ("restore_to_ready_s", "restore_cold_to_ready_s"),
                       ("restore_unlock_s", "restore_unlock_cold_s"), ("gpu_check_s", "gpu_check_cold_s")):
        if warm in r:
            r[cold] = r.pop(warm)
    return r


def ok(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def cell(x, width, prec=2, suffix=""):
    return f"{x:>{width - len(suffix)}.{prec}f}{suffix}" if ok(x) else f"{'-':>{width}}"


def div(a, b):
    return a / b if ok(a) and ok(b) and b else float("nan")


def gb(gib):
    return gib * GIB / 1e9 if ok(gib) else float("nan")


def rates(t, gpu_gib):
    """GB/s of each phase of one (scenario, variant): GPU bytes over the phase's seconds. The in-tree plugin
    logs no phases of its own: its hooks stand for the driver's checkpoint and restore."""
    gpu = gb(gpu_gib)
    crius_bytes = t["image_alloc_gib"] - (t["gpu_files_alloc_gib"] if ok(t["gpu_files_alloc_gib"]) else 0.0)
    return {
        "checkpoint": div(gpu, t["checkpoint_s"] if ok(t["checkpoint_s"]) else t["device_dump_s"]),
        "write": div(gpu, t["write_s"]),
        "written": div(gb(t["written_gib"]), t["write_s"]),
        "criu_dump": div(gb(crius_bytes), t["criu_dump_s"]),
        "restore": div(gpu, t["restore_unlock_s"] if ok(t["restore_unlock_s"]) else t["device_restore_s"]),
        "restore_e2e": div(gpu, t["restore_s"]),
        "restore_cold_e2e": div(gpu, t["restore_cold_s"]),
    }


def report(results, cold, out_dir, failures=(), meta=None):
    results = [normalize(r) for r in results]
    keys = [k for k, _ in FIGURES]
    scenarios = [s for s in list(SCENARIOS) + sorted({r["scenario"] for r in results} - set(SCENARIOS))
                 if any(r["scenario"] == s for r in results)]
    variants = [v for v in list(VARIANTS) + sorted({r["variant"] for r in results} - set(VARIANTS))
                if any(r["variant"] == v for r in results)]
    table = {}
    for s in scenarios:
        for v in variants:
            rows = [r for r in results if r["scenario"] == s and r["variant"] == v]
            table[(s, v)] = {k: med(rows, k) for k in keys}
            table[(s, v)]["runs"] = len(rows)
    # The GPU bytes of a scenario: our plugin's summary line (the in-tree plugin does not tell them).
    gpu_of = {s: med([r for r in results if r["scenario"] == s], "gpu_state_gib") for s in scenarios}
    base = BASELINE if BASELINE in variants else None
    cmp_variants = [v for v in variants if v != base]

    lines = []
    for v in variants:
        lines.append(f"{v}: {UTILITY.get(v, DESCRIPTIONS.get(v, ''))}")
    if meta:
        lines.append(meta)
    lines.append("")
    lines.append(f"1. seconds and sizes, medians over rounds (runs per variant in brackets); ratio = variant / "
                 f"{BASELINE} (below 1: faster or smaller). criu = CRIU's own work, hooks = inside the CUDA plugin's "
                 "hooks, drv ckpt = the driver's checkpoint call (our summary line), img write = our GPU image's "
                 "write (inside the hooks), cold rest. = restore with the page cache dropped, ready = restore to "
                 "the first verified answer, image = apparent size, alloc = blocks on disk")
    labelled = [(k, label) for k, label in FIGURES if label]
    w0, w = 24, 11
    lines.append(f"{'scenario / variant':<{w0}}" + "".join(f"{label:>{w}}" for _, label in labelled))
    for s in scenarios:
        for v in variants:
            t = table[(s, v)]
            lines.append(f"{(s + ' ' + v + ' [' + str(t['runs']) + ']'):<{w0}}" +
                         "".join(cell(t[k], w, 1 if k == "criu_peak_mib" else 2) for k, _ in labelled))
        if base:
            for v in cmp_variants:
                lines.append(f"{(s + ' ratio ' + v):<{w0}}" + "".join(
                    cell(div(table[(s, v)][k], table[(s, base)][k]), w) for k, _ in labelled))

    if base:
        lines.append("")
        lines.append(f"2. against the baseline ({base}), from the medians: dump, image (apparent / allocated), "
                     "restore (warm / cold page cache) and restore-to-ready as ratios variant / baseline; and "
                     "our dump over our driver checkpoint call (1.00 would be a dump that costs nothing beyond "
                     "the driver)")
        cols = ["dump", "dump/ckpt", "image", "img alloc", "restore", "rest. cold", "ready"]
        lines.append(f"{'scenario / variant':<{w0}}" + "".join(f"{c:>{w}}" for c in cols))
        for s in scenarios:
            b = table[(s, base)]
            for v in cmp_variants:
                t = table[(s, v)]
                vals = [div(t["dump_s"], b["dump_s"]), div(t["dump_s"], t["checkpoint_s"]),
                        div(t["image_gib"], b["image_gib"]), div(t["image_alloc_gib"], b["image_alloc_gib"]),
                        div(t["restore_s"], b["restore_s"]), div(t["restore_cold_s"], b["restore_cold_s"]),
                        div(t["restore_to_ready_s"], b["restore_to_ready_s"])]
                lines.append(f"{(s + ' ' + v):<{w0}}" + "".join(cell(x, w) for x in vals))

    lines.append("")
    lines.append("3. rates, GB/s (1e9 bytes/s) of GPU state over each phase's median seconds. GPU GiB: our summary "
                 "line. drv ckpt: the driver's checkpoint call (in-tree: its dump hooks); img write: GPU bytes over "
                 "our GPU image's write time (data: the bytes actually written); criu dump: what CRIU wrote itself "
                 "(allocated image less our GPU image files) over CRIU's own dump seconds; restore: the driver's "
                 "restore+unlock (in-tree: its restore hook); e2e: over the whole criu restore, warm and cold")
    cols = [("GPU GiB", None), ("zero %", None), ("drv ckpt", "checkpoint"), ("img write", "write"),
            ("data", "written"), ("criu dump", "criu_dump"), ("restore", "restore"), ("e2e", "restore_e2e"),
            ("e2e cold", "restore_cold_e2e")]
    lines.append(f"{'scenario / variant':<{w0}}" + "".join(f"{c:>{w}}" for c, _ in cols))
    rate_table = {}
    for s in scenarios:
        for v in variants:
            t = table[(s, v)]
            rt = rate_table[(s, v)] = rates(t, gpu_of[s])
            lines.append(f"{(s + ' ' + v):<{w0}}" + cell(gpu_of[s], w) + cell(t["zero_pct"], w, 1) +
                         "".join(cell(rt[k], w) for _, k in cols[2:]))
    lines.append(LIMITS_TEXT)

    if cold:
        lines.append("")
        lines.append("expensive start (torch.compile mode=reduce-overhead, 2 GiB): medians, seconds")
        for what in dict.fromkeys(c["what"] for c in cold):
            lines.append(f"  {what:<34} {statistics.median(c['seconds'] for c in cold if c['what'] == what):8.2f}")
    if failures:
        lines.append("")
        lines.append(f"{len(failures)} round trip(s) failed or skipped:")
        lines += [f"  {f['scenario']} {f['variant']} round {f['round']}: {f['error']}" for f in failures]
    text = "\n".join(lines)
    print(text, flush=True)
    with open(os.path.join(out_dir, "results.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(clean({"runs": results, "cold_start": cold, "failures": list(failures), "utilities": UTILITY,
                         "baseline": BASELINE, "limits_gbps": dict(LIMITS),
                         "medians": {f"{s}/{v}": m for (s, v), m in table.items()},
                         "rates_gbps": {f"{s}/{v}": m for (s, v), m in rate_table.items()},
                         "gpu_gib": gpu_of}), f, indent=1)
    plot(table, rate_table, scenarios, variants, cold, os.path.join(out_dir, "bench.png"))
    counts = [n for n in GPU_COUNTS if f"{n}gpu" in scenarios]
    if counts:
        plot_scaling(table, counts, variants, os.path.join(out_dir, "scaling.png"))


def clean(x):
    """NaN and infinity become null: results.json stays strict JSON."""
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        log("matplotlib not available: no plot")
        return None


def plot_scaling(table, counts, variants, path):
    """Seconds against the number of GPUs (one process per GPU), ours and in-tree."""
    plt = pyplot()
    if not plt:
        return
    panels = [("device_dump_s", "device phases of dump, s"), ("device_restore_s", "device phases of restore, s"),
              ("dump_s", "criu dump, s"), ("restore_s", "criu restore, s")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4))
    for ax, (key, title) in zip(axes, panels):
        for v in variants:
            ys = [table[(f"{n}gpu", v)][key] for n in counts]
            ax.plot(counts, ys, marker="o", label=v)
            for n, y in zip(counts, ys):
                if ok(y):
                    ax.annotate(f"{y:.2f}", (n, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
        ax.set_xticks(counts)
        ax.set_xlabel("GPUs (one 4 GiB process each)")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log(f"plot: {path}")


def nz(x):
    return x if ok(x) else 0.0


def plot(table, rate_table, scenarios, variants, cold, path):
    """Dump and restore seconds by phase, image size, ratios against the baseline and the phases' rates
    against the machine's limits (and the expensive start, when measured)."""
    plt = pyplot()
    if not plt:
        return
    pairs = [(s, v) for s in scenarios for v in variants]
    xs = list(range(len(pairs)))
    ticks = [f"{s}\n{v}" for s, v in pairs]
    ncols = 3 + (1 if cold else 0)
    fig, axes = plt.subplots(2, ncols, figsize=(6.2 * ncols, 10.5))
    axes = axes.flatten()

    def stacked(ax, segments, title, totals, marks=()):
        bottom = [0.0] * len(pairs)
        for label, vals, color in segments:
            vals = [nz(x) for x in vals]
            if any(vals):
                ax.bar(xs, vals, 0.7, bottom=bottom, label=label, color=color)
                bottom = [b + x for b, x in zip(bottom, vals)]
        for x, total in zip(xs, totals):
            if ok(total):
                ax.annotate(f"{total:.2f}", (x, total), textcoords="offset points", xytext=(0, 3), ha="center",
                            fontsize=7)
        for label, vals, marker in marks:
            pts = [(x, y) for x, y in zip(xs, vals) if ok(y)]
            if pts:
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, color="black", zorder=3,
                           label=label)
                for x, y in pts:
                    ax.annotate(f"{y:.1f}", (x, y), textcoords="offset points", xytext=(9, -3), fontsize=7)
        tops = [nz(x) for x in list(totals) + [y for _, vals, _ in marks for y in vals]]
        ax.set_ylim(0, max(tops + [bottom_max(bottom)]) * 1.12 or 1)
        ax.set_xticks(xs, ticks, fontsize=7)
        ax.set_title(title)
        ax.legend(fontsize=7)

    def bottom_max(bottom):
        return max(bottom) if bottom else 0.0

    t = [table[p] for p in pairs]
    # Dump: the driver's checkpoint call, our GPU image's write, the rest of the hooks, CRIU's own work.
    ckpt = [r["checkpoint_s"] for r in t]
    write = [nz(r["write_s"]) for r in t]
    hooks_rest = [max(0.0, nz(r["device_dump_s"]) - nz(c) - w) if ok(c) else 0.0 for r, c, w in zip(t, ckpt, write)]
    intree_hooks = [r["device_dump_s"] if not ok(c) else 0.0 for r, c in zip(t, ckpt)]
    stacked(axes[0], [("driver checkpoint call (ours)", ckpt, "#1f77b4"), ("GPU image write (ours)", write, "#17becf"),
                      ("rest of the hooks (ours)", hooks_rest, "#aec7e8"), ("hooks (in-tree)", intree_hooks, "#ff7f0e"),
                      ("CRIU's own work", [r["criu_dump_s"] for r in t], "#c7c7c7")],
            "criu dump, s, by phase", [r["dump_s"] for r in t])
    # Restore: our GPU image check, the driver's restore+unlock, the rest of the hooks, CRIU's own work;
    # the cold restore's total as a marker.
    check = [nz(r["gpu_check_s"]) for r in t]
    unlock = [r["restore_unlock_s"] for r in t]
    rest = [max(0.0, nz(r["device_restore_s"]) - nz(u) - c) if ok(u) else 0.0 for r, u, c in zip(t, unlock, check)]
    intree_r = [r["device_restore_s"] if not ok(u) else 0.0 for r, u in zip(t, unlock)]
    stacked(axes[1], [("GPU image check (ours)", check, "#17becf"), ("driver restore+unlock (ours)", unlock, "#1f77b4"),
                      ("rest of the hooks (ours)", rest, "#aec7e8"), ("hooks (in-tree)", intree_r, "#ff7f0e"),
                      ("CRIU's own work", [r["criu_restore_s"] for r in t], "#c7c7c7")],
            "criu restore, s, by phase (warm page cache)", [r["restore_s"] for r in t],
            [("restore with the page cache dropped", [r["restore_cold_s"] for r in t], "v")])
    # Image: apparent size, and the blocks it takes (the GPU image files are sparse).
    ax = axes[2]
    app = [nz(r["image_gib"]) for r in t]
    alloc = [nz(r["image_alloc_gib"]) for r in t]
    gpu_alloc = [nz(r["gpu_files_alloc_gib"]) for r in t]
    ax.bar(xs, app, 0.7, color="none", edgecolor="#555555", hatch="//", label="apparent")
    ax.bar(xs, [a - g for a, g in zip(alloc, gpu_alloc)], 0.5, color="#c7c7c7", label="allocated: CRIU's images")
    ax.bar(xs, gpu_alloc, 0.5, bottom=[a - g for a, g in zip(alloc, gpu_alloc)], color="#17becf",
           label="allocated: our GPU image")
    for x, a, b in zip(xs, app, alloc):
        ax.annotate(f"{b:.2f}" + (f" / {a:.2f}" if abs(a - b) > 0.05 else ""), (x, a), textcoords="offset points",
                    xytext=(0, 3), ha="center", fontsize=7)
    ax.set_ylim(0, max(app + alloc + [0.0]) * 1.12 or 1)
    ax.set_xticks(xs, ticks, fontsize=7)
    ax.set_title("image on disk, GiB (allocated / apparent)")
    ax.legend(fontsize=7)
    # Ratios against the baseline.
    ax = axes[3]
    others = [v for v in variants if v != BASELINE]
    metrics = [("dump", "dump_s"), ("image alloc", "image_alloc_gib"), ("restore", "restore_s"),
               ("restore cold", "restore_cold_s")]
    if BASELINE in variants and others:
        groups = [(s, v) for s in scenarios for v in others]
        width = 0.8 / len(metrics)
        top = 1.2
        for i, (label, key) in enumerate(metrics):
            vals = [div(table[(s, v)][key], table[(s, BASELINE)][key]) for s, v in groups]
            if not any(ok(x) for x in vals):
                continue
            top = max([top] + [x * 1.15 for x in vals if ok(x)])
            pos = [g + (i - (len(metrics) - 1) / 2) * width for g in range(len(groups))]
            bars = ax.bar(pos, [nz(x) for x in vals], width, label=label)
            ax.bar_label(bars, labels=[f"{x:.2f}" if ok(x) else "" for x in vals], fontsize=6)
        dc = [div(table[g]["dump_s"], table[g]["checkpoint_s"]) for g in groups]
        pts = [(i, y) for i, y in enumerate(dc) if ok(y)]
        if pts:
            ax2 = ax.twinx()
            ax2.scatter([p[0] for p in pts], [p[1] for p in pts], marker="D", color="black",
                        label="our dump / our driver checkpoint call (right axis)")
            ax2.set_ylim(bottom=0, top=max(2.0, max(p[1] for p in pts) * 1.2))
            ax2.legend(fontsize=7, loc="upper right")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_ylim(0, top)
        ax.set_xticks(range(len(groups)), [f"{s}\n{v}" for s, v in groups], fontsize=7)
        ax.legend(fontsize=7, loc="upper left")
    ax.set_title(f"ratio variant / {BASELINE} (below 1: better)")
    # Rates against the machine's limits.
    ax = axes[4]
    phases = [("driver checkpoint (in-tree: hooks)", "checkpoint"), ("GPU image write", "write"),
              ("CRIU's own dump", "criu_dump"), ("driver restore (in-tree: hooks)", "restore"),
              ("restore, end to end", "restore_e2e"), ("restore cold, end to end", "restore_cold_e2e")]
    phases = [p for p in phases if any(ok(rate_table[q][p[1]]) for q in pairs)]
    width = 0.8 / max(1, len(phases))
    for i, (label, key) in enumerate(phases):
        vals = [rate_table[q][key] for q in pairs]
        pos = [x + (i - (len(phases) - 1) / 2) * width for x in xs]
        bars = ax.bar(pos, [nz(x) for x in vals], width, label=label)
        ax.bar_label(bars, labels=[f"{x:.1f}" if ok(x) else "" for x in vals], fontsize=5)
    for (label, gbps), style in zip(LIMITS, (":", "--", "-.", (0, (1, 4)))):
        ax.axhline(gbps, color="black", linewidth=0.9, linestyle=style, label=f"limit: {label}, {gbps} GB/s")
    # Log scale: the disk's ~1.2 GB/s and the writers' ~13 GB/s both stay readable.
    ax.set_yscale("log")
    top = max([nz(rate_table[q][k]) for q in pairs for _, k in phases] + [g for _, g in LIMITS])
    ax.set_ylim(0.2, top * 6)
    ax.set_xticks(xs, ticks, fontsize=7)
    ax.set_title("GB/s of GPU state per phase (log scale), against the machine's limits")
    ax.legend(fontsize=6, loc="upper left", ncol=2)
    # Restore-to-ready and the start-up of each workload.
    ax = axes[5]
    ready = [r["restore_to_ready_s"] for r in t]
    bars = ax.bar(xs, [nz(x) for x in ready], 0.7, color="#1f77b4", label="restore to the first verified answer")
    ax.bar_label(bars, labels=[f"{x:.2f}" if ok(x) else "" for x in ready], fontsize=7)
    starts = [r["start_s"] for r in t]
    pts = [(x, y) for x, y in zip(xs, starts) if ok(y)]
    if pts:
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker="_", s=300, color="black",
                   label="workload start-up (from scratch)")
    ax.set_xticks(xs, ticks, fontsize=7)
    ax.set_title("restore-to-ready against a fresh start, s")
    ax.legend(fontsize=7)
    if cold:
        ax = axes[6]
        whats = list(dict.fromkeys(c["what"] for c in cold))
        vals = [statistics.median(c["seconds"] for c in cold if c["what"] == w) for w in whats]
        colors = ["#999999", "#bbbbbb", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]
        bars = ax.barh(whats, vals, color=(colors * 2)[:len(whats)])
        ax.bar_label(bars, fmt="%.1f s", fontsize=8)
        ax.set_title("expensive start: cold start vs restore-to-ready")
        ax.invert_yaxis()
    for ax in axes[6 + (1 if cold else 0):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log(f"plot: {path}")


def set_utilities(nvidia):
    """Points the baseline at NVIDIA's utility (a folder in WORK holding a cuda-checkpoint link to it)."""
    for v in VARIANTS:
        UTILITY[v] = DESCRIPTIONS[v]
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
    if BASELINE in VARIANTS:
        VARIANTS[BASELINE] = dict(VARIANTS[BASELINE], path=folder)
        UTILITY[BASELINE] = f"CRIU's in-tree plugin driving NVIDIA's cuda-checkpoint ({nvidia}, sha256 {digest}...)"
        log(f"baseline: {UTILITY[BASELINE]}")


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
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scenarios", default="4g,4x2g,llm",
                    help="comma-separated: 1g,4g,16g,4x2g,torch,llm,1gpu,2gpu,4gpu,8gpu,coldstart "
                    "(default: %(default)s)")
    ap.add_argument("--variants", default="ours,in-tree",
                    help="comma-separated, in order: ours, ours-criu, ours-copy, in-tree (the baseline), "
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
                    "(the cold restore is left out first); the report comes within it")
    ap.add_argument("--plan", action="store_true", help="print the round trips and the expected duration, then stop")
    ap.add_argument("--from-json", nargs="+", metavar="FILE",
                    help="no runs: report and plot the results.json files of earlier runs together")
    args = ap.parse_args()
    global BASELINE, COLD_CACHE, DEADLINE
    if args.from_json:
        results, cold, failures = [], [], []
        for path in args.from_json:
            with open(path) as f:
                data = json.load(f)
            results += data["runs"]
            cold += data.get("cold_start", [])
            failures += data.get("failures", [])
            UTILITY.update(data.get("utilities", {}))
            BASELINE = data.get("baseline", BASELINE)
        for r in results:
            VARIANTS.setdefault(r["variant"], KNOWN_VARIANTS.get(r["variant"], {"libdir": "", "path": None}))
        os.makedirs(args.out, exist_ok=True)
        report(results, cold, args.out, failures, f"from {', '.join(args.from_json)}")
        return
    for name, (kind, size, procs, *extra) in SCENARIOS.items():
        SCENARIOS[name] = (kind, max(1, int(size * args.scale)) if kind != "torch" else size * args.scale, procs,
                           *extra)
    choose_variants(args)
    COLD_CACHE = args.cold_cache
    wanted = [s for s in args.scenarios.split(",") if s]
    unknown = [s for s in wanted if s not in SCENARIOS and s != "coldstart"]
    if unknown:
        sys.exit(f"bench.py: unknown scenario(s) {', '.join(unknown)} (known: {', '.join(SCENARIOS)}, coldstart)")
    cold_rounds = min(max(0, args.cold_rounds), args.rounds)
    if args.plan:
        trips = plan(args.rounds, [s for s in wanted if s in SCENARIOS], cold_rounds)
        print_plan(trips, args.rounds, "coldstart" in wanted, args.time_limit)
        return
    if os.geteuid() != 0:
        sys.exit("bench.py: run as root (CRIU needs it)")
    t_start = time.monotonic()
    if args.time_limit:
        DEADLINE = t_start + args.time_limit - 10
    become_subreaper()
    # A TERM (a time limit) still reports what was measured so far.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt("terminated")))
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(os.path.join(WORK, "logs"))
    set_utilities(args.cuda_checkpoint)
    if COLD_CACHE:
        log("the page cache is dropped before every restore")
    os.makedirs(args.out, exist_ok=True)
    gpus = gpu_count()
    for s in [s for s in wanted if s.endswith("gpu") and s in SCENARIOS and SCENARIOS[s][2] > gpus]:
        log(f"{s}: skipped, this machine has {gpus} GPU(s)")
        wanted.remove(s)
    info = machine_info(args)
    log(f"machine: {info.get('gpus')}; kernel {info['kernel']}; THP {info.get('thp', '?')}")
    trips = plan(args.rounds, [s for s in wanted if s in SCENARIOS], cold_rounds)
    print_plan(trips, args.rounds, "coldstart" in wanted, args.time_limit)
    results, cold, failures = [], [], []
    done = {}  # scenario -> [expected, measured] seconds of its round trips so far
    reserve = 20.0  # the report, the plot and the logs' archive

    def correction(scenario):
        """Measured against expected so far, for this scenario (else all): how far to trust the model."""
        est, act = done.get(scenario) or [sum(x) for x in zip([0.0, 0.0], *done.values())]
        return min(3.0, max(0.7, act / est)) if est else 1.0
    try:
        for n, (rnd, s, v, cold_too) in enumerate(trips):
            corr = correction(s)
            elapsed = time.monotonic() - t_start
            if args.time_limit:
                # The round trips of the variants that run every round come first: a cold restore or a
                # variant NAME:N only runs when every such round trip still to come is expected to fit.
                essential = VARIANT_ROUNDS.get(v) is None
                left = args.time_limit - elapsed - reserve
                left_extra = left - sum(correction(t[1]) * estimate(t[1], t[2], False) for t in trips[n + 1:]
                                        if VARIANT_ROUNDS.get(t[2]) is None)

                def extra_cost(cold):  # with a margin of 25 %: the essential round trips keep their time
                    return 1.25 * corr * (estimate(s, v, cold) - (estimate(s, v, False) if essential else 0.0))

                if cold_too and extra_cost(True) > left_extra:
                    cold_too = False
                    log(f"{s} {v} round {rnd}: no cold restore, not enough time left before the time limit")
                if (not essential and extra_cost(cold_too) > left_extra) or estimate(s, v, cold_too) * corr > left:
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
            d = done.setdefault(s, [0.0, 0.0])
            d[0] += estimate(s, v, cold_too)
            d[1] += r["trip_s"]
        if "coldstart" in wanted:
            cold_start(args.rounds, cold)
    except KeyboardInterrupt as e:
        log(f"stopped early ({e}): reporting what was measured")
    finally:
        info["elapsed_s"] = round(time.monotonic() - t_start, 1)
        if results or cold or failures:
            report(results, cold, args.out, failures,
                   f"machine: {info.get('gpus')}; kernel {info['kernel']}; THP {info.get('thp', '?')}; "
                   f"{info['elapsed_s']:.0f} s in all")
            with open(os.path.join(args.out, "results.json")) as f:
                data = json.load(f)
            data["meta"] = info
            with open(os.path.join(args.out, "results.json"), "w") as f:
                json.dump(data, f, indent=1)
        subprocess.run(["tar", "-czf", os.path.join(args.out, "bench-logs.tar.gz"), "-C", WORK, "logs"], check=False)
        log(f"done in {time.monotonic() - t_start:.0f} s; results in {args.out}")


if __name__ == "__main__":
    main()
