#!/usr/bin/env python3
"""A JAX, CuPy or Hugging Face transformers workload for checkpoint/restore tests on a real GPU.

    framework_workload.py {jax,cupy,transformers} [--mb M] [--state FILE] [--interval-ms MS]

Puts about M MiB of data (or a randomly initialised GPT-2 model: no download) on GPU 0 with the framework's
own allocator, computes once a result from it (a reduction over the data after an element-wise pass and a
matrix product; the model's logits for a fixed prompt): the expected value. Then, forever: compute it again,
compare it with the expected value bit for bit, and write the state file atomically:

    iterations=N  pid=P  framework=F  status=ok        (one per line)

On a mismatch or an error the state file says "status=FAIL <details>" and the process exits with 2.
"""
import argparse
import os
import sys
import time

DIM = 1024


class Jax:
    def __init__(self, mb):
        # JAX takes 75% of the GPU up front by default: a checkpoint would copy all of it to host memory.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        import jax
        import jax.numpy as jnp
        self.jax, self.jnp = jax, jnp
        if jax.devices()[0].platform != "gpu":
            raise RuntimeError(f"JAX runs on {jax.devices()[0].platform}, not on a GPU")
        key = jax.random.PRNGKey(1234)
        rows = max(DIM, mb * (1 << 20) // (DIM * 4))
        self.data = jax.random.normal(key, (rows, DIM), dtype=jnp.float32)
        self.w = jax.random.normal(jax.random.PRNGKey(5), (DIM, 64), dtype=jnp.float32) / DIM ** 0.5
        self.step = jax.jit(lambda d, w: jnp.sum(jnp.abs(jnp.sin(d) @ w), dtype=jnp.float32))

    def result(self):
        return float(self.step(self.data, self.w).block_until_ready())


class Cupy:
    def __init__(self, mb):
        import cupy
        self.cp = cupy
        rows = max(DIM, mb * (1 << 20) // (DIM * 4))
        rng = cupy.random.default_rng(1234)
        self.data = rng.standard_normal((rows, DIM), dtype=cupy.float32)
        self.w = rng.standard_normal((DIM, 64), dtype=cupy.float32) / DIM ** 0.5
        # A kernel of its own (NVRTC), beside CuPy's and cuBLAS's.
        self.square = cupy.ElementwiseKernel("float32 x", "float32 y", "y = x * x", "square_kernel")

    def result(self):
        cp = self.cp
        y = self.square(cp.sin(self.data)) @ self.w
        return float(cp.abs(y).sum(dtype=cp.float64))


class Transformers:
    def __init__(self, mb):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(1234)
        torch.use_deterministic_algorithms(True)
        self.torch = torch
        # About 4 bytes a parameter: layers enough for mb MiB, at least 2.
        layers = max(2, mb // 48)
        config = GPT2Config(n_layer=layers, n_embd=1024, n_head=16, vocab_size=8192, n_positions=256)
        self.model = GPT2LMHeadModel(config).to("cuda").eval()
        self.prompt = torch.randint(0, config.vocab_size, (4, 128), device="cuda")

    def result(self):
        with self.torch.no_grad():
            logits = self.model(self.prompt).logits
            # The next tokens as well as the numbers: a generate-like step.
            return float(logits.double().abs().sum()) + float(logits[:, -1].argmax(-1).sum())


FRAMEWORKS = {"jax": Jax, "cupy": Cupy, "transformers": Transformers}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("framework", choices=sorted(FRAMEWORKS))
    p.add_argument("--mb", type=int, default=512, help="MiB of data (or of model weights) on the GPU")
    p.add_argument("--state", help="state file, rewritten after every iteration")
    p.add_argument("--interval-ms", type=int, default=100)
    args = p.parse_args()
    iterations = 0

    def write_state(status):
        if not args.state:
            return
        tmp = f"{args.state}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(f"iterations={iterations}\npid={os.getpid()}\nframework={args.framework}\nstatus={status}\n")
        os.replace(tmp, args.state)

    try:
        work = FRAMEWORKS[args.framework](args.mb)
        expected = work.result()
        print(f"ready pid={os.getpid()} framework={args.framework} result={expected!r}", flush=True)
        write_state("ok")
        while True:
            time.sleep(args.interval_ms / 1000.0)
            got = work.result()
            if got != expected:
                raise RuntimeError(f"result {got!r} at iteration {iterations + 1}, expected {expected!r}")
            iterations += 1
            write_state("ok")
    except BaseException as e:  # an import error, a CUDA error after a bad restore, a mismatch
        why = f"{type(e).__name__}: {e}".replace("\n", " ")
        print(f"framework_workload[{os.getpid()}]: FAIL {why}", file=sys.stderr, flush=True)
        write_state(f"FAIL {why}")
        sys.exit(2)


if __name__ == "__main__":
    main()
