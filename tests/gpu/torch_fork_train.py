#!/usr/bin/env python3
"""A deterministic PyTorch training loop whose data comes from processes forked after CUDA started.

    torch_fork_train.py --mode dataloader|forkpool --steps N --log FILE [--state FILE] [--seed S]
                        [--step-delay-ms MS] [--device cuda:0|cpu]

The model (an MLP, AdamW, bf16 autocast) is put on the GPU first; then the data processes are forked, so
they inherit the CUDA driver's device files and mappings without using them:
  dataloader  a torch DataLoader, 2 persistent workers, multiprocessing_context='fork', shuffled by a
              seeded generator;
  forkpool    a multiprocessing Pool of 2 processes (fork context) that makes each batch.
Every sample is computed from its index alone, so which worker made it does not matter. The loss of every
step goes to the log as "STEP LOSS" with LOSS in float.hex() (the exact bits), one line per step, flushed.
Two runs with the same seed write identical logs; so must a run checkpointed and restored in the middle.

The state file (rewritten in place, one fd, fixed size): pid=P  iterations=STEP  status=ok|done|FAIL ...
Standalone: python3 torch_fork_train.py --mode dataloader --steps 300 --log /tmp/a.log; run twice, cmp.
"""
import argparse
import os
import sys
import time

# Deterministic cuBLAS; must be set before CUDA starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np  # noqa: E402
import torch  # noqa: E402

FEATURES = 256
CLASSES = 16
BATCH = 64
DATASET = 4096


def sample(index, seed):
    """One (x, y) pair from its index alone: the same in any process, in any order."""
    rng = np.random.default_rng([seed, index])
    x = rng.standard_normal(FEATURES, dtype=np.float32)
    y = np.int64(index % CLASSES)
    x[y * 4:(y + 1) * 4] += 2.0  # something to learn
    return x, y


def one_hot(ys):
    """Targets as class probabilities: the loss is then log_softmax and sums only (no nll_loss kernel)."""
    return np.eye(CLASSES, dtype=np.float32)[np.array(ys)]


def make_batch(args):
    """A batch as numpy arrays (plain pickled bytes between processes, no shared-memory fds)."""
    indices, seed = args
    xs, ys = zip(*(sample(i, seed) for i in indices))
    return np.stack(xs), one_hot(ys)


class Samples(torch.utils.data.Dataset):
    def __init__(self, seed):
        self.seed = seed

    def __len__(self):
        return DATASET

    def __getitem__(self, index):
        return sample(index, self.seed)


def collate(items):
    xs, ys = zip(*items)
    return np.stack(xs), one_hot(ys)


class State:
    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644) if path else -1

    def write(self, step, status):
        if self.fd < 0:
            return
        text = f"pid={os.getpid()}\niterations={step}\nstatus={status}\n".encode()
        os.pwrite(self.fd, text.ljust(512, b"\n"), 0)


def batches_dataloader(args):
    """(batch iterator, stop function)."""
    gen = torch.Generator()
    gen.manual_seed(args.seed)
    loader = torch.utils.data.DataLoader(
        Samples(args.seed), batch_size=BATCH, shuffle=True, generator=gen, drop_last=True, num_workers=2,
        persistent_workers=True, multiprocessing_context="fork", collate_fn=collate, pin_memory=False)

    def batches():
        while True:
            for batch in loader:  # the first iter() forks the workers, after CUDA started
                yield batch

    def stop():
        it = getattr(loader, "_iterator", None)
        if it is not None:
            it._shutdown_workers()
    return batches(), stop


def batches_forkpool(args):
    import multiprocessing
    pool = multiprocessing.get_context("fork").Pool(2)  # forked now, after CUDA started
    order = np.random.default_rng(args.seed)

    def batches():
        while True:
            perm = order.permutation(DATASET)
            for start in range(0, DATASET - BATCH + 1, BATCH):
                idx = perm[start:start + BATCH].tolist()
                halves = [(idx[:BATCH // 2], args.seed), (idx[BATCH // 2:], args.seed)]
                (x0, y0), (x1, y1) = pool.map(make_batch, halves, chunksize=1)
                yield np.concatenate([x0, x1]), np.concatenate([y0, y1])

    def stop():
        pool.terminate()
        pool.join()
    return batches(), stop


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["dataloader", "forkpool"], required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--log", required=True, help="losses, one 'STEP LOSS' line per step")
    p.add_argument("--state")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--step-delay-ms", type=int, default=0, help="sleep after each step (time to dump)")
    p.add_argument("--device", default="cuda:0", help="cpu: a quick check of the script without a GPU")
    args = p.parse_args()

    state = State(args.state)
    try:
        torch.manual_seed(args.seed)
        np.random.seed(args.seed)
        torch.use_deterministic_algorithms(True)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        dev = torch.device(args.device)
        model = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 512), torch.nn.GELU(), torch.nn.Linear(512, 512), torch.nn.GELU(),
            torch.nn.Linear(512, CLASSES)).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)  # CUDA has started: the data processes are forked after this

        source, stop = batches_dataloader(args) if args.mode == "dataloader" else batches_forkpool(args)
        log = open(args.log, "w", buffering=1)
        for step in range(1, args.steps + 1):
            x, y = next(source)
            x = torch.from_numpy(x).to(dev)
            y = torch.from_numpy(y).to(dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x).float(), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            log.write(f"{step} {loss.float().item().hex()}\n")
            state.write(step, "ok")
            if args.step_delay_ms:
                time.sleep(args.step_delay_ms / 1000)
        log.close()
        stop()
        state.write(args.steps, "done")
    except Exception as e:  # noqa: BLE001 - any failure must reach the state file
        print(f"torch_fork_train[{os.getpid()}]: FAIL {e!r}", file=sys.stderr, flush=True)
        state.write(-1, f"FAIL {e!r}"[:400].replace("\n", " "))
        sys.exit(2)


if __name__ == "__main__":
    main()
