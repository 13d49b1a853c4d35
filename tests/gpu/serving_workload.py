#!/usr/bin/env python3
"""An inference server started the way vLLM and SGLang start one, for checkpoint/restore on a real GPU.

    serving_workload.py make --dir DIR [--size 6|16]        the model's weights, written once
    serving_workload.py serve --dir DIR --port PORT [--kv-gb G] [--batches 1,2,4,8] [--new-tokens N]
                              [--state FILE] [--interval-ms MS] [--eager] [--processes 1|2]

make: a Llama-architecture model (transformers' LlamaConfig: --size 6, about 6.4 GB of bf16 weights, shaped
like Llama 3.2 3B; --size 16, about 16 GB, like Llama 3 8B) with random weights from a fixed seed, written to
DIR as config.json and safetensors files of at most 2 GiB each. Nothing is downloaded.

serve, in the engines' order, each phase's seconds on stdout and in the state file:
  load     the weights read from DIR's safetensors files onto GPU 0, tensor by tensor, as their loaders do;
  kv       a KV-cache arena of G GiB made with torch.zeros (a paged pool: [layer, key/value, block, 16 tokens,
           KV head, head dim]), the prompt's keys and values in its first blocks (a prefix cache);
  compile  the model's forward compiled by torch.compile (mode reduce-overhead: Inductor kernels replayed as
           CUDA graphs), one graph captured per decode batch size of --batches (--eager: neither);
then answers HTTP on 127.0.0.1:PORT:

    GET /generate?batch=B   {"batch": B, "tokens": [[...], ...], "logits_sha256": "...", "arena": [sum, nonzero]}
    GET /health             ok

Every answer carries the header X-Server: the server's pid as /proc names it. The port is bound with
SO_REUSEPORT, so that several servers (cold starts) can serve one port side by side, as replicas behind one
address do; that header tells which one answered. Replicas restored from one image each have a network
namespace of their own (bench_replicas.py), and are asked there.

/generate is a greedy generation of --new-tokens tokens for a fixed prompt (B rows of 128 tokens), the
SHA-256 of the last step's float32 logits, the checksum of the arena's blocks in use and the count of its
non-zero 8-byte words (the rest of the arena must stay zeros): a client compares answers token for token and
logit for logit. All GPU work runs on the main thread (the engine loop: CUDA graphs recorded by
torch.compile belong to the thread that recorded them); between requests it checks the batch-1 answer
against the one computed at start, and writes the state file atomically:

    iterations=N  pid=P  status=ok  load_s=..  kv_s=..  compile_s=..  ready_s=..        (one per line)

On a mismatch or an error the state file says "status=FAIL <details>" and the process exits with 2.

--processes 2 splits the server as vLLM V1 and SGLang do: this process is the HTTP front and never imports
torch or touches CUDA; it starts the engine (serving_workload.py engine, the same arguments), which loads,
compiles and answers as above. They talk over a Unix socket pair (SOCK_SEQPACKET: a request's batch size one
way, its answer the other; first the engine's readiness, then the front's word that its port is up), and the
token ids of every request go through a ring in a file of /dev/shm that both map (RING_SLOTS slots of the
largest batch's prompt; its name unlinked once both hold it, as shared-memory segments are). The engine
writes the state file, once the front's port is up; the front ends, with status=FAIL, when the engine does.
"""
import argparse
import glob
import hashlib
import http.server
import json
import mmap
import multiprocessing
import os
import queue
import random
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.parse

T0 = time.monotonic()
PROMPT_LEN = 128
BLOCK = 16  # tokens per KV-cache block (vLLM's default)
SIZES = {  # --size: LlamaConfig arguments
    6: dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
            num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
    16: dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
             num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
}


def make(args):
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(1234)
    config = LlamaConfig(max_position_embeddings=4096, torch_dtype="bfloat16", **SIZES[args.size])
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config)
    os.makedirs(args.dir, exist_ok=True)
    for old in glob.glob(os.path.join(args.dir, "*.safetensors")):
        os.unlink(old)
    shard, shard_bytes, n, total = {}, 0, 0, 0
    tensors = [(k, v) for k, v in model.state_dict().items()
               if not (config.tie_word_embeddings and k == "lm_head.weight")]  # one storage, saved once
    for i, (name, t) in enumerate(tensors):
        shard[name] = t.detach().to("cpu").contiguous()
        shard_bytes += t.numel() * t.element_size()
        if shard_bytes >= 2 << 30 or i == len(tensors) - 1:
            save_file(shard, os.path.join(args.dir, f"model-{n:05d}.safetensors"), metadata={"format": "pt"})
            total += shard_bytes
            shard, shard_bytes, n = {}, 0, n + 1
    config.to_json_file(os.path.join(args.dir, "config.json"))
    os.sync()
    print(f"weights: {total / 1e9:.2f} GB in {n} file(s) in {args.dir}", flush=True)


RING_SLOTS = 8


class Ring:
    """The requests' token ids, in a file of /dev/shm mapped by the front and the engine: slot i holds the
    prompt rows of request i (int32, a row of PROMPT_LEN tokens per batch entry) while the engine reads it."""

    def __init__(self, path, rows, create):
        self.slot = rows * PROMPT_LEN * 4
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                os.ftruncate(fd, RING_SLOTS * self.slot)
            self.map = mmap.mmap(fd, RING_SLOTS * self.slot)
        finally:
            os.close(fd)

    def put(self, i, rows):
        flat = [t for row in rows for t in row]
        off = (i % RING_SLOTS) * self.slot
        self.map[off:off + 4 * len(flat)] = struct.pack(f"{len(flat)}i", *flat)

    def get(self, i, batch):
        off = (i % RING_SLOTS) * self.slot
        flat = struct.unpack_from(f"{batch * PROMPT_LEN}i", self.map, off)
        return [list(flat[r * PROMPT_LEN:(r + 1) * PROMPT_LEN]) for r in range(batch)]


def front_prompt(args):
    """The front's prompt (the largest batch's rows), from a fixed seed and the model's vocabulary: without
    torch, as a front tokenizes without the engine's libraries."""
    with open(os.path.join(args.dir, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    rng = random.Random(5678)
    rows = max(int(b) for b in args.batches.split(","))
    return [[rng.randrange(vocab) for _ in range(PROMPT_LEN)] for _ in range(rows)]


class Server:
    def __init__(self, args, prompt=None):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        # Compiled in this process: a pool of compile workers would be checkpointed with the server.
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        import torch
        from safetensors import safe_open
        from transformers import LlamaConfig, LlamaForCausalLM
        self.torch, self.args, self.phases = torch, args, {}
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.use_deterministic_algorithms(True, warn_only=True)
        t = time.monotonic()
        self.config = c = LlamaConfig.from_json_file(os.path.join(args.dir, "config.json"))
        try:  # the engines allocate the weights without initialising them
            from transformers.modeling_utils import no_init_weights
        except ImportError:
            import contextlib
            no_init_weights = contextlib.nullcontext
        torch.set_default_dtype(torch.bfloat16)  # the weights made in bf16 at once, never in float32 first
        with torch.device("cuda"), no_init_weights():
            self.model = LlamaForCausalLM(c).eval()
        torch.set_default_dtype(torch.float32)
        params = dict(self.model.named_parameters())
        files = sorted(glob.glob(os.path.join(args.dir, "*.safetensors")))
        if not files:
            raise RuntimeError(f"no safetensors files in {args.dir} (run: serving_workload.py make --dir DIR)")
        loaded = set()
        with torch.no_grad():
            for path in files:
                with safe_open(path, framework="pt", device="cpu") as f:
                    for name in f.keys():
                        params[name].copy_(f.get_tensor(name))
                        loaded.add(name)
        missing = set(params) - loaded - ({"lm_head.weight"} if c.tie_word_embeddings else set())
        if missing:
            raise RuntimeError(f"{len(missing)} weights missing from {args.dir}, e.g. {sorted(missing)[0]}")
        torch.cuda.synchronize()
        self.phase("load", t)
        gen = torch.Generator(device="cuda").manual_seed(5678)
        self.batches = sorted({int(b) for b in args.batches.split(",")})
        self.prompt = (torch.tensor(prompt, device="cuda") if prompt is not None else
                       torch.randint(0, c.vocab_size, (max(self.batches), PROMPT_LEN), device="cuda", generator=gen))
        t = time.monotonic()
        self.make_arena()
        self.phase("kv", t)
        t = time.monotonic()
        self.forward = self.model if args.eager else torch.compile(self.model, mode="reduce-overhead")
        self.expected = {}
        for b in self.batches:
            first = self.generate(b)  # compiles and captures (once per size), then replays
            self.expected[b] = self.generate(b)  # replays only: what every later answer must equal
            if first != self.expected[b]:
                print(f"note: batch {b}: the answer while capturing differs from the replayed one", flush=True)
        self.phase("compile", t)

    def phase(self, name, since):
        self.phases[f"{name}_s"] = round(time.monotonic() - since, 3)
        print(f"{name}: {self.phases[name + '_s']:.2f} s", flush=True)

    def make_arena(self):
        torch, c = self.torch, self.config
        head_dim = c.hidden_size // c.num_attention_heads
        block_bytes = c.num_hidden_layers * 2 * BLOCK * c.num_key_value_heads * head_dim * 2
        blocks = max(1, int(self.args.kv_gb * (1 << 30)) // block_bytes)
        self.arena = torch.zeros((c.num_hidden_layers, 2, blocks, BLOCK, c.num_key_value_heads, head_dim),
                                 dtype=torch.bfloat16, device="cuda")
        rows = min(len(self.prompt), blocks * BLOCK // PROMPT_LEN)
        self.used = rows * PROMPT_LEN // BLOCK
        with torch.no_grad():
            hidden = self.model(self.prompt[:rows], output_hidden_states=True, use_cache=False).hidden_states
            for i, layer in enumerate(self.model.model.layers):
                x = layer.input_layernorm(hidden[i])
                for j, proj in enumerate((layer.self_attn.k_proj, layer.self_attn.v_proj)):
                    kv = proj(x).reshape(self.used, BLOCK, c.num_key_value_heads, head_dim)
                    self.arena[i, j, :self.used] = kv
        print(f"KV-cache arena: {self.arena.numel() * 2 / (1 << 30):.1f} GiB, {blocks} blocks of {BLOCK} "
              f"tokens, {self.used} in use", flush=True)

    def arena_check(self):
        torch = self.torch
        used = float(self.arena[:, :, :self.used].double().sum())
        nonzero = torch.zeros((), dtype=torch.int64, device="cuda")
        for part in self.arena.view(-1).view(torch.int64).split(1 << 26):  # 512 MiB at a time
            nonzero += torch.count_nonzero(part)
        return [used, int(nonzero)]

    def generate(self, batch, rows=None):
        """Greedy generation over a window of PROMPT_LEN tokens (one shape per batch size: one CUDA graph
        each, replayed for every step), from the prompt's first rows or the given token ids."""
        torch = self.torch
        ids = self.prompt[:batch].clone() if rows is None else torch.tensor(rows, device="cuda")
        tokens = []
        with torch.no_grad():
            for _ in range(self.args.new_tokens):
                if not self.args.eager:
                    torch.compiler.cudagraph_mark_step_begin()
                logits = self.forward(input_ids=ids, use_cache=False).logits[:, -1].float().clone()
                nxt = logits.argmax(-1, keepdim=True)
                tokens.append(nxt)
                ids = torch.cat([ids[:, 1:], nxt], dim=1)
        digest = hashlib.sha256(logits.cpu().numpy().tobytes()).hexdigest()
        return {"batch": batch, "tokens": torch.cat(tokens, dim=1).tolist(), "logits_sha256": digest,
                "arena": self.arena_check()}


def host_pid():
    """This process's pid as /proc names it: the machine's, also for a process that is pid 1 of its own pid
    namespace (os.getpid() says 1 in every replica) but sees the host's /proc."""
    return int(os.readlink("/proc/self"))


def process_key():
    """A name of this process unique on the machine, also among replicas that are each pid 1 of their own pid
    namespace with a /proc of their own (where /proc/self says 1 too): its pid namespace's inode and its pid
    there, read anew each time (a restored replica is in another namespace than its image's)."""
    return f"{os.stat('/proc/self/ns/pid').st_ino}-{os.getpid()}"


class StateFile:
    """The state file, rewritten in place through one descriptor held open: one write of a fixed size each
    time, padded with newlines. A dump never holds a temporary file that the process renames away after it
    runs again, which a second restore of the image (a replica, a cold restore) would not find; and the file
    keeps the size CRIU checks at a restore. Replicas share the file: the last write is what it says."""
    SIZE = 4096

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        os.ftruncate(self.fd, self.SIZE)

    def write(self, text):
        os.pwrite(self.fd, text.encode()[:self.SIZE - 1].ljust(self.SIZE, b"\n"), 0)


def http_front(port, handle):
    """The HTTP server; its threads hand each /generate to handle(batch), which returns (code, answer)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            url = urllib.parse.urlparse(self.path)
            if url.path == "/health":
                code, body = 200, b"ok"
            elif url.path == "/generate":
                code, answer = handle(int(urllib.parse.parse_qs(url.query).get("batch", ["1"])[0]))
                body = json.dumps(answer).encode()
            else:
                code, body = 404, b"GET /generate?batch=B or /health"
            self.send_response(code)
            self.send_header("X-Server", str(host_pid()))
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

    srv = Front(("127.0.0.1", port), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()


def handoff(requests):
    """A handle for http_front that passes each request to the loop reading requests (the engine loop: CUDA
    graphs belong to the thread that recorded them) and waits for its answer."""
    def handle(batch):
        reply = queue.Queue(1)
        requests.put((batch, reply))
        return reply.get()
    return handle


def serve(args, model=None):
    """The server in this process (model: the model's class, Server by default), or with --processes 2 the
    front that starts the engine."""
    if args.processes == 2:
        return front(args)
    # A semaphore of multiprocessing's, as PyTorch's worker pools hold them: created in /dev/shm and unlinked
    # at once, its mapping (/dev/shm/sem.* (deleted)) stays, and a restore brings it back as a ghost file.
    held = multiprocessing.Lock()  # noqa: F841 (held while serving)
    requests = queue.Queue()
    run_engine(args, lambda: (model or Server)(args), lambda: http_front(args.port, handoff(requests)),
               lambda timeout: requests.get(timeout=timeout), lambda reply, answer: reply.put(answer))


def front(args, engine_cmd=None):
    """The HTTP front of --processes 2: no torch, no CUDA; it starts the engine (engine_cmd, default this file's
    engine with the same arguments; --fd and --ring are added) and relays each request."""
    prompt = front_prompt(args)
    path = f"/dev/shm/serving-ring-{process_key()}"
    ring = Ring(path, len(prompt), create=True)
    ring.put(0, prompt)  # the engine's start-up prompt (its expected answers)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    engine_cmd = engine_cmd or [sys.executable, os.path.abspath(__file__), "engine", *sys.argv[2:]]
    eng = subprocess.Popen([*engine_cmd, "--fd", str(theirs.fileno()), "--ring", path], pass_fds=(theirs.fileno(),))
    theirs.close()
    msg = mine.recv(16)
    os.unlink(path)  # both hold it now
    if msg != b"ready":
        sys.exit(f"serving_workload front: the engine exited with {eng.wait()} before it was ready (its state file says why)")
    lock, seq = threading.Lock(), [0]

    def relay(batch):
        with lock:
            seq[0] += 1
            ring.put(seq[0], prompt[:batch])
            mine.send(json.dumps([seq[0], batch]).encode())
            msg = mine.recv(1 << 20)
        if not msg:
            os._exit(2)  # the engine is gone, and so is the server
        return tuple(json.loads(msg))

    with lock:  # no request is relayed before the engine has heard that the port is up
        http_front(args.port, relay)
        mine.send(b"up")  # the engine writes its state file (ready) only now: the port answers from then on
    print(f"front pid={os.getpid()} serving on 127.0.0.1:{args.port}, engine pid={eng.pid}", flush=True)
    sys.exit(eng.wait())


def engine(args, model=None):
    """The engine process of --processes 2: its requests come over the socket from the front, their token
    ids through the ring (model: the model's class, Server by default)."""
    sock = socket.socket(fileno=args.fd)
    rows = max(int(b) for b in args.batches.split(","))
    ring = Ring(args.ring, rows, create=False)

    def get(timeout):
        sock.settimeout(timeout)
        try:
            msg = sock.recv(256)
        except socket.timeout:
            raise queue.Empty from None
        if not msg:
            raise RuntimeError("the front closed its socket")
        i, batch = json.loads(msg)
        return batch, i

    def ready():  # the front told, then its word that its port is up
        sock.send(b"ready")
        if sock.recv(16) != b"up":
            raise RuntimeError("the front closed its socket before its HTTP port was up")

    run_engine(args, lambda: (model or Server)(args, prompt=ring.get(0, rows)), ready, get,
               lambda i, answer: sock.send(json.dumps(answer).encode()), ring)


def run_engine(args, make_server, ready, get, put, ring=None):
    """The engine loop: the server made, ready() once it is (the HTTP front up, here or in the front), then the
    requests from get(timeout) (queue.Empty when none came: the batch-1 self-check instead), each answered
    with put(request, (code, answer)); with a ring, a request's token ids are read from it."""
    iterations, extra = 0, {}
    state = StateFile(args.state) if args.state else None

    def write_state(status):
        if state:
            state.write(f"iterations={iterations}\npid={os.getpid()}\nstatus={status}\n"
                        + "".join(f"{k}={v}\n" for k, v in extra.items()))

    try:
        server = make_server()
        ready()
        extra = dict(server.phases, ready_s=round(time.monotonic() - T0, 3))
        print(f"ready pid={os.getpid()} serving on 127.0.0.1:{args.port} in {extra['ready_s']:.2f} s; batch 1: "
              f"{json.dumps(server.expected[server.batches[0]])}", flush=True)
        write_state("ok")
        while True:
            try:
                batch, reply = get(args.interval_ms / 1000.0)
            except queue.Empty:
                b = server.batches[0]
                got = server.generate(b)
                if got != server.expected[b]:
                    raise RuntimeError(f"batch {b}: {got} at iteration {iterations + 1}, expected "
                                       f"{server.expected[b]}")
                iterations += 1
                write_state("ok")
                continue
            if batch in server.batches:
                put(reply, (200, server.generate(batch, ring.get(reply, batch) if ring else None)))
            else:
                put(reply, (400, {"error": f"batch {batch}: the captured sizes are {server.batches}"}))
    except BaseException as e:  # an import error, a CUDA error after a bad restore, a mismatch
        why = f"{type(e).__name__}: {e}".replace("\n", " ")
        print(f"serving_workload[{os.getpid()}]: FAIL {why}", file=sys.stderr, flush=True)
        write_state(f"FAIL {why}")
        sys.exit(2)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="write the weights")
    m.add_argument("--dir", required=True)
    m.add_argument("--size", type=int, choices=sorted(SIZES), default=6, help="GB of bf16 weights, about")
    for name in ("serve", "engine"):
        s = sub.add_parser(name, help="load, warm up, answer" if name == "serve" else "--processes 2's engine")
        s.add_argument("--dir", required=True)
        s.add_argument("--port", type=int, required=True)
        s.add_argument("--kv-gb", type=float, default=8.0, help="GiB of KV-cache arena (zeros)")
        s.add_argument("--batches", default="1,2,4,8", help="decode batch sizes with a CUDA graph each")
        s.add_argument("--new-tokens", type=int, default=8)
        s.add_argument("--state", help="state file, rewritten after every self-check")
        s.add_argument("--interval-ms", type=int, default=200)
        s.add_argument("--eager", action="store_true", help="no torch.compile, no CUDA graphs")
        s.add_argument("--processes", type=int, choices=(1, 2), default=1,
                       help="2: an HTTP front without CUDA and an engine process")
    sub.choices["engine"].add_argument("--fd", type=int, required=True, help="the socket to the front")
    sub.choices["engine"].add_argument("--ring", required=True, help="the token ids' ring in /dev/shm")
    args = p.parse_args()
    {"make": make, "serve": serve, "engine": engine}[args.cmd](args)


if __name__ == "__main__":
    main()
