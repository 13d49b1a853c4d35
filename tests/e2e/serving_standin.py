#!/usr/bin/env python3
"""A stand-in for tests/gpu/serving_workload.py with its command line, its state file and its HTTP front,
and no GPU: for the benchmark's serving scenario on a machine without one (e2e bench_serve).

    serving_standin.py make --dir DIR --size N        writes DIR/config.json and 16 MiB of random "weights"
    serving_standin.py serve --dir DIR --port P --kv-gb G --batches 1,2,4,8 --state FILE [--processes 1|2]

serve runs serving_workload.py's own server (the file STANDIN_FRONT names: its HTTP front, the port bound
with SO_REUSEPORT, the header X-Server; its engine loop, which checks itself between requests and rewrites
the state file; with --processes 2 its front and engine processes, the Unix socket pair, the token ids' ring
in /dev/shm) with this file's model in place of the GPU's: a 64 MiB buffer filled from the weights, which
answers GET /generate?batch=B with {"batch": B, "tokens": ..., "sum": ...} computed from it, the same before
a dump and after its restore (with --processes 2 also a digest of the request's token ids). With
STANDIN_LIE_AFTER_RESTORE=1 it answers otherwise once it has been restored (its start time in
/proc/self/stat is not the one it had at start): what a restore that lost data looks like to a client.
"""
import argparse
import hashlib
import importlib.util
import json
import os
import sys


def start_time():
    with open("/proc/self/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def real_module():
    """serving_workload.py, the file STANDIN_FRONT names."""
    spec = importlib.util.spec_from_file_location("serving_front", os.environ["STANDIN_FRONT"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Model:
    """What serving_workload.py's engine loop needs of its model (its Server): batches, expected answers,
    generate(batch, token ids or None), phases. The answer comes from a 64 MiB buffer filled from the
    weights."""

    def __init__(self, args, prompt=None):
        with open(os.path.join(args.dir, "model-00000.safetensors"), "rb") as f:
            weights = f.read()
        self.buf = bytearray(weights * 4)  # 64 MiB of the process's own memory
        self.born = start_time()
        self.batches = sorted({int(b) for b in args.batches.split(",")})
        self.phases = {"load_s": 0.1, "kv_s": 0.1, "compile_s": 0.1}
        self.expected = {b: self.generate(b) for b in self.batches}

    def generate(self, b, ids=None):
        digest = hashlib.sha256(memoryview(self.buf)[: b << 20]).hexdigest()
        # The lie spares the first batch size, the one the engine checks itself with between requests: the
        # client is the one to notice.
        if os.environ.get("STANDIN_LIE_AFTER_RESTORE") == "1" and start_time() != self.born and b != self.batches[0]:
            digest = digest[::-1]
        answer = {"batch": b, "tokens": [[self.buf[i] for i in range(8)]] * b, "sum": digest}
        if ids is not None:
            answer["prompt"] = hashlib.sha256(json.dumps(ids).encode()).hexdigest()
        return answer


def engine(args):
    """--processes 2's engine: serving_workload.py's own, with this file's model."""
    real_module().engine(args, Model)


def serve(args):
    """serving_workload.py's own server (with --processes 2 its front, which starts this file's engine),
    with this file's model."""
    module = real_module()
    if args.processes == 2:
        module.front(args, [sys.executable, os.path.abspath(__file__), "engine", *sys.argv[2:]])
    else:
        module.serve(args, Model)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--dir", required=True)
    m.add_argument("--size", default="6")
    for name in ("serve", "engine"):
        s = sub.add_parser(name)
        for option in ("--dir", "--kv-gb", "--batches", "--state"):
            s.add_argument(option, required=True)
        s.add_argument("--port", type=int, required=True)
        s.add_argument("--processes", type=int, choices=(1, 2), default=1)
        s.add_argument("--interval-ms", type=int, default=200)
    sub.choices["engine"].add_argument("--fd", type=int, required=True)
    sub.choices["engine"].add_argument("--ring", required=True)
    args = p.parse_args()
    if args.cmd == "make":
        os.makedirs(args.dir, exist_ok=True)
        with open(os.path.join(args.dir, "model-00000.safetensors"), "wb") as f:
            f.write(os.urandom(16 << 20))
        with open(os.path.join(args.dir, "config.json"), "w") as f:
            json.dump({"size": args.size, "vocab_size": 32000}, f)
        return
    {"serve": serve, "engine": engine}[args.cmd](args)


if __name__ == "__main__":
    main()
