#!/usr/bin/env python3
"""A stand-in for tests/gpu/serving_workload.py with its command line, its state file and its HTTP front,
and no GPU: for the benchmark's serving scenario on a machine without one (e2e bench_serve).

    serving_standin.py make --dir DIR --size N        writes DIR/config.json and 16 MiB of random "weights"
    serving_standin.py serve --dir DIR --port P --kv-gb G --batches 1,2,4,8 --state FILE

serve reads the weights, holds a 64 MiB buffer filled from them, and answers GET /generate?batch=B with
{"batch": B, "tokens": ..., "sum": ...} computed from that buffer, the same before a dump and after its
restore. It answers through serving_workload.py's own HTTP front (the file STANDIN_FRONT names: the port
bound with SO_REUSEPORT, the header X-Server), handing each request to its main loop as the real engine
loop takes them. With STANDIN_LIE_AFTER_RESTORE=1 it answers otherwise once it has been restored (its
start time in /proc/self/stat is not the one it had at start): what a restore that lost data looks like to
a client.
"""
import argparse
import hashlib
import importlib.util
import json
import os
import queue
import time

T0 = time.monotonic()


def start_time():
    with open("/proc/self/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def real_front(port, requests):
    """serving_workload.py's own HTTP front, each request handed to the main loop through requests."""
    spec = importlib.util.spec_from_file_location("serving_front", os.environ["STANDIN_FRONT"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.http_front(port, module.handoff(requests))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--dir", required=True)
    m.add_argument("--size", default="6")
    s = sub.add_parser("serve")
    for name in ("--dir", "--port", "--kv-gb", "--batches", "--state"):
        s.add_argument(name, required=True)
    args = p.parse_args()
    if args.cmd == "make":
        os.makedirs(args.dir, exist_ok=True)
        with open(os.path.join(args.dir, "model-00000.safetensors"), "wb") as f:
            f.write(os.urandom(16 << 20))
        with open(os.path.join(args.dir, "config.json"), "w") as f:
            json.dump({"size": args.size}, f)
        return
    with open(os.path.join(args.dir, "model-00000.safetensors"), "rb") as f:
        weights = f.read()
    buf = bytearray(weights * 4)  # 64 MiB of the process's own memory
    born = start_time()
    batches = [int(b) for b in args.batches.split(",")]

    def generate(b):
        digest = hashlib.sha256(memoryview(buf)[: b << 20]).hexdigest()
        if os.environ.get("STANDIN_LIE_AFTER_RESTORE") == "1" and start_time() != born:
            digest = digest[::-1]
        return {"batch": b, "tokens": [[buf[i] for i in range(8)]] * b, "sum": digest}

    requests = queue.Queue()
    real_front(int(args.port), requests)
    iterations = 0
    while True:
        tmp = f"{args.state}.tmp.{os.stat('/proc/self/ns/pid').st_ino}-{os.getpid()}"  # replicas share the state file
        with open(tmp, "w") as f:
            f.write(f"iterations={iterations}\npid={os.getpid()}\nstatus=ok\nload_s=0.1\nkv_s=0.1\ncompile_s=0.1\n"
                    f"ready_s={time.monotonic() - T0:.3f}\n")
        os.replace(tmp, args.state)
        try:
            b, reply = requests.get(timeout=0.2)
        except queue.Empty:
            iterations += 1
            continue
        reply.put((200, generate(b)) if b in batches else (400, {"error": f"batch {b}"}))


if __name__ == "__main__":
    main()
