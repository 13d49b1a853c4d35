#!/usr/bin/env python3
"""A stand-in for tests/gpu/serving_workload.py with its command line, its state file and its HTTP answers,
and no GPU: for the benchmark's serving scenario on a machine without one (e2e bench_serve).

    serving_standin.py make --dir DIR --size N        writes DIR/config.json and 16 MiB of random "weights"
    serving_standin.py serve --dir DIR --port P --kv-gb G --batches 1,2,4,8 --state FILE

serve reads the weights, holds a 64 MiB buffer filled from them, and answers GET /generate?batch=B with
{"batch": B, "tokens": ..., "sum": ...} computed from that buffer, the same before a dump and after its
restore, with the header X-Server (its pid as /proc names it) on a port bound with SO_REUSEPORT, as
serving_workload.py does (replicas serve one port side by side). With STANDIN_LIE_AFTER_RESTORE=1 it answers otherwise once it has been restored (its start time in
/proc/self/stat is not the one it had at start): what a restore that lost data looks like to a client.
"""
import argparse
import hashlib
import http.server
import json
import os
import socket
import threading
import time
import urllib.parse

T0 = time.monotonic()


def start_time():
    with open("/proc/self/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


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

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            b = int(urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query).get("batch", ["1"])[0])
            digest = hashlib.sha256(memoryview(buf)[: b << 20]).hexdigest()
            if os.environ.get("STANDIN_LIE_AFTER_RESTORE") == "1" and start_time() != born:
                digest = digest[::-1]
            body = json.dumps({"batch": b, "tokens": [[buf[i] for i in range(8)]] * b, "sum": digest}).encode()
            self.send_response(200 if b in batches else 400)
            self.send_header("X-Server", os.readlink("/proc/self"))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    class Front(http.server.ThreadingHTTPServer):
        daemon_threads = True

        def server_bind(self):
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            super().server_bind()

    srv = Front(("127.0.0.1", int(args.port)), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    iterations = 0
    while True:
        tmp = f"{args.state}.tmp.{os.readlink('/proc/self')}"  # replicas share the state file
        with open(tmp, "w") as f:
            f.write(f"iterations={iterations}\npid={os.getpid()}\nstatus=ok\nload_s=0.1\nkv_s=0.1\ncompile_s=0.1\n"
                    f"ready_s={time.monotonic() - T0:.3f}\n")
        os.replace(tmp, args.state)
        iterations += 1
        time.sleep(0.2)


if __name__ == "__main__":
    main()
