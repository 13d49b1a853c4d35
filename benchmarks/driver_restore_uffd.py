"""Can the driver's restore start before the host copy of a process's GPU state is all there?

A probe for a restore that overlaps the driver's restore with the image's read (docs/gpu-image.md,
"What a cold restore still waits for"). A torch process fills GPU memory with seeded random bytes. This
script (the controller) locks and checkpoints it with the driver (cuCheckpointProcess*), finds the
driver's copy (anonymous memory new in /proc/PID/maps, as the plugin finds it), and has the process
replace that copy with fresh memory registered with userfaultfd (missing pages), holding the bytes
aside. Then the driver's restore runs; every page it touches faults, and the process's handler thread
supplies the 2 MiB block around it (UFFDIO_COPY), logging when. Afterwards the process checks its GPU
memory against the seed. A first cycle without userfaultfd is the baseline.

Prints, per cycle: the driver's restore and unlock seconds; for the lazy cycle the faults (blocks served),
the time of the first and of the last one after the restore call began, and the bytes served by each
tenth of the restore, the share of faults in ascending order of address; and whether the data came back
equal. Usage (root, a GPU, torch):
    python3 driver_restore_uffd.py [--gib 4] [--out results.json]
--self-test (no GPU; CI runs it) checks the mechanisms on this kernel with a reader thread standing in for
the driver: the probe's own (fresh anonymous memory, each block copied in on its fault), and the one a
restore would use (a MAP_PRIVATE mapping of a memory file: the block written into the file, then the reader
woken, which maps the file's page). Exit 77 where userfaultfd is not allowed here.
"""
import argparse
import ctypes
import json
import mmap
import os
import select
import struct
import subprocess
import sys
import threading
import time

BLOCK = 2 << 20
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
libc.memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]

SYS_USERFAULTFD = 323  # x86_64
UFFD_API = 0xAA
UFFDIO_API = 0xC018AA3F
UFFDIO_REGISTER = 0xC020AA00
UFFDIO_COPY = 0xC028AA03
UFFDIO_WAKE = 0x8010AA02
UFFDIO_REGISTER_MODE_MISSING = 1
UFFD_EVENT_PAGEFAULT = 0x12
PROT_RW, MAP_PRIVATE_ANON_FIXED = 0x3, 0x02 | 0x20 | 0x10


def ioctl(fd, req, buf):
    if libc.ioctl(fd, req, ctypes.addressof(buf)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"ioctl {req:#x}: {os.strerror(e)}")


def new_uffd():
    """A userfaultfd of this process, its API agreed."""
    uffd = libc.syscall(SYS_USERFAULTFD, os.O_CLOEXEC | os.O_NONBLOCK)
    if uffd < 0:
        raise OSError(ctypes.get_errno(), "userfaultfd")
    ioctl(uffd, UFFDIO_API, (ctypes.c_uint64 * 3)(UFFD_API, 0, 0))
    return uffd


def register(uffd, start, size):
    ioctl(uffd, UFFDIO_REGISTER, (ctypes.c_uint64 * 4)(start, size, UFFDIO_REGISTER_MODE_MISSING, 0))


def faults(uffd):
    """The page addresses of uffd's page faults, as they come (for ever)."""
    msg = bytearray(32)
    while True:
        select.select([uffd], [], [], 1.0)
        try:
            n = os.readv(uffd, [msg])
        except BlockingIOError:  # another thread took it
            continue
        if n == 32 and msg[0] == UFFD_EVENT_PAGEFAULT:
            yield struct.unpack_from("<Q", msg, 16)[0] & ~0xFFF


# ---- the target process ----

def target(gib):
    import torch
    n = gib * (1 << 28)  # float32 elements
    torch.manual_seed(7)
    data = [torch.randn(n // 8, device="cuda") for _ in range(8)]
    torch.cuda.synchronize()
    sums = [float(t.double().sum()) for t in data]
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "arm":
            print("armed " + json.dumps(LAZY.arm(json.loads(arg))), flush=True)
        elif cmd == "report":
            print("report " + json.dumps(LAZY.report()), flush=True)
        elif cmd == "verify":
            torch.manual_seed(7)
            again = [torch.randn(n // 8, device="cuda") for _ in range(8)]
            same = all(torch.equal(a, b) for a, b in zip(data, again))
            print("verified " + json.dumps({"equal": same, "sums": sums == [float(t.double().sum()) for t in data]}),
                  flush=True)
        elif cmd == "exit":
            return


class Lazy:
    """The driver's copy replaced by missing pages, served a 2 MiB block at a time on a fault."""

    def __init__(self):
        self.saved, self.served, self.log, self.uffd = [], set(), [], -1

    def arm(self, ranges):
        self.uffd = new_uffd()
        total = 0
        for start, end in ranges:
            size = end - start
            keep = mmap.mmap(-1, size)
            keep_addr = ctypes.addressof(ctypes.c_char.from_buffer(keep))
            libc.memcpy(keep_addr, start, size)
            self.saved.append((start, end, keep, keep_addr))
            # Fresh memory at the same place, as a restored process has: nothing of the old pages.
            if libc.mmap(start, size, PROT_RW, MAP_PRIVATE_ANON_FIXED, -1, 0) != start:
                raise OSError(ctypes.get_errno(), "mmap")
            register(self.uffd, start, size)
            total += size
        for _ in range(8):  # the copies run outside the GIL: 8 at once
            threading.Thread(target=self.serve, daemon=True).start()
        return {"ranges": len(ranges), "bytes": total}

    def source(self, addr):
        for start, end, _, keep_addr in self.saved:
            if start <= addr < end:
                block = addr - (addr - start) % BLOCK
                return block, min(BLOCK, end - block), keep_addr + (block - start)
        return None

    def serve(self):
        for addr in faults(self.uffd):
            src = self.source(addr)
            if src is None:
                continue
            block, length, from_addr = src
            copy = (ctypes.c_int64 * 5)(block, from_addr, length, 0, 0)
            try:
                ioctl(self.uffd, UFFDIO_COPY, copy)
            except OSError as e:  # EEXIST: served already (a fault queued twice)
                if e.errno != 17:
                    self.log.append((time.time(), block, -e.errno))
                    continue
            self.served.add(block)
            self.log.append((time.time(), block, length))

    def report(self):
        return {"faults": len(self.log), "blocks": len(self.served), "log": self.log}


LAZY = Lazy()


# ---- the controller ----

cuda = None


def drv(name, *args):
    r = getattr(cuda, name)(*args)
    if r != 0:
        raise RuntimeError(f"{name}: CUresult {r}")


def anon_ranges(pid):
    out = set()
    for line in open(f"/proc/{pid}/maps"):
        f = line.split()
        if len(f) == 5 and f[1].startswith("rw") and f[1][3] == "p":
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            out.add((lo, hi))
    return out


def cycle(p, lazy):
    pid = p.pid
    before = anon_ranges(pid)
    t = time.time()
    drv("cuCheckpointProcessLock", pid, None)
    drv("cuCheckpointProcessCheckpoint", pid, None)
    ckpt = time.time() - t
    new = sorted(r for r in anon_ranges(pid) - before if r[1] - r[0] >= BLOCK)
    armed = None
    if lazy:
        p.stdin.write("arm " + json.dumps(new) + "\n")
        p.stdin.flush()
        armed = json.loads(expect(p, "armed"))
    t0 = time.time()
    out = {"lazy": lazy, "checkpoint_s": ckpt, "new_ranges": len(new), "new_bytes": sum(b - a for a, b in new),
           "armed": armed}
    try:
        drv("cuCheckpointProcessRestore", pid, None)
        t1 = time.time()
        drv("cuCheckpointProcessUnlock", pid, None)
        out.update(restore_s=t1 - t0, unlock_s=time.time() - t1)
    except RuntimeError as e:  # what the driver says of lazily supplied memory is the finding
        t1 = time.time()
        out.update(error=str(e), failed_after_s=t1 - t0)
    if lazy:
        p.stdin.write("report\n")
        p.stdin.flush()
        rep = json.loads(expect(p, "report"))
        log = rep["log"]
        out["faults"], out["blocks"] = rep["faults"], rep["blocks"]
        if log:
            out["first_fault_s"], out["last_fault_s"] = log[0][0] - t0, log[-1][0] - t0
            tenths = [0] * 10
            for when, _, n in log:
                tenths[min(9, max(0, int((when - t0) / (t1 - t0) * 10)))] += max(n, 0)
            out["served_gib_by_tenth"] = [round(x / (1 << 30), 3) for x in tenths]
            out["errors"] = [e for _, _, e in log if e < 0][:5]
            blocks = [b for _, b, n in log if n > 0]
            # The driver's order: the share of faults on a block above the one before (1.0: ascending).
            out["ascending"] = round(sum(b > a for a, b in zip(blocks, blocks[1:])) / max(1, len(blocks) - 1), 3)
    if "error" not in out:
        p.stdin.write("verify\n")
        p.stdin.flush()
        out["verified"] = json.loads(expect(p, "verified"))
    return out


def expect(p, word):
    while True:
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"the target exited before '{word}'")
        if line.startswith(word):
            return line[len(word):].strip() or "null"


def reader_sees(addr, want, what):
    """What a thread outside the GIL (as the driver's is) reads at addr equals want. A reader still held
    after 20 s (a fault nobody supplied) fails the test there and then."""
    out = ctypes.create_string_buffer(len(want))
    # ctypes lets go of the GIL in memcpy: the handler threads can run meanwhile.
    reader = threading.Thread(target=libc.memcpy, args=(ctypes.addressof(out), addr, len(want)), daemon=True)
    reader.start()
    reader.join(20)
    if reader.is_alive():
        print(f"FAIL: {what}: the reader is still held by a fault after 20 s", flush=True)
        os._exit(1)
    return out.raw == want


def self_test():
    size = 16 * BLOCK
    data = os.urandom(size)
    # The probe's way: fresh anonymous memory, each block copied in on its fault.
    buf = mmap.mmap(-1, size)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    buf[:] = data
    lazy = Lazy()
    try:
        lazy.arm([(addr, addr + size)])
    except OSError as e:
        print(f"SKIP: userfaultfd is not allowed here: {e}")
        return 77
    ok = reader_sees(addr, data, "anonymous memory") and len(lazy.served) == 16
    print(f"{'ok' if ok else 'FAIL'}: anonymous memory, {len(lazy.served)} of 16 blocks copied in on their faults")
    # A restore's way: a MAP_PRIVATE mapping of a memory file, its pages missing until written into the file.
    fd = os.memfd_create("decoded")
    os.ftruncate(fd, size)
    at = libc.mmap(None, size, 0x1, 0x02, fd, 0)
    uffd = new_uffd()
    register(uffd, at, size)
    written = []

    def decode_on_fault():
        for fault in faults(uffd):
            block = (fault - at) // BLOCK * BLOCK
            os.pwrite(fd, data[block:block + BLOCK], block)
            ioctl(uffd, UFFDIO_WAKE, (ctypes.c_uint64 * 2)(at + block, BLOCK))
            written.append(block)
    threading.Thread(target=decode_on_fault, daemon=True).start()
    ok2 = reader_sees(at, data, "a memory file") and sorted(written) == list(range(0, size, BLOCK))
    print(f"{'ok' if ok2 else 'FAIL'}: a private mapping of a memory file, {len(written)} of 16 blocks written "
          "into the file on their faults, the reader woken")
    return 0 if ok and ok2 else 1


def main():
    global cuda
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=int, default=4)
    ap.add_argument("--out")
    ap.add_argument("--self-test", action="store_true", help="check the mechanisms on this kernel (no GPU)")
    ap.add_argument("--target", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if a.target:
        return target(a.gib)
    cuda = ctypes.CDLL("libcuda.so.1")
    drv("cuInit", 0)
    p = subprocess.Popen([sys.executable, __file__, "--target", "--gib", str(a.gib)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    results = []
    try:
        expect(p, "ready")
        for lazy in (False, True):
            r = cycle(p, lazy)
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "log"}), flush=True)
        p.stdin.write("exit\n")
        p.stdin.flush()
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
