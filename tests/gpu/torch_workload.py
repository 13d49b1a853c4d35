#!/usr/bin/env python3
"""A PyTorch workload for checkpoint/restore tests on a real GPU.

    torch_workload.py --gb G [--state FILE] [--device I] [--interval-ms MS] [--seed S] [--compile MODE]
                      [--graph] [--host-register-mb MB]

Puts about G GiB of float32 weights on the GPU, generated from the seed, and computes once the checksum of a
fixed pass over them (a matmul per weight matrix, reduced in float64): the expected value. Then, forever:
recompute the pass and compare it with the expected checksum bit for bit, bump a counter that lives on the
GPU and compare it with the one on the host, and rewrite the state file in place (serving_workload.py's StateFile):

    iterations=N  errors=0  gb=G  pid=P  checksum=X  status=ok        (one per line)

On a mismatch or a CUDA error the state file says "status=FAIL <details>" and the process exits with 2.
"ready pid=P" goes to stdout once the weights are in place.

--graph adds a CUDA graph captured by hand (torch.cuda.graph: a chain of matmuls on a side stream) replayed in
every pass; --host-register-mb adds MB of pageable host memory registered with cudaHostRegister, filled from
the GPU and copied back on a stream of its own (asynchronous copies through the registered pages) in every
pass. PYTORCH_CUDA_ALLOC_CONF picks the allocator (expandable_segments:True, backend:cudaMallocAsync).
"""
import argparse
import os
import sys
import time

# Deterministic cuBLAS: the same pass must give the same bits on every iteration, before and after restore.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

from serving_workload import StateFile  # noqa: E402 (beside this file)

DIM = 4096          # weights are DIM x DIM float32 matrices (64 MiB each)
COLS = 256          # the input of each matmul is DIM x COLS


class Workload:
    def __init__(self, args):
        self.args = args
        self.iterations = 0
        self.checksum = None
        self.state = None

    def write_state(self, status):
        if not self.args.state:
            return
        if self.state is None:
            self.state = StateFile(self.args.state)
        self.state.write(f"iterations={self.iterations}\nerrors={0 if status == 'ok' else 1}\n"
                         f"gb={self.args.gb}\npid={os.getpid()}\nchecksum={self.checksum!r}\nstatus={status}\n")

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
        if self.args.graph:
            self.capture_graph()
        if self.args.host_register_mb:
            self.register_host(gen)
        self.checksum = self.pass_checksum()
        torch.cuda.synchronize(self.dev)
        gib = count * DIM * DIM * 4 / (1 << 30)
        print(f"ready pid={os.getpid()} gb={gib:.2f} matrices={count} "
              f"allocated={torch.cuda.memory_allocated(self.dev) / (1 << 30):.2f}GiB "
              f"allocator={torch.cuda.get_allocator_backend()} expandable={self.expandable()}", flush=True)
        self.write_state("ok")

    @staticmethod
    def expandable():
        """Whether the caching allocator's segments are expandable (cuMemCreate/cuMemMap), as
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True makes them; "n/a" where no snapshot is kept."""
        try:
            return any(seg.get("is_expandable", False) for seg in torch.cuda.memory_snapshot())
        except (RuntimeError, AttributeError):
            return "n/a"

    def graph_body(self):
        y = self.graph_in
        for w in self.weights[:4]:
            y = torch.tanh(w @ y)
        return y.double().abs().sum()

    def capture_graph(self):
        """A chain of matmuls captured into a CUDA graph after a warm-up on a side stream, as the
        torch.cuda.graph documentation asks; its output tensor is the graph's own, rewritten by every replay."""
        self.graph_in = self.x.clone()
        side = torch.cuda.Stream(self.dev)
        side.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.graph_body()
        torch.cuda.current_stream(self.dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.graph_out = self.graph_body()

    def register_host(self, gen):
        """Pageable host memory (the CPU allocator's) registered with cudaHostRegister, and the device data
        that every pass copies into it and back."""
        n = self.args.host_register_mb << 18  # float32 elements
        self.host_buf = torch.zeros(n, dtype=torch.float32)
        rc = torch.cuda.cudart().cudaHostRegister(self.host_buf.data_ptr(), n * 4, 0)
        if int(rc) != 0:
            self.fail(f"cudaHostRegister of {self.args.host_register_mb} MiB returned {int(rc)}")
        if not self.host_buf.is_pinned():
            self.fail("the registered host buffer does not count as pinned")
        self.host_src = torch.randn(n, device=self.dev, generator=gen)
        self.host_back = torch.empty_like(self.host_src)
        self.copy_stream = torch.cuda.Stream(self.dev)

    def host_roundtrip(self):
        """Device -> registered host -> device on the copy stream, both copies asynchronous; the host sum is
        computed on the CPU from the registered pages."""
        with torch.cuda.stream(self.copy_stream):
            self.host_buf.copy_(self.host_src, non_blocking=True)
            self.host_back.copy_(self.host_buf, non_blocking=True)
        self.copy_stream.synchronize()
        if not torch.equal(self.host_back, self.host_src):
            self.fail("the data copied back through the registered host buffer differs from the source")
        return float(self.host_buf.double().sum())

    def pass_checksum(self):
        total = torch.zeros((), dtype=torch.float64, device=self.dev)
        for i, w in enumerate(self.weights):
            y = w @ self.x.to(w.device)
            total += (y.double().abs().sum() * (i + 1)).to(self.dev)
        if self.args.compile:
            total += self.compiled(self.x).double().abs().sum()
        if self.args.graph:
            self.graph.replay()
            total += self.graph_out
        value = total.item()
        if self.args.host_register_mb:
            value += self.host_roundtrip()
        return value

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
    p.add_argument("--graph", action="store_true", help="also replay a CUDA graph captured with torch.cuda.graph")
    p.add_argument("--host-register-mb", type=int, default=0,
                   help="also copy through MB of host memory registered with cudaHostRegister")
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
