#!/usr/bin/env python3
"""A stand-in for tests/gpu/serving_workload.py with its command line, its state file and its HTTP front,
and no GPU: for the benchmark's serving scenario on a machine without one (e2e bench_serve).

    serving_standin.py make --dir DIR --size N        writes DIR/config.json and 16 MiB of random "weights"
    serving_standin.py serve --dir DIR --port P --kv-gb G --batches 1,2,4,8 --state FILE [--processes 1|2]

serve reads the weights, holds a 64 MiB buffer filled from them, and answers GET /generate?batch=B with
{"batch": B, "tokens": ..., "sum": ...} computed from that buffer, the same before a dump and after its
restore. It answers through serving_workload.py's own HTTP front (the file STANDIN_FRONT names: the port
bound with SO_REUSEPORT, the header X-Server), handing each request to its main loop as the real engine
loop takes them. With --processes 2 it runs serving_workload.py's own front (that file's front(): the Unix
socket pair, the token ids' ring in /dev/shm, unlinked once both map it) with this file's engine, whose
answers also carry a digest of the request's token ids read from the ring. With
STANDIN_LIE_AFTER_RESTORE=1 it answers otherwise once it has been restored (its start time in
/proc/self/stat is not the one it had at start): what a restore that lost data looks like to a client.
"""
import argparse
import hashlib
import importlib.util
import json
import multiprocessing
import os
import queue
import socket
import sys
import time

T0 = time.monotonic()


def start_time():
    with open("/proc/self/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def real_module():
    """serving_workload.py, the file STANDIN_FRONT names."""
    spec = importlib.util.spec_from_file_location("serving_front", os.environ["STANDIN_FRONT"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(args):
    """generate(batch, token ids or None): the answer, from a 64 MiB buffer filled from the weights."""
    with open(os.path.join(args.dir, "model-00000.safetensors"), "rb") as f:
        weights = f.read()
    buf = bytearray(weights * 4)  # 64 MiB of the process's own memory
    born = start_time()

    def generate(b, ids=None):
        digest = hashlib.sha256(memoryview(buf)[: b << 20]).hexdigest()
        if os.environ.get("STANDIN_LIE_AFTER_RESTORE") == "1" and start_time() != born:
            digest = digest[::-1]
        answer = {"batch": b, "tokens": [[buf[i] for i in range(8)]] * b, "sum": digest}
        if ids is not None:
            answer["prompt"] = hashlib.sha256(json.dumps(ids).encode()).hexdigest()
        return answer
    return generate


def answer_loop(module, args, get, put):
    """The main loop: requests from get(timeout) (queue.Empty when none came), each answered with
    put(request, (code, answer)); the state file rewritten between them, as the real engine writes it
    (module: serving_workload.py)."""
    generate, batches = load(args), [int(b) for b in args.batches.split(",")]
    iterations, state = 0, module.StateFile(args.state)
    while True:
        state.write(f"iterations={iterations}\npid={os.getpid()}\nstatus=ok\nload_s=0.1\nkv_s=0.1\ncompile_s=0.1\n"
                    f"ready_s={time.monotonic() - T0:.3f}\n")
        try:
            request, b, ids = get(0.2)
        except queue.Empty:
            iterations += 1
            continue
        put(request, (200, generate(b, ids)) if b in batches else (400, {"error": f"batch {b}"}))


def engine(args):
    """--processes 2's engine: requests over the socket from the real front, token ids from its ring."""
    module = real_module()
    sock = socket.socket(fileno=args.fd)
    ring = module.Ring(args.ring, max(int(b) for b in args.batches.split(",")), create=False)
    sock.send(b"ready")

    def get(timeout):
        sock.settimeout(timeout)
        try:
            msg = sock.recv(256)
        except socket.timeout:
            raise queue.Empty from None
        if not msg:
            sys.exit("the front closed its socket")
        i, batch = json.loads(msg)
        return i, batch, ring.get(i, batch)

    answer_loop(module, args, get, lambda i, answer: sock.send(json.dumps(answer).encode()))


def serve(args):
    module = real_module()
    if args.processes == 2:  # the real front, this file's engine
        module.front(args, [sys.executable, os.path.abspath(__file__), "engine", *sys.argv[2:]])
        return
    held = multiprocessing.Lock()  # noqa: F841 (the real engine's semaphore: /dev/shm/sem.* (deleted))
    requests = queue.Queue()
    module.http_front(args.port, module.handoff(requests))

    def get(timeout):
        b, reply = requests.get(timeout=timeout)
        return reply, b, None

    answer_loop(module, args, get, lambda reply, answer: reply.put(answer))


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
