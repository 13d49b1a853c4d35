"""One image, many replicas (bench.py --replicas): a server dumped once and restored n times at once by plain
CRIU, each replica in pid, mount and network namespaces of its own, as docs/containers.md describes them
(the shell tests do the same with ns_exec and ns_criu_opts, tests/lib/common.sh)."""
import ctypes
import fcntl
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import bench_common as C
from bench_common import CRIU, SCENARIOS, VARIANTS, log
from bench_run import (BATCHES, MemSampler, after_rewrite, answer, bounded, criu_env, free_port, gone, image_root, resident, run_criu, serve_cmd,
                       serving_env, start, state, wait_for)

SIOCSIFFLAGS = 0x8914
IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x1, 0x8, 0x40
CLONE_NEWNET = 0x40000000


def loopback_up():
    """Brings lo up in this thread's network namespace (a new one has it down, with 127.0.0.1 unreachable)."""
    with socket.socket() as s:
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING))


# Run by the python that unshare starts as pid 1 of the new namespaces: the loopback up, stdio on /dev/null
# opened inside (CRIU cannot dump a file of a mount the new namespace does not have), no other fd, its own
# session (CRIU dumps a namespace whose init leads its session), then the server.
NS_INIT = f"""
import ctypes, fcntl, os, socket, struct, sys
with socket.socket() as s:
    fcntl.ioctl(s, {SIOCSIFFLAGS}, struct.pack("16sH14x", b"lo", {IFF_UP | IFF_LOOPBACK | IFF_RUNNING}))
libc = ctypes.CDLL(None, use_errno=True)
while os.path.ismount("/dev/shm") and libc.umount2(b"/dev/shm", 2) == 0:  # MNT_DETACH: the host's, unseen here
    pass
if libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 0, b"mode=1777") != 0:
    raise OSError(ctypes.get_errno(), "mount a /dev/shm of its own")
fd = os.open("/dev/null", os.O_RDWR)
for i in range(3):
    os.dup2(fd, i)
os.closerange(3, 65536)
os.setsid()
os.execvp(sys.argv[1], sys.argv[1:])
"""


def ns_start(cmd, env):
    """cmd as pid 1 of pid, mount and network namespaces of its own, with a /proc of its own: the driver needs
    it (cuInit fails with 304 in a pid namespace that sees the host's /proc), and a network namespace per
    replica keeps them apart (the driver listens on @cuda-uvmfd-<pid ns inode>-<pid>, which CRIU restores
    under the same name). And a /dev/shm of its own, as a container has: replicas restored at once into
    the host's would each restore the same ghost file there (the unlinked semaphore a PyTorch process
    holds: /dev/shm/sem.* (deleted)), and all but one fail with "Can't create ghost regfile: File exists"."""
    return start(["unshare", "--pid", "--fork", "--mount", "--mount-proc", "--net", sys.executable, "-c", NS_INIT] + cmd,
                 os.devnull, env)


def ns_criu_opts(pid):
    """(dump options, restore options) for a process that ns_start started: every mount it has but its root,
    /proc and /dev/shm (a tmpfs CRIU dumps and makes anew for each replica) external, restored as a bind of the same host path into a root bound from the host's; its
    network namespace made anew and left empty, so nothing to lock."""
    with open(f"/proc/{pid}/mountinfo") as f:
        points = sorted({line.split()[4] for line in f} - {"/", "/proc", "/dev/shm"})
    dump, restore = ["--empty-ns", "net", "--network-lock", "skip"], ["--empty-ns", "net", "--network-lock", "skip", "--root", "/"]
    for i, m in enumerate(points, 1):
        dump += ["--external", f"mnt[{m}]:m{i}"]
        restore += ["--external", f"mnt[m{i}]:{m}"]
    return dump, restore


def ns_pids(marker):
    """The processes whose command line holds marker and that are pid 1 of their pid namespace."""
    pids = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if marker.encode() not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{p}/status") as f:
                if any(line.startswith("NSpid:") and line.split()[-1] == "1" and len(line.split()) > 2 for line in f):
                    pids.append(int(p))
        except OSError:
            pass
    return sorted(pids)


LIBC = ctypes.CDLL(None, use_errno=True)


def in_netns(pid, fn):
    """fn() on a thread inside the network namespace of pid, with its loopback up (a restored replica's is
    made anew, down); its result, or its exception raised here."""
    result = {}

    def run():
        try:
            with open(f"/proc/{pid}/ns/net") as f:
                if LIBC.setns(f.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into the network namespace of pid {pid}")
            loopback_up()
            result["value"] = fn()
        except BaseException as e:  # noqa: BLE001 (handed to the caller)
            result["error"] = e
    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def answer_in(pid, port, batch, **kw):
    return in_netns(pid, lambda: answer(port, batch, **kw))


def kill_by_argument(marker):
    """SIGKILLs every process whose command line holds marker (replicas of one image share theirs), waits
    until they are gone."""
    pids = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if marker.encode() in f.read().split(b"\0"):
                    os.kill(int(p), signal.SIGKILL)
                    pids.append(int(p))
        except (OSError, ProcessLookupError):
            pass
    wait_for(f"the processes of {marker} to exit", lambda: all(gone(p) for p in pids), 60)


def servers_answering(port, n, expected, what, timeout=600):
    """Waits until n distinct servers behind port (bound with SO_REUSEPORT: the kernel hands each new
    connection to one of them) have each answered batch 1 with expected; returns the time of the last one's
    first answer. Any other answer fails."""
    seen = set()

    def all_answered():
        got = answer(port, BATCHES[0], quiet=True, timeout=60, who=True)
        if got:
            if got[1] != expected:
                raise ValueError(f"{what}: server {got[0]} answers {got[1]}, expected {expected}")
            seen.add(got[0])
        return len(seen) >= n
    try:
        return wait_for(f"{n} servers answering ({what})", all_answered, timeout)
    except RuntimeError as e:  # the time ran out (a wrong answer is a ValueError)
        raise RuntimeError(f"{e}: {len(seen)} of them answered") from None


def replicas_answering(pids, port, expected, what, timeout=600):
    """Waits until each replica (pid, each in its own network namespace) has answered batch 1 with
    expected; returns the time of the last one's first answer. Any other answer fails."""
    left = list(pids)

    def all_answered():
        for p in list(left):
            got = answer_in(p, port, BATCHES[0], quiet=True, timeout=60)
            if got is not None:
                if got != expected:
                    raise ValueError(f"{what}: replica {p} answers {got}, expected {expected}")
                left.remove(p)
        return not left
    try:
        return wait_for(f"{len(pids)} replicas answering ({what})", all_answered, timeout)
    except RuntimeError as e:
        raise RuntimeError(f"{e}: {len(pids) - len(left)} of them answered") from None


def held(pid):
    """What a replica holds in host memory, GiB: its resident set, the file pages of it (the image's GPU
    state mapped from the page cache, one copy for all replicas) and its proportional share (Pss)."""
    out = {"rss_gib": resident(pid) / C.GIB}
    try:
        with open(f"/proc/{pid}/status") as f:
            out.update({"file_gib": int(line.split()[1]) * 1024 / C.GIB for line in f if line.startswith("RssFile:")})
        with open(f"/proc/{pid}/smaps_rollup") as f:
            out.update({"pss_gib": int(line.split()[1]) * 1024 / C.GIB for line in f if line.startswith("Pss:")})
    except OSError:
        pass
    return out


def replicas(scenario, n, out, failures, cold_starts=True):
    """One image, n replicas: for each variant, a server started by ns_start is dumped, then its image
    restored n times at once, each replica in namespaces of its own; the time from the restores' start until
    every replica has answered, and answered as the server did before its dump, and what each holds in
    memory. Against it, n cold starts at once (warm compile caches, the weights in the page cache, serving
    one port side by side) until every server has answered. Appends to out, and a variant that fails to
    failures."""
    kind, size, _, extra = SCENARIOS[scenario]
    port, marker = free_port(), os.path.join(C.WORK, f"{scenario}-replica.state")
    expected = None
    for variant in VARIANTS:
        name = f"{scenario}-replicas-{variant}"
        img = os.path.join(image_root(scenario)[0], "img-" + name)
        shutil.rmtree(img, ignore_errors=True)
        os.makedirs(img)
        libdir = VARIANTS[variant]["libdir"]
        restores = []
        try:
            if os.path.exists(marker):
                os.unlink(marker)
            src = ns_start(serve_cmd(size, extra, port, marker), serving_env())
            wait_for(f"{name}: the server to be ready", lambda: state(marker).get("status") or src.poll() is not None, 600)
            if state(marker).get("status") != "ok":
                raise RuntimeError(f"{name}: the server did not start: {state(marker) or 'no state file'}")
            pid = ns_pids(marker)[0]
            answers = {b: answer_in(pid, port, b) for b in BATCHES}
            if expected is not None and answers[BATCHES[0]] != expected:
                raise RuntimeError(f"{name}: the server answers {answers[BATCHES[0]]}, an earlier one {expected}")
            expected = answers[BATCHES[0]]
            dump_opts, restore_opts = ns_criu_opts(pid)
            after_rewrite(name, lambda: state(marker).get("iterations"))
            rc, dump_s, _ = run_criu(variant, ["dump", "-t", str(pid), "-D", img, "-L", libdir, "-v4", "-o", "dump.log"] + dump_opts)
            if rc != 0:
                raise RuntimeError(f"{name}: criu dump failed (exit {rc}); see {name}-dump.log")
            wait_for("the dumped server to exit", lambda: not ns_pids(marker), 60)
            t0 = time.monotonic()
            host = MemSampler([])  # the host's page cache and shared memory (decoded GPU state) meanwhile
            restores = [subprocess.Popen([CRIU, "restore", "-D", img, "-d", "-L", libdir, "-v4", "-o", f"restore-{i}.log"]
                                         + restore_opts, env=criu_env(variant), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(n)]
            codes = [p.wait(timeout=bounded(600)) for p in restores]
            restored = time.monotonic() - t0
            host_memory = host.stop("restores")
            failed = [i for i, c in enumerate(codes) if c]
            if failed:
                raise RuntimeError(f"{name}: criu restore of replica(s) {', '.join(map(str, failed))} failed (exit "
                                   f"codes {codes}); see {name}-restore-{failed[0]}.log")
            pids = ns_pids(marker)
            if len(pids) != n:
                raise RuntimeError(f"{name}: {len(pids)} replicas run after {n} restores")
            ready = replicas_answering(pids, port, expected, f"{n} replicas of one image") - t0
            for p in pids:
                for b in BATCHES:
                    if answer_in(p, port, b) != answers[b]:
                        raise RuntimeError(f"{name}: replica {p}'s answer for batch {b} differs from the server's before its dump")
            memory = [held(p) for p in pids]
            out.append({"what": f"{scenario}: {n} replicas restored at once from one image, {variant}", "round": 0,
                        "seconds": ready, "restore_s": restored, "dump_s": dump_s, "replicas_memory": memory,
                        **host_memory})
            log(f"{name}: {n} restores at once {restored:.2f} s, every replica answering as before the dump "
                f"{ready:.2f} s after their start; while restoring the host's page cache grew by at most "
                f"{host_memory['restores_cache_gib']:.2f} GiB and its shared memory by {host_memory['restores_shmem_gib']:.2f} "
                f"GiB ({host_memory['restores_shmem_after_gib']:.2f} GiB once done); each holds " + ", ".join(
                    f"rss {m['rss_gib']:.2f} GiB (file {m.get('file_gib', 0):.2f}, pss {m.get('pss_gib', 0):.2f})" for m in memory))
        except Exception as e:  # noqa: BLE001 (what stops replicas is a finding: the next variant runs)
            log(f"{name}: FAILED: {e}")
            failures.append({"scenario": f"{scenario} ({n} replicas)", "variant": variant, "round": 0, "error": str(e)})
        finally:
            for p in restores:  # a restore past its time
                if p.poll() is None:
                    p.kill()
                    p.wait()
            kill_by_argument(marker)
            for logname in ["dump.log"] + [f"restore-{i}.log" for i in range(n)]:
                if os.path.exists(os.path.join(img, logname)):
                    shutil.copy(os.path.join(img, logname), os.path.join(C.WORK, "logs", f"{name}-{logname}"))
            shutil.rmtree(img, ignore_errors=True)
    if expected is None or not cold_starts:
        return out
    states = [os.path.join(C.WORK, f"{scenario}-cold-{i}.state") for i in range(n)]
    try:
        t0 = time.monotonic()
        for i, st in enumerate(states):
            start(serve_cmd(size, extra, port, st), os.path.join(C.WORK, f"{scenario}-cold-{i}.out"), serving_env())
        ready = servers_answering(port, n, expected, f"{n} cold starts") - t0
    finally:
        for st in states:
            kill_by_argument(st)
    out.append({"what": f"{scenario}: {n} cold starts at once (warm caches)", "round": 0, "seconds": ready})
    log(f"{scenario}: {n} cold starts at once: every server answering {ready:.2f} s after their start")
    return out
