"""Running the benchmark's round trips: the workloads, criu, the figures read from CRIU's logs, the memory
sampled while a dump or restore runs."""
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import bench_common as C
from bench_common import (BUNDLE, CRIU, FRAMEWORK, GIB, MEMCHECK, SCENARIOS, SERVING, TORCH, VARIANTS, footprint,
                          log)

def state(path):
    try:
        with open(path) as f:
            return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    except FileNotFoundError:
        return {}


def bounded(timeout):
    return min(timeout, max(1.0, C.DEADLINE - time.monotonic())) if C.DEADLINE else timeout


def wait_for(what, pred, timeout):
    timeout = bounded(timeout)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return time.monotonic()
        time.sleep(0.02)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


def after_rewrite(what, iterations):
    """Returns right after the workload has rewritten its state file (iterations() changed), in the pause
    before the next rewrite: the moment to dump it. Every workload rewrites its state file in place, one
    write of a fixed size; a dump that fell inside a write and rename (as they once wrote it) recorded the
    open temporary file, which the process renamed away once it ran again, so that a second restore of the
    image (the cold one, a replica) found no such file. Dumping right after a rewrite keeps a dump out of
    the write whatever a workload does."""
    last = iterations()
    wait_for(f"{what} to rewrite its state file", lambda: iterations() != last, 30)


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


# CRIU's line for the plugin's call criu_dump_skip_pages (criu-patches/0004), made inside the plugin's hook.
SKIP_PAGES_LINE = "are saved by a plugin, not dumped"


def device_seconds(logfile, hooks):
    """Seconds CRIU spent inside the CUDA plugin's hooks: from each 'hook N' line of CRIU's log to the next
    line that is neither the plugin's own nor CRIU's answer to a call the plugin makes from its hook."""
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
            if s and start_t is not None and "cuda_plugin" not in s.group(2) and SKIP_PAGES_LINE not in s.group(2):
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
PREFLIGHT = re.compile(r"memory preflight: the checkpoint adds " + _SIZE)
OWN_DUMP = re.compile(r"plugin's own time beyond the driver: lock ([\d.]+) ms/process, checkpoint ([\d.]+) ms/process")
IN_PARENT = re.compile(r"; " + _SIZE + r" unchanged since the parent image")
OWN_RESTORE = re.compile(r"plugin's own time beyond the driver: ([\d.]+) ms/process")


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
            m = PREFLIGHT.search(line)
            if m:
                r["preflight_gib"] = _gib(m.group(1), m.group(2))
            m = OWN_DUMP.search(line)
            if m:
                r.update(own_lock_ms=float(m.group(1)), own_ckpt_ms=float(m.group(2)))
            m = IN_PARENT.search(line)
            if m:
                r["parent_gib"] = _gib(m.group(1), m.group(2))
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
                o = OWN_RESTORE.search(line)
                if o:
                    r[f"own_restore{suffix}_ms"] = float(o.group(1))
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


def meminfo(key):
    """A line of /proc/meminfo, in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def resident(pid):
    """VmRSS of a process in bytes; 0 when it is gone (or not there yet)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class MemSampler:
    """While a dump or a restore runs: the resident memory of the workload's processes (their sum), the
    host's page cache (Cached) and its shared memory (Shmem: a compressed image's decoded GPU state), every
    50 ms. Their peaks say what a checkpoint costs the host's memory; Shmem once done, what it keeps."""

    def __init__(self, pids):
        self.pids = list(pids)
        self.rss0 = self.peak_rss = sum(resident(p) for p in self.pids)
        self.cache0 = self.peak_cache = meminfo("Cached")
        self.shmem0 = self.peak_shmem = meminfo("Shmem")
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.done.wait(0.05):
            self.peak_rss = max(self.peak_rss, sum(resident(p) for p in self.pids))
            self.peak_cache = max(self.peak_cache, meminfo("Cached"))
            self.peak_shmem = max(self.peak_shmem, meminfo("Shmem"))

    def stop(self, prefix):
        self.done.set()
        self.thread.join()
        return {f"{prefix}_rss0_gib": self.rss0 / GIB, f"{prefix}_peak_rss_gib": self.peak_rss / GIB,
                f"{prefix}_cache_gib": (self.peak_cache - self.cache0) / GIB,
                f"{prefix}_shmem_gib": (self.peak_shmem - self.shmem0) / GIB,
                f"{prefix}_shmem_after_gib": (meminfo("Shmem") - self.shmem0) / GIB}


TMPFS = "/dev/shm/cuda-criu-bench"


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answer(port, batch, quiet=False, timeout=300, who=False):
    """A server's answer to GET /generate?batch=B (parsed JSON); with who, (the answering server's pid, the
    answer); None when quiet and it cannot answer yet."""
    import json
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/generate?batch={batch}", timeout=timeout) as r:
            body = json.loads(r.read())
            return (int(r.headers["X-Server"]), body) if who else body
    except OSError:
        if quiet:
            return None
        raise


COMPILE_CACHE = os.path.join(C.WORK, "inductor-cache")  # torch.compile's, kept from one start to the next


def offline_env(env=None):
    """Hugging Face libraries with no network and no chatter."""
    return dict(env or os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")


def compile_env(env=None):
    """torch.compile's caches in the work folder (the engines keep theirs from one start to the next too),
    compiled in-process (a pool of compile workers would be dumped with the workload)."""
    return dict(env or os.environ, TORCHINDUCTOR_CACHE_DIR=COMPILE_CACHE,
                TRITON_CACHE_DIR=os.path.join(COMPILE_CACHE, "triton"), TORCHINDUCTOR_COMPILE_THREADS="1")


def serving_env(env=None):
    return compile_env(offline_env(env))


def serving_weights(model_gb):
    """The folder with the serving model's weights (--size model_gb), written once per machine."""
    folder = os.path.join(os.path.dirname(C.WORK.rstrip("/")), f"cuda-criu-serve-weights-{model_gb}")
    if not os.path.exists(os.path.join(folder, "config.json")):
        log(f"writing the {model_gb} GB serving model's weights into {folder}")
        t0 = time.monotonic()
        subprocess.run([sys.executable, SERVING, "make", "--dir", folder, "--size", str(model_gb)],
                       check=True, env=serving_env())
        log(f"weights written in {time.monotonic() - t0:.0f} s")
    return folder


BATCHES = (1, 2, 4, 8)  # the serving scenarios' decode batch sizes, a CUDA graph each


def serve_cmd(kv_mib, extra, port, state_file):
    """The serving scenario's server: extra is its scenario's (the model's GB, then more arguments)."""
    return [sys.executable, SERVING, "serve", "--dir", serving_weights(extra[0]), "--port", str(port),
            "--kv-gb", str(kv_mib / 1024), "--batches", ",".join(map(str, BATCHES)), "--state", state_file,
            *extra[1:]]


def disk_read_bytes():
    """Bytes read from the machine's disks so far (/proc/diskstats, whole devices only)."""
    total = 0
    with open("/proc/diskstats") as f:
        for line in f:
            x = line.split()
            if os.path.exists(f"/sys/block/{x[2]}/device"):
                total += int(x[5]) * 512
    return total


RECLAIM_KEYS = ("pgsteal_kswapd", "pgsteal_direct", "workingset_refault_file", "allocstall_normal",
                "compact_stall")


def reclaim_counters():
    """The kernel's counters of page reclaim so far (/proc/vmstat): pages taken back from the page cache or
    anonymous memory (pgsteal), file pages read again after that (workingset_refault_file), allocations
    that waited for reclaim or compaction. What a cold restore read early and the kernel took back, it
    reads again: these tell."""
    values = {}
    with open("/proc/vmstat") as f:
        for line in f:
            key, value = line.split()
            if key in RECLAIM_KEYS:
                values[key] = int(value)
    return values


def image_root(scenario):
    """Where a scenario's image goes: the work folder's file system when the image fits there with room to
    spare, else a tmpfs (the report says which)."""
    need = footprint(scenario)[1] * GIB * 1.1 + 2 * GIB
    if shutil.disk_usage(C.WORK).free >= need:
        return C.WORK, "disk"
    os.makedirs(TMPFS, exist_ok=True)
    if shutil.disk_usage(TMPFS).free >= need:
        return TMPFS, "tmpfs"
    raise RuntimeError(f"no room for a {need / GIB:.0f} GiB image in {C.WORK} or {TMPFS}")


def workload_cmd(kind, size, procs, state_file, extra=(), env=None):
    """A scenario's workload: (command line, environment, the port a server answers on or None)."""
    if kind == "memcheck":
        cmd = [MEMCHECK, "--mb", str(size), "--state", state_file, "--interval-ms", "50"]
        if procs > 1:
            cmd += ["--children", str(procs - 1)]
    elif kind == "llm":
        cmd = [sys.executable, FRAMEWORK, "transformers", "--config", "gpt2", "--kv-mb", str(size),
               "--state", state_file, "--interval-ms", "50"]
        env = offline_env(env)
    elif kind == "serve":
        port = free_port()
        return serve_cmd(size, extra, port, state_file), serving_env(env), port
    else:
        cmd = [sys.executable, TORCH, "--gb", str(size), "--state", state_file, "--interval-ms", "50"]
    return cmd + list(extra), env, None


class Workload:
    def __init__(self, kind, size, procs, name, extra=(), env=None):
        self.state = os.path.join(C.WORK, f"{name}.state")
        self.files = [self.state] + [f"{self.state}.{k}" for k in range(procs - 1)]
        self.clear_state()
        cmd, env, self.port = workload_cmd(kind, size, procs, self.state, extra, env)
        self.batches = BATCHES
        self.kind = kind
        self.t0 = time.monotonic()
        self.out = os.path.join(C.WORK, f"{name}.out")
        self.proc = start(cmd, self.out, env)
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
        # The processes that write the state files, and the tree's root (a server's front, whose engine
        # writes its state file).
        self.pids = sorted({self.proc.pid, *(int(state(f)["pid"]) for f in self.files)})
        if kind == "serve":  # what every answer after a restore must equal, token for token, logit for logit
            self.answers = {self.batches[0]: answer(self.port, self.batches[0])}
            self.answer_at = time.monotonic()  # the first answer
            self.answers.update({b: answer(self.port, b) for b in self.batches[1:]})

    def clear_state(self):
        for f in self.files:
            if os.path.exists(f):
                os.unlink(f)

    def iterations(self):
        return [int(state(f).get("iterations", -1)) for f in self.files]

    def healthy_after(self, before, timeout=120):
        """Seconds until every process has done a verified iteration past `before`; for a server, until its
        first answer, which must equal the one before the dump (and so must the answers for every batch
        size after it)."""
        if self.kind == "serve":
            t = wait_for("the server's first answer after the restore",
                         lambda: answer(self.port, 1, quiet=True) is not None, timeout)
            for b in self.batches:
                got = answer(self.port, b)
                if got != self.answers[b]:
                    raise RuntimeError(f"answer for batch {b} after the restore differs: {got} != {self.answers[b]}")
            return t
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
    sampler = MemSampler(w.pids)
    rc, secs, rss = run_criu(variant, ["restore", "-D", img, "-d", "-L", libdir, "-v4", "-o", logname])
    w.restore_memory = sampler.stop("restore")
    if rc != 0:
        raise RuntimeError(f"criu restore failed (exit {rc}); see {logname}")
    ready = w.healthy_after(before) - t0
    return secs, device_seconds(os.path.join(img, logname), {9}), rss, ready


def dump_and_restore(variant, w, name, scenario, cold_too=False):
    """Dumps the running workload w with one variant, restores it, waits until it has verified its data
    again, then kills it; with cold_too restores the same image once more with the page cache dropped.
    Returns the figures of that round trip."""
    root, where = image_root(scenario)
    img = os.path.join(root, "img-" + name)
    shutil.rmtree(img, ignore_errors=True)
    os.makedirs(img)
    libdir = VARIANTS[variant]["libdir"]
    r = {"image_fs": where}
    try:
        after_rewrite(name, w.iterations)
        sampler = MemSampler(w.pids)
        rc, dump_s, dump_rss = run_criu(variant, ["dump", "-t", str(w.pid), "-D", img, "-L", libdir, "-v4",
                                                  "-o", "dump.log"])
        if rc != 0:
            raise RuntimeError(f"criu dump failed (exit {rc}); see {name}-dump.log")
        r.update(sampler.stop("dump"))
        before = w.iterations()
        wait_for("the dumped processes to exit", lambda: all(gone(p) for p in w.pids), 60)
        # The state files as the dump left them: put back before the cold restore (a workload that keeps
        # its state file open needs it there, at its size, and its progress is judged from these values).
        at_dump = {f: open(f, "rb").read() for f in w.files if os.path.exists(f)}
        r.update(dump_s=dump_s, device_dump_s=device_seconds(os.path.join(img, "dump.log"), {10, 11}))
        r["criu_dump_s"] = max(0.0, dump_s - r["device_dump_s"])
        r.update(parse_dump_log(os.path.join(img, "dump.log")))
        r.update(image_sizes(img))
        if C.COLD_CACHE:
            r["sync_s"] = drop_page_cache()
        r["cold_cache"] = C.COLD_CACHE
        restore_s, device_s, restore_rss, ready = restore(variant, w, img, "restore.log", before)
        r.update(restore_s=restore_s, device_restore_s=device_s, criu_restore_s=max(0.0, restore_s - device_s),
                 restore_to_ready_s=ready, criu_peak_mib=max(dump_rss, restore_rss), **w.restore_memory)
        r.update(parse_restore_log(os.path.join(img, "restore.log")))
        w.kill()
        if cold_too and not C.COLD_CACHE:
            # The same image again, read from the disk: its processes' pids are free again.
            try:
                for f, data in at_dump.items():
                    with open(f, "r+b" if os.path.exists(f) else "wb") as out:
                        out.write(data)
                        out.truncate(len(data))
                r["sync_s"] = drop_page_cache()
                read0, reclaim0 = disk_read_bytes(), reclaim_counters()
                restore_s, device_s, restore_rss, ready = restore(variant, w, img, "restore-cold.log", before)
                r["cold_read_gib"] = (disk_read_bytes() - read0) / GIB  # to the first answer (ready)
                r["cold_reclaim"] = {k: v - reclaim0.get(k, 0) for k, v in reclaim_counters().items()}
                taken = sum(r["cold_reclaim"].get(k, 0) for k in ("pgsteal_kswapd", "pgsteal_direct"))
                if taken or r["cold_reclaim"].get("workingset_refault_file"):
                    log(f"{name}: during the cold restore the kernel took back {taken * 4096 / GIB:.2f} GiB of "
                        f"memory and {r['cold_reclaim'].get('workingset_refault_file', 0) * 4096 / GIB:.2f} GiB "
                        f"of file pages were read again: {r['cold_reclaim']}")
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
                shutil.copy(os.path.join(img, logname), os.path.join(C.WORK, "logs", f"{name}-{logname}"))
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
    r.update(dump_and_restore(variant, w, name, scenario, cold_too))
    r["trip_s"] = time.monotonic() - t0
    msg = (f"{name}: dump {r['dump_s']:.2f} s (hooks {r['device_dump_s']:.2f}"
           + (f", driver checkpoint {r['checkpoint_s']:.2f}" if "checkpoint_s" in r else "")
           + (f", GPU image write {r['write_s']:.2f}: {r['written_gib']:.2f} of {r['gpu_image_gib']:.1f} GiB, "
              f"{r['zero_pct']:.1f}% zero" if "write_s" in r else "")
           + f"), restore {r['restore_s']:.2f} s (hooks {r['device_restore_s']:.2f})"
           + (f", cold {r['restore_cold_s']:.2f} s" if "restore_cold_s" in r else "")
           + f", image {r['image_gib']:.2f} GiB ({r['image_alloc_gib']:.2f} allocated, {r['image_fs']}), data verified"
           + f"; peak RSS {r['dump_peak_rss_gib']:.1f} GiB, page cache +{r['dump_cache_gib']:.1f} GiB"
           + (f"; restore: page cache +{r['restore_cache_gib']:.1f} GiB, shared memory +{r['restore_shmem_gib']:.1f} GiB "
              f"at most, +{r['restore_shmem_after_gib']:.1f} GiB once done" if "restore_shmem_gib" in r else "")
           + f"; {r['trip_s']:.0f} s")
    log(msg)
    return r


def cold_start(rounds, out):
    """Start-up of a PyTorch workload with an expensive start (torch.compile + CUDA graphs) from scratch,
    with empty and with warm compile caches, against restore-to-ready with each plugin. Appends to out."""
    env = compile_env()
    compiled = ["--compile", "reduce-overhead"]
    for rnd in range(rounds):
        for caches in ("empty", "warm"):
            if caches == "empty":
                shutil.rmtree(COMPILE_CACHE, ignore_errors=True)
            w = Workload("torch", 2, 1, f"cold-{caches}-{rnd}", compiled, env)
            out.append({"what": f"cold start, {caches} caches", "round": rnd, "seconds": w.ready_at - w.t0})
            log(f"cold start with {caches} compile caches: {w.ready_at - w.t0:.2f} s")
            w.kill()
        for variant in VARIANTS:
            name = f"compiled-{variant}-{rnd}"
            ready = dump_and_restore(variant, Workload("torch", 2, 1, name, compiled, env), name, "torch")["restore_to_ready_s"]
            out.append({"what": f"restore-to-ready, {variant}", "round": rnd, "seconds": ready})
            log(f"{name}: restore-to-ready {ready:.2f} s, data verified")
    return out


def serve_cold_start(scenario, out):
    """A server's start from scratch to its first answer, as a node that has not run it starts it: with empty
    compile caches (the first start on the node), then with warm compile caches and the weights in the page
    cache, then with the page cache dropped. Appends to out (and each start's phases and bytes read)."""
    kind, size, procs, extra = SCENARIOS[scenario]
    for how in ("empty compile caches", "weights in the page cache", "page cache dropped"):
        if how.startswith("empty"):
            shutil.rmtree(COMPILE_CACHE, ignore_errors=True)
        if how.startswith("page cache"):
            drop_page_cache()
        read0 = disk_read_bytes()
        w = Workload(kind, size, procs, f"{scenario}-start-{len(out)}", extra)
        st = state(w.state)
        row = {"what": f"{scenario}: cold start, {how}", "round": 0, "seconds": w.answer_at - w.t0,
               "read_gib": (disk_read_bytes() - read0) / GIB,
               **{k: float(st[k]) for k in ("load_s", "kv_s", "compile_s", "ready_s") if k in st}}
        out.append(row)
        log(f"{scenario}: cold start ({how}): first answer in {row['seconds']:.2f} s (load {row.get('load_s', 0):.1f}"
            f" s, KV arena {row.get('kv_s', 0):.1f} s, compile + CUDA graphs {row.get('compile_s', 0):.1f} s), "
            f"{row['read_gib']:.1f} GiB read from disk")
        w.kill()
    return out


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def incremental_trip(variant, scenario, rnd):
    """Periodic checkpoints: a full dump that leaves the workload running, then, a few seconds on, a dump
    against it (--track-mem --prev-images-dir: CRIU's incremental dump, in which our plugin references the
    GPU chunks unchanged since the first); then the second image is restored and the data verified."""
    kind, size, procs, *extra = SCENARIOS[scenario]
    name = f"{scenario}-incr-{variant}-{rnd}"
    t0 = time.monotonic()
    w = Workload(kind, size, procs, name, extra[0] if extra else ())
    root, where = image_root(scenario)
    imgs = [os.path.join(root, f"img-{name}-{i}") for i in (1, 2)]
    libdir = VARIANTS[variant]["libdir"]
    r = {"variant": variant, "scenario": scenario, "round": rnd, "incremental": True, "image_fs": where}
    try:
        for i, img in enumerate(imgs):
            shutil.rmtree(img, ignore_errors=True)
            os.makedirs(img)
            more = ["-R", "--track-mem"] if i == 0 else ["--track-mem", "--prev-images-dir", "../" + os.path.basename(imgs[0])]
            after_rewrite(name, w.iterations)
            rc, secs, _ = run_criu(variant, ["dump", "-t", str(w.pid), "-D", img, "-L", libdir, "-v4", "-o", "dump.log"] + more)
            shutil.copy(os.path.join(img, "dump.log"), os.path.join(C.WORK, "logs", f"{name}-dump{i + 1}.log"))
            if rc != 0:
                raise RuntimeError(f"criu dump {i + 1} failed (exit {rc}); see {name}-dump{i + 1}.log")
            figures = parse_dump_log(os.path.join(img, "dump.log"))
            sizes = image_sizes(img)
            tag = "full" if i == 0 else "incr"
            r.update({f"{tag}_dump_s": secs, f"{tag}_image_alloc_gib": sizes["image_alloc_gib"],
                      f"{tag}_written_gib": figures.get("written_gib"), f"{tag}_write_s": figures.get("write_s"),
                      f"{tag}_parent_gib": figures.get("parent_gib", 0.0), "gpu_state_gib": figures.get("gpu_state_gib")})
            if i == 0:
                time.sleep(3.0)  # the workload runs on between the two checkpoints
        before = w.iterations()
        wait_for("the dumped processes to exit", lambda: all(gone(p) for p in w.pids), 60)
        restore_s, device_s, _, ready = restore(variant, w, imgs[1], "restore.log", before)
        r.update(restore_s=restore_s, restore_to_ready_s=ready)
    finally:
        try:
            w.kill()
        except RuntimeError as e:
            log(f"{name}: {e}")
        if os.path.exists(os.path.join(imgs[1], "restore.log")):
            shutil.copy(os.path.join(imgs[1], "restore.log"), os.path.join(C.WORK, "logs", f"{name}-restore.log"))
        for img in reversed(imgs):
            shutil.rmtree(img, ignore_errors=True)
    r["trip_s"] = time.monotonic() - t0
    log(f"{name}: full dump {r['full_dump_s']:.2f} s, image {r['full_image_alloc_gib']:.2f} GiB; second dump "
        f"{r['incr_dump_s']:.2f} s, image {r['incr_image_alloc_gib']:.2f} GiB"
        + (f" ({r['incr_parent_gib']:.2f} GiB of GPU state referenced in the first)" if r.get("incr_parent_gib") else "")
        + f"; restore of the second {r['restore_s']:.2f} s, data verified")
    return r

