"""What the benchmark's modules share: the bundle's paths, the variants and scenarios, the settings of a run
(BASELINE, COLD_CACHE, DEADLINE: set by bench.py's main), the machine's limits and small helpers."""
import math
import os
import statistics
import time

BUNDLE = os.path.dirname(os.path.abspath(__file__))
CRIU = os.path.join(BUNDLE, "sbin", "criu")
MEMCHECK = os.path.join(BUNDLE, "bin", "cuda_memcheck")
TORCH = os.path.join(BUNDLE, "torch_workload.py")
FRAMEWORK = os.path.join(BUNDLE, "framework_workload.py")
SERVING = os.path.join(BUNDLE, "serving_workload.py")
# Every variant there is: CRIU's plugin directory, the folder put first in PATH (where the in-tree plugin finds
# the cuda-checkpoint command line) and the environment of criu. main() fills in the baseline's utility and
# picks VARIANTS, in order, from --variants.
KNOWN_VARIANTS = {
    "ours": {"libdir": os.path.join(BUNDLE, "plugin"), "path": None},
    "ours-criu": {"libdir": os.path.join(BUNDLE, "plugin"), "path": None, "env": {"CUDA_CRIU_GPU_IMAGE": "criu"}},
    "ours-copy": {"libdir": os.path.join(BUNDLE, "plugin"), "path": None, "env": {"CUDA_CRIU_MAP_IMAGE": "off"}},
    "ours-zstd": {"libdir": os.path.join(BUNDLE, "plugin"), "path": None, "env": {"CUDA_CRIU_COMPRESS": "zstd"}},
    "in-tree": {"libdir": os.path.join(BUNDLE, "intree"), "path": os.path.join(BUNDLE, "bin")},
    "in-tree+cuda-criu": {"libdir": os.path.join(BUNDLE, "intree"), "path": os.path.join(BUNDLE, "bin")},
}
DESCRIPTIONS = {
    "ours": "this plugin (gpu-image=plugin: it writes the GPU state itself, zero chunks skipped)",
    "ours-criu": "this plugin with CUDA_CRIU_GPU_IMAGE=criu (the GPU state in CRIU's pages images)",
    "ours-copy": "this plugin with CUDA_CRIU_MAP_IMAGE=off (the GPU state read into fresh memory)",
    "ours-zstd": "this plugin with CUDA_CRIU_COMPRESS=zstd (the GPU image's chunks compressed)",
    "in-tree": "CRIU's in-tree plugin driving cuda-criu (this project's cuda-checkpoint compatible command line)",
    "in-tree+cuda-criu": "CRIU's in-tree plugin driving cuda-criu (this project's command line)",
}
VARIANTS = {}       # name -> KNOWN_VARIANTS entry, in the order of --variants
VARIANT_ROUNDS = {}  # name -> the number of last rounds it runs in (None: all)
BASELINE = "in-tree"
UTILITY = {}        # name -> description, for the report
# scenario -> (workload kind, size, CUDA processes[, extra workload arguments]); sizes: MiB for memcheck, llm and
# serve (the KV-cache arena), GiB for torch. SCENARIO_HELP: scenario -> its one line for bench.py --help. Both
# are filled only by add_scenario() below, so that no scenario goes without its line in --help.
SCENARIOS = {}
SCENARIO_HELP = {}


def add_scenario(name, description, kind, size, procs, extra=None):
    SCENARIOS[name] = (kind, size, procs) + ((extra,) if extra is not None else ())
    SCENARIO_HELP[name] = description


add_scenario("1g", "cuda_memcheck with 1 GiB of device memory", "memcheck", 1024, 1)
add_scenario("4g", "cuda_memcheck with 4 GiB of device memory", "memcheck", 4096, 1)
add_scenario("16g", "cuda_memcheck with 16 GiB of device memory", "memcheck", 16384, 1)
add_scenario("32g", "cuda_memcheck with 32 GiB of device memory", "memcheck", 32768, 1)
add_scenario("4x2g", "a tree of 4 cuda_memcheck processes of 2 GiB each", "memcheck", 2048, 4)
add_scenario("torch", "PyTorch with 4 GiB of weights (torch_workload.py)", "torch", 4, 1)
add_scenario("llm", "an LLM server's shape: GPT-2 with random weights, an 8 GiB KV-cache arena of zeros, a "
             "greedy generation (framework_workload.py)", "llm", 8192, 1)
add_scenario("llm24", "llm with a 24 GiB KV-cache arena", "llm", 24576, 1)
# An inference server started as vLLM/SGLang start one (serving_workload.py): a Llama model's weights
# (GB) loaded from safetensors files, a KV-cache arena (MiB, zeros), torch.compile and CUDA graphs.
add_scenario("serve", "an inference server as vLLM and SGLang start one: ~6 GB of Llama weights from safetensors, "
             "a 16 GiB KV-cache arena, torch.compile, CUDA graphs, HTTP (serving_workload.py)",
             "serve", 16384, 1, ("6",))
add_scenario("serve16", "serve with ~16 GB of weights", "serve", 16384, 1, ("16",))
# serve's image with a 4 GiB arena (zeros, never stored): 4 replicas of it fit one 80 GB GPU.
add_scenario("serve-kv4", "serve with a 4 GiB KV-cache arena: the same image, 4 replicas fit one 80 GB GPU",
             "serve", 4096, 1, ("6",))
# The same server in two processes, as vLLM V1 and SGLang run it: an HTTP front without CUDA and the
# engine, talking over a Unix socket, the token ids in a ring in /dev/shm (--processes 2).
add_scenario("serve2", "serve in two processes: an HTTP front without CUDA and the engine, a Unix socket "
             "between them, the token ids in a ring in /dev/shm", "serve", 16384, 1, ("6", "--processes", "2"))
# Scaling: one 4 GiB process per GPU, on 1, 2, 4 and 8 GPUs (those the machine has).
GPU_COUNTS = (1, 2, 4, 8)
for _n in GPU_COUNTS:
    add_scenario(f"{_n}gpu", f"{_n} cuda_memcheck process(es) of 4 GiB, one per GPU (skipped with fewer GPUs)",
                 "memcheck", 4096, _n, ("--child-device", "spread"))
# Growth: with the GPU bytes of one process, and with the number of CUDA processes (256 MiB each, one tree).
GROWTH_BYTES = ("1g", "4g", "16g", "32g")
PROC_COUNTS = (1, 4, 16, 32)
for _n in PROC_COUNTS:
    add_scenario(f"p{_n}", f"{_n} cuda_memcheck process(es) of 256 MiB in one tree", "memcheck", 256, _n)
# Scenarios that are no workload's round trips: coldstart runs after them (bench_run.cold_start).
OTHER_SCENARIOS = {
    "coldstart": "torch.compile's start-up from scratch (empty, then warm compile caches) against restore-to-ready",
}
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


def footprint(scenario):
    """(GPU GiB, image GiB, share of zero pages in the GPU state) that a scenario is expected to have."""
    kind, size, procs, *_ = SCENARIOS[scenario]
    if kind == "memcheck":
        gpu = size / 1024 * procs + 0.4 * procs
        return gpu, gpu + 0.05 * procs, 0.05
    if kind == "torch":
        return size + 0.6, size + 1.6, 0.14
    if kind == "serve":
        weights = {"6": 6.0, "16": 15.0}[SCENARIOS[scenario][3][0]]  # GiB
        gpu = weights + size / 1024 + 1.5
        return gpu, gpu + 3.0, size / 1024 / gpu
    return size / 1024 + 1.5, size / 1024 + 2.7, 0.8  # llm: GPT-2, the arena, the CUDA context; python


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def med(rows, key):
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return statistics.median(vals) if vals else float("nan")


def ok(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def cell(x, width, prec=2, suffix=""):
    return f"{x:>{width - len(suffix)}.{prec}f}{suffix}" if ok(x) else f"{'-':>{width}}"


def div(a, b):
    return a / b if ok(a) and ok(b) and b else float("nan")


def gb(gib):
    return gib * GIB / 1e9 if ok(gib) else float("nan")


def nz(x):
    return x if ok(x) else 0.0


def clean(x):
    """NaN and infinity become null: results.json stays strict JSON."""
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
