#!/usr/bin/env python3
"""PyTorch processes that share GPU memory (CUDA IPC), or one NCCL rank, for checkpoint/restore tests.

    torch_ipc_workload.py ipc --state FILE [--mb M]    a parent and a child started with
        torch.multiprocessing (spawn): the parent fills a CUDA tensor and hands it to the child through a
        queue (cudaIpcGetMemHandle / cudaIpcOpenMemHandle underneath); both check its sum forever. The
        parent writes FILE, the child FILE.0.
    torch_ipc_workload.py event --state FILE          the same pair sharing a CUDA IPC event
        (torch.cuda.Event(interprocess=True); cudaIpcGetEventHandle / cudaIpcOpenEventHandle) that the
        parent records after each check and the child waits on; no memory is shared.
    torch_ipc_workload.py exporter --state FILE [--mb M]   the parent shares its tensor with a child that
        checks it once and exits: an exporter whose importer is gone. At SIGUSR1 it shares a new tensor
        with a new child and writes reexport=ok, or reexport=FAIL and the error, to FILE.
    torch_ipc_workload.py nccl --state FILE             one process, torch.distributed with the NCCL
        backend and world size 1 (a FileStore): all_reduce of a fixed tensor, checked bit for bit.

State files (rewritten in place through one fd, fixed size): pid=P  iterations=N  status=ok|FAIL ...
"""
import argparse
import os
import sys
import time

import torch
import torch.multiprocessing as mp


class State:
    SIZE = 512

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.n = 0
        self.extra = ""

    def write(self, status):
        text = f"pid={os.getpid()}\niterations={self.n}\nstatus={status}\n{self.extra}".encode()
        os.pwrite(self.fd, text.ljust(self.SIZE, b" ")[: self.SIZE], 0)

    def ok(self):
        self.n += 1
        self.write("ok")


def check_forever(state, tensor, expected):
    while True:
        got = tensor.sum().item()
        if got != expected:
            state.write(f"FAIL sum {got!r} != {expected!r}")
            sys.exit(2)
        state.ok()
        time.sleep(0.1)


def child_main(queue, path):
    tensor, expected = queue.get()
    check_forever(State(path), tensor, expected)


def ipc(args):
    n = args.mb * (1 << 20) // 4
    tensor = torch.arange(n, device="cuda", dtype=torch.float32).remainder_(977)
    expected = tensor.sum().item()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=child_main, args=(queue, args.state + ".0"))
    child.start()
    queue.put((tensor, expected))
    check_forever(State(args.state), tensor, expected)


def event_child(queue, path):
    event = queue.get()
    state = State(path)
    while True:
        event.synchronize()
        state.ok()
        time.sleep(0.1)


def event(args):
    tensor = torch.arange(args.mb * (1 << 20) // 4, device="cuda", dtype=torch.float32).remainder_(977)
    expected = tensor.sum().item()
    shared = torch.cuda.Event(interprocess=True)
    shared.record()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=event_child, args=(queue, args.state + ".0"))
    child.start()
    queue.put(shared)
    state = State(args.state)
    while True:
        got = tensor.sum().item()
        if got != expected:
            state.write(f"FAIL sum {got!r} != {expected!r}")
            sys.exit(2)
        shared.record()
        state.ok()
        time.sleep(0.1)


def check_once(queue, result):
    tensor, expected = queue.get()
    result.put(tensor.sum().item() == expected)


def share_with_a_child(ctx, tensor, expected):
    """Shares tensor with a new child that checks it once and exits; whether it saw the right sum."""
    queue, result = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=check_once, args=(queue, result))
    child.start()
    queue.put((tensor, expected))
    ok = result.get(timeout=120)
    child.join()
    return ok


def exporter(args):
    import signal
    n = args.mb * (1 << 20) // 4
    tensor = torch.arange(n, device="cuda", dtype=torch.float32).remainder_(977)
    expected = tensor.sum().item()
    ctx = mp.get_context("spawn")
    if not share_with_a_child(ctx, tensor, expected):
        sys.exit("the child saw another sum")
    state = State(args.state)
    again = []
    signal.signal(signal.SIGUSR1, lambda *_: again.append(1))
    while True:
        if again:
            again.clear()
            try:
                fresh = torch.full((1 << 20,), 3.0, device="cuda")
                ok = share_with_a_child(ctx, fresh, fresh.sum().item())
                state.extra = "reexport=ok\n" if ok else "reexport=FAIL the child saw another sum\n"
            except Exception as e:  # what a re-export after the restore gets is the point
                state.extra = f"reexport=FAIL {type(e).__name__}: {e}"[:300].replace("\n", " ") + "\n"
        got = tensor.sum().item()
        if got != expected:
            state.write(f"FAIL sum {got!r} != {expected!r}")
            sys.exit(2)
        state.ok()
        time.sleep(0.1)


def nccl(args):
    import torch.distributed as dist
    store = args.state + ".store"
    if os.path.exists(store):
        os.unlink(store)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    x = torch.linspace(-1, 1, 1 << 20, device="cuda")
    expected = None
    state = State(args.state)
    while True:
        y = x.clone()
        dist.all_reduce(y)
        got = y.double().sum().item()
        if expected is None:
            expected = got
        if got != expected:
            state.write(f"FAIL all_reduce {got!r} != {expected!r}")
            sys.exit(2)
        state.ok()
        time.sleep(0.1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["ipc", "event", "exporter", "nccl"])
    p.add_argument("--state", required=True)
    p.add_argument("--mb", type=int, default=256)
    args = p.parse_args()
    {"ipc": ipc, "event": event, "exporter": exporter, "nccl": nccl}[args.mode](args)


if __name__ == "__main__":
    main()
