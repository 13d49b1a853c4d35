#!/usr/bin/env python3
"""A PyTorch workload for checkpoint/restore tests on a real GPU.

    torch_workload.py --gb G [--state FILE] [--device I] [--interval-ms MS] [--seed S]

Puts about G GiB of float32 weights on the GPU, generated from the seed, and computes once the checksum of a
fixed pass over them (a matmul per weight matrix, reduced in float64): the expected value. Then, forever:
recompute the pass and compare it with the expected checksum bit for bit, bump a counter that lives on the
GPU and compare it with the one on the host, and write the state file atomically:

    iterations=N  errors=0  gb=G  pid=P  checksum=X  status=ok        (one per line)

On a mismatch or a CUDA error the state file says "status=FAIL <details>" and the process exits with 2.
"ready pid=P" goes to stdout once the weights are in place.
"""
import argparse
import os
import sys
import time

# Deterministic cuBLAS: the same pass must give the same bits on every iteration, before and after restore.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

DIM = 4096          # weights are DIM x DIM float32 matrices (64 MiB each)
COLS = 256          # the input of each matmul is DIM x COLS


class Workload:
    def __init__(self, args):
        self.args = args
        self.iterations = 0
        self.checksum = None

    def write_state(self, status):
        if not self.args.state:
            return
        tmp = f"{self.args.state}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(f"iterations={self.iterations}\nerrors={0 if status == 'ok' else 1}\n"
                    f"gb={self.args.gb}\npid={os.getpid()}\nchecksum={self.checksum!r}\nstatus={status}\n")
        os.replace(tmp, self.args.state)

    def fail(self, why):
        print(f"torch_workload[{os.getpid()}]: FAIL {why}", file=sys.stderr, flush=True)
        self.write_state(f"FAIL {why}")
        sys.exit(2)

    def setup(self):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.use_deterministic_algorithms(True)
        self.dev = torch.device("cuda", self.args.device)
        gen = torch.Generator(device=self.dev)
        gen.manual_seed(self.args.seed)
        count = max(1, int(self.args.gb * (1 << 30)) // (DIM * DIM * 4))
        # Scaled so that products stay well inside float32's range.
        self.weights = [torch.randn(DIM, DIM, device=self.dev, generator=gen) / DIM ** 0.5
                        for _ in range(count)]
        self.x = torch.randn(DIM, COLS, device=self.dev, generator=gen)
        if self.args.second_device is not None:
            # A process on two GPUs: every other weight matrix moves to the second one.
            dev2 = torch.device("cuda", self.args.second_device)
            self.weights = [w.to(dev2) if i % 2 else w for i, w in enumerate(self.weights)]
        self.counter = torch.zeros(1, dtype=torch.int64, device=self.dev)
        if self.args.compile:
            # An expensive start: an MLP over the first weights compiled by TorchInductor (Triton kernels),
            # and, with mode reduce-overhead, captured into CUDA graphs.
            layers = self.weights[:8]

            def block(x):
                for w in layers:
                    x = torch.nn.functional.gelu(w @ x)
                return x

            self.compiled = torch.compile(block, mode=self.args.compile)
        self.checksum = self.pass_checksum()
        torch.cuda.synchronize(self.dev)
        gib = count * DIM * DIM * 4 / (1 << 30)
        print(f"ready pid={os.getpid()} gb={gib:.2f} matrices={count} "
              f"allocated={torch.cuda.memory_allocated(self.dev) / (1 << 30):.2f}GiB", flush=True)
        self.write_state("ok")

    def pass_checksum(self):
        total = torch.zeros((), dtype=torch.float64, device=self.dev)
        for i, w in enumerate(self.weights):
            y = w @ self.x.to(w.device)
            total += (y.double().abs().sum() * (i + 1)).to(self.dev)
        if self.args.compile:
            total += self.compiled(self.x).double().abs().sum()
        return total.item()

    def loop(self):
        interval = self.args.interval_ms / 1000.0
        while True:
            if interval:
                time.sleep(interval)
            got = self.pass_checksum()
            if got != self.checksum:
                self.fail(f"checksum mismatch at iteration {self.iterations + 1}: "
                          f"expected {self.checksum!r} got {got!r}")
            self.counter += 1
            on_gpu = int(self.counter.item())
            if on_gpu != self.iterations + 1:
                self.fail(f"GPU counter is {on_gpu}, expected {self.iterations + 1}")
            self.iterations += 1
            self.write_state("ok")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, required=True, help="GiB of weights on the GPU")
    p.add_argument("--state", help="state file, rewritten after every iteration")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--second-device", type=int, help="put every other weight matrix on this GPU (a 2-GPU process)")
    p.add_argument("--interval-ms", type=int, default=100)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--compile", metavar="MODE", help="also run an MLP compiled with torch.compile(mode=MODE), "
                   "e.g. reduce-overhead (Inductor kernels in CUDA graphs): a workload with an expensive start")
    args = p.parse_args()
    w = Workload(args)
    try:
        if not torch.cuda.is_available():
            w.fail("torch.cuda.is_available() is False")
        w.setup()
        w.loop()
    except SystemExit:
        raise
    except BaseException as e:  # a CUDA error after a bad restore lands here
        w.fail(f"{type(e).__name__}: {e}".replace("\n", " "))


if __name__ == "__main__":
    main()
