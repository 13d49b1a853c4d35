#!/usr/bin/env python3
"""How much of what CRIU would write of a process's own memory is zero-filled pages.

    python3 bench_zero_pages.py PID        # a running process (root: /proc/PID/mem and its page frames)
    python3 bench_zero_pages.py --serve    # the serve scenario's server, started as bench.py starts it

Reads the present pages of the process's private anonymous mappings (what CRIU dumps into pages-N.img) and
counts the 4 KiB pages that hold only zeros, by the length of their runs, leaving out those mapped to the
kernel's shared zero page (which CRIU skips already). Needs numpy (the GPU machine's Python has it).
"""
import mmap
import os
import re
import subprocess
import sys
import time

import numpy as np

PAGE = 4096
PFN_MASK = np.uint64((1 << 55) - 1)
RUN_CLASSES = (1, 16, 512)  # pages: any, 64 KiB or more, 2 MiB or more


def shared_zero_pfn():
    """The page frame of the kernel's zero page: what an untouched private anonymous page maps once read."""
    m = mmap.mmap(-1, PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m[0]  # a read fault maps the zero page
    addr = np.frombuffer(m, dtype=np.uint8).__array_interface__["data"][0]
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // PAGE * 8)
        entry = int.from_bytes(f.read(8), "little")
    return entry & int(PFN_MASK)


def zero_pages(pid):
    """(present pages, zero-filled pages, {run class: zero pages in runs of at least that many}, biggest
    mappings as (present, zero, line))."""
    zero_pfn = np.uint64(shared_zero_pfn())
    pagemap = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
    mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    present_total = zero_total = 0
    runs = dict.fromkeys(RUN_CLASSES, 0)
    mappings = []
    try:
        for line in open(f"/proc/{pid}/maps").read().splitlines():
            f = line.split()
            perms, inode, path = f[1], f[4], (f[5] if len(f) > 5 else "")
            if perms[0] != "r" or perms[3] != "p" or inode != "0" or (path and path not in ("[heap]", "[stack]")):
                continue
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            n = (hi - lo) // PAGE
            entries = np.frombuffer(os.pread(pagemap, n * 8, lo // PAGE * 8), dtype=np.uint64)
            present = ((entries >> np.uint64(63)) & np.uint64(1)).astype(bool) & ((entries & PFN_MASK) != zero_pfn)
            zero = np.zeros(n, dtype=bool)
            idx = np.nonzero(present)[0]
            if len(idx):
                starts = np.r_[0, np.nonzero(np.diff(idx) != 1)[0] + 1]
                for s, e in zip(starts, np.r_[starts[1:], len(idx)]):
                    a, b = int(idx[s]), int(idx[e - 1]) + 1  # a run of present pages, read 32 MiB at a time
                    for c in range(a, b, 8192):
                        data = np.frombuffer(os.pread(mem, (min(b, c + 8192) - c) * PAGE, lo + c * PAGE),
                                             dtype=np.uint64)
                        got = len(data) * 8 // PAGE
                        zero[c:c + got] = ~data[:got * PAGE // 8].reshape(got, PAGE // 8).any(axis=1)
            present_total += len(idx)
            zero_total += int(zero.sum())
            mappings.append((len(idx), int(zero.sum()), line[:100]))
            zi = np.nonzero(zero)[0]
            if len(zi):
                breaks = np.nonzero(np.diff(zi) != 1)[0] + 1
                for length in np.diff(np.r_[0, breaks, len(zi)]):
                    for k in RUN_CLASSES:
                        if length >= k:
                            runs[k] += int(length)
    finally:
        os.close(pagemap)
        os.close(mem)
    return present_total, zero_total, runs, sorted(mappings, reverse=True)[:12]


def report(pid):
    t = time.monotonic()
    present, zero, runs, biggest = zero_pages(pid)
    gib = PAGE / 2**30
    print(f"pid {pid}: present private anonymous pages {present * gib:.3f} GiB, zero-filled {zero * gib:.3f} GiB "
          f"({100.0 * zero / max(present, 1):.1f} %); read in {time.monotonic() - t:.1f} s")
    for k in RUN_CLASSES:
        print(f"  zero pages in runs of >= {k * PAGE // 1024} KiB: {runs[k] * gib:.3f} GiB")
    for p, z, line in biggest:
        print(f"  {p * PAGE / 2**20:9.1f} MiB present, {z * PAGE / 2**20:9.1f} MiB zero  {line}")


def serve():
    """Starts the serve scenario's server as bench.py does and reports it once it answers."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_run as R
    cmd = R.serve_cmd(16384, ("6",), 8499, "/var/tmp/bench-zero-pages.state")
    p = subprocess.Popen(cmd, env=R.serving_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in p.stdout:
            m = re.match(r"ready pid=(\d+)", line)
            if m:
                report(int(m.group(1)))
                return
        sys.exit(f"the server exited with {p.wait()} before it was ready")
    finally:
        p.kill()
        p.wait()


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    elif len(sys.argv) == 2 and sys.argv[1].isdigit():
        report(int(sys.argv[1]))
    else:
        sys.exit(__doc__)
