#!/usr/bin/env python3
"""PyTorch processes that share GPU memory (CUDA IPC), or one NCCL rank, for checkpoint/restore tests.

    torch_ipc_workload.py ipc --state FILE [--mb M]    a parent and a child started with
        torch.multiprocessing (spawn): the parent fills a CUDA tensor and hands it to the child through a
        queue (cudaIpcGetMemHandle / cudaIpcOpenMemHandle underneath); both check its sum forever. The
        parent writes FILE, the child FILE.0.
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
    SIZE = 256

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.n = 0

    def write(self, status):
        text = f"pid={os.getpid()}\niterations={self.n}\nstatus={status}\n".encode()
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
    p.add_argument("mode", choices=["ipc", "nccl"])
    p.add_argument("--state", required=True)
    p.add_argument("--mb", type=int, default=256)
    args = p.parse_args()
    (ipc if args.mode == "ipc" else nccl)(args)


if __name__ == "__main__":
    main()
