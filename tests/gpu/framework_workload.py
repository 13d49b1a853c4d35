#!/usr/bin/env python3
"""A JAX, CuPy or Hugging Face transformers workload for checkpoint/restore tests on a real GPU.

    framework_workload.py {jax,cupy,transformers} [--mb M] [--state FILE] [--interval-ms MS]
    framework_workload.py transformers --config gpt2 [--kv-mb M] [--new-tokens N] ...   (an LLM server)
    framework_workload.py ... --serve PORT      (answers requests on 127.0.0.1:PORT: see serve)

Puts about M MiB of data (or a randomly initialised GPT-2 model: no download) on GPU 0 with the framework's
own allocator, computes once a result from it (a reduction over the data after an element-wise pass and a
matrix product; the model's logits for a fixed prompt, or with --config gpt2 a greedy generation for it and,
with --kv-mb, the check of a KV-cache arena beside the model: see Transformers): the expected value. Then,
forever: compute it again, compare it with the expected value bit for bit, and rewrite the state file in place:

    iterations=N  pid=P  framework=F  status=ok        (one per line)

On a mismatch or an error the state file says "status=FAIL <details>" and the process exits with 2.
"""
import argparse
import os
import socket
import sys
import threading
import time

from serving_workload import StateFile  # beside this file

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
    """A GPT-2 on the GPU. --config scaled: layers enough for about --mb MiB of weights and a small
    vocabulary; the answer is the logits for a fixed prompt and their next tokens. --config gpt2: the stock
    GPT2Config() (124M parameters, random weights from the seed: no download); the answer is a greedy
    generation of --new-tokens tokens for a fixed prompt and the last logits. With --kv-mb, an LLM server's
    shape: a KV-cache arena made with torch.zeros, as vLLM and SGLang allocate theirs, its first blocks
    holding the prompt's keys and values (a prefix cache); the answer then also has the checksum of those
    blocks and the count of non-zero words in the whole arena (the rest must come back as zeros)."""

    BLOCK = 16  # tokens per KV-cache block (vLLM's default)

    def __init__(self, mb, config="scaled", kv_mb=0, new_tokens=8):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(1234)
        torch.backends.cuda.matmul.allow_tf32 = False
        # warn_only: an op without a deterministic kernel shows up as a mismatch in the loop, not a crash.
        torch.use_deterministic_algorithms(True, warn_only=True)
        self.torch = torch
        if config == "gpt2":
            self.config = GPT2Config()
            batch, length = 4, 64
            self.new_tokens = max(1, new_tokens)
        else:
            # About 4 bytes a parameter: layers enough for mb MiB, at least 2.
            layers = max(2, mb // 48)
            self.config = GPT2Config(n_layer=layers, n_embd=1024, n_head=16, vocab_size=8192, n_positions=256)
            batch, length = 4, 128
            self.new_tokens = 0
        self.model = GPT2LMHeadModel(self.config).to("cuda").eval()
        self.prompt = torch.randint(0, self.config.vocab_size, (batch, length), device="cuda")
        self.arena = self.make_arena(kv_mb) if kv_mb > 0 else None
        torch.cuda.synchronize()

    def make_arena(self, kv_mb):
        torch, c = self.torch, self.config
        head_dim = c.n_embd // c.n_head
        # [layer, key/value, block, token in block, head, head dim] in float16: vLLM's layout, more or less.
        block_bytes = c.n_layer * 2 * self.BLOCK * c.n_head * head_dim * 2
        blocks = max(1, kv_mb * (1 << 20) // block_bytes)
        arena = torch.zeros((c.n_layer, 2, blocks, self.BLOCK, c.n_head, head_dim), dtype=torch.float16,
                            device="cuda")
        # The prompt's keys and values (ln_1 then c_attn of each layer's input, as GPT-2's attention computes
        # them) go into the first blocks, one sequence after the other, as many as the arena holds.
        batch, length = self.prompt.shape
        per_seq = -(-length // self.BLOCK)
        seqs = min(batch, blocks // per_seq)
        self.used_blocks = seqs * per_seq
        with torch.no_grad():
            hidden = self.model(self.prompt, output_hidden_states=True).hidden_states
            for i, layer in enumerate(self.model.transformer.h):
                _, k, v = layer.attn.c_attn(layer.ln_1(hidden[i])).split(c.n_embd, dim=2)
                for j, t in enumerate((k, v)):
                    t = t[:seqs].reshape(seqs, length, c.n_head, head_dim).to(torch.float16)
                    t = torch.nn.functional.pad(t, (0, 0, 0, 0, 0, per_seq * self.BLOCK - length))
                    arena[i, j, :self.used_blocks] = t.reshape(self.used_blocks, self.BLOCK, c.n_head, head_dim)
        print(f"KV-cache arena: {arena.numel() * 2 / (1 << 20):.0f} MiB, {blocks} blocks of {self.BLOCK} tokens, "
              f"{self.used_blocks} in use", flush=True)
        return arena

    def result(self):
        torch = self.torch
        with torch.no_grad():
            out = self.model(self.prompt, use_cache=self.new_tokens > 0)
            logits = out.logits[:, -1]
            if not self.new_tokens:
                # The next tokens as well as the numbers: a generate-like step.
                answer = float(out.logits.double().abs().sum()) + float(logits.argmax(-1).sum())
            else:
                # Greedy generation, the model's own cache passed back as it came (a tuple or a Cache
                # object, whichever this transformers version returns).
                past, tokens = out.past_key_values, []
                for _ in range(self.new_tokens):
                    nxt = logits.argmax(-1, keepdim=True)
                    tokens.append(nxt)
                    out = self.model(nxt, past_key_values=past, use_cache=True)
                    past, logits = out.past_key_values, out.logits[:, -1]
                answer = (torch.cat(tokens, dim=1).tolist(), float(logits.double().abs().sum()))
            return answer if self.arena is None else (answer,) + self.arena_check()

    def arena_check(self):
        """The checksum of the arena's blocks in use, and the count of its non-zero 8-byte words, all of it,
        by slices of 512 MiB (no temporary the size of the arena)."""
        torch = self.torch
        used = self.arena[:, :, :self.used_blocks].double().sum()
        flat = self.arena.view(-1)
        words = flat.view(torch.int64) if flat.numel() % 4 == 0 else flat
        nonzero = torch.zeros((), dtype=torch.int64, device="cuda")
        for part in words.split(1 << 26):
            nonzero += torch.count_nonzero(part)
        return float(used), int(nonzero)


FRAMEWORKS = {"jax": Jax, "cupy": Cupy, "transformers": Transformers}


def serve(port, work, lock):
    """--serve: listens on 127.0.0.1:PORT and answers, on any number of connections held open (a thread
    each), one line per request line: `generate` -> repr(work.result()), computed under lock (the main loop
    computes under it too: one computation on the GPU at a time); `ping` -> `pong`; else `error ...`."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(16)

    def client(conn):
        with conn, conn.makefile("rw", encoding="ascii", newline="\n") as f:
            for line in f:
                req = line.strip()
                if req == "generate":
                    with lock:
                        answer = repr(work.result())
                elif req == "ping":
                    answer = "pong"
                else:
                    answer = f"error unknown request {req[:40]!r} (generate | ping)"
                f.write(answer + "\n")
                f.flush()

    def accept():
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=client, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("framework", choices=sorted(FRAMEWORKS))
    p.add_argument("--mb", type=int, default=512, help="MiB of data (or of model weights) on the GPU")
    p.add_argument("--state", help="state file, rewritten after every iteration")
    p.add_argument("--interval-ms", type=int, default=100)
    p.add_argument("--config", choices=("scaled", "gpt2"), default="scaled",
                   help="transformers: a GPT-2 of about --mb MiB (scaled) or the stock GPT2Config() (gpt2, "
                   "answering with a greedy generation)")
    p.add_argument("--kv-mb", type=int, default=0,
                   help="transformers: also a KV-cache arena of this many MiB made with torch.zeros (an LLM "
                   "server's shape), checked with every answer")
    p.add_argument("--new-tokens", type=int, default=8, help="transformers --config gpt2: tokens generated per answer")
    p.add_argument("--serve", type=int, metavar="PORT", help="answer requests on 127.0.0.1:PORT once ready")
    args = p.parse_args()
    if args.framework != "transformers" and (args.kv_mb or args.config != "scaled"):
        p.error("--config and --kv-mb are for transformers")
    iterations = 0
    state = StateFile(args.state) if args.state else None

    def write_state(status):
        if state:
            state.write(f"iterations={iterations}\npid={os.getpid()}\nframework={args.framework}\nstatus={status}\n")

    try:
        if args.framework == "transformers":
            work = Transformers(args.mb, args.config, args.kv_mb, args.new_tokens)
        else:
            work = FRAMEWORKS[args.framework](args.mb)
        expected = work.result()
        lock = threading.Lock()
        if args.serve:
            serve(args.serve, work, lock)
        print(f"ready pid={os.getpid()} framework={args.framework} result={expected!r}"
              + (f" serving on 127.0.0.1:{args.serve}" if args.serve else ""), flush=True)
        write_state("ok")
        while True:
            time.sleep(args.interval_ms / 1000.0)
            with lock:
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
