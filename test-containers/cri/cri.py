#!/usr/bin/python3
"""A CRI client for the container tests: the calls the kubelet makes to a container runtime's CRI socket,
one per command, in the spirit of crictl (which Debian does not package).

    cri.py generate API_PROTO DIR            Python code for the CRI's api.proto (runtime.v1) into DIR
    cri.py --gen DIR --socket SOCK COMMAND [ARGS...]

The messages' code is generated from the api.proto of Debian's golang-k8s-cri-api-dev with grpc_tools
(Debian's python3-grpc-tools, whose protoc predates the field option debug_redact: the copy it reads has
that option taken out, nothing else). The calls go over gRPC's HTTP/2 mapping with Debian's h2 (pure
Python, as is protobuf's own implementation): so the client runs on any Python 3 with those folders on its
path, a node's Python included, where no grpcio is built for it. Commands (configurations are JSON files in
the protobuf JSON mapping of PodSandboxConfig and ContainerConfig):

    version                           RuntimeName RuntimeVersion RuntimeApiVersion
    pull IMAGE                        the image's reference, pulled by the runtime (ImageService.PullImage)
    runp POD.json                     RunPodSandbox: the pod sandbox's id
    create POD-ID CTR.json POD.json   CreateContainer: the container's id
    start ID                          StartContainer
    checkpoint ID ARCHIVE             CheckpointContainer to ARCHIVE (a tar file the runtime writes)
    inspect ID                        ContainerStatus, as JSON
    ps                                ListContainers: one line per container: ID POD-ID STATE NAME
    pods                              ListPodSandbox: one line per pod sandbox: ID STATE NAME
    stop ID | rm ID                   StopContainer (no grace period) | RemoveContainer
    stopp ID | rmp ID                 StopPodSandbox | RemovePodSandbox

A call that fails prints 'CRI METHOD failed: CODE: DETAILS' (what the runtime answered) on stderr and
exits 1. Every call has a deadline (--timeout, seconds).
"""
import argparse
import json
import os
import re
import socket as sock
import subprocess
import sys
import time


def generate(proto, out):
    os.makedirs(out, exist_ok=True)
    with open(proto) as f:
        text = f.read()
    with open(os.path.join(out, "api.proto"), "w") as f:
        f.write(re.sub(r"\s*\[debug_redact = true\]", "", text))
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", out, "--python_out", out,
                    os.path.join(out, "api.proto")], check=True)


# gRPC's status codes by number (grpc/doc/statuscodes.md).
CODES = ("OK CANCELLED UNKNOWN INVALID_ARGUMENT DEADLINE_EXCEEDED NOT_FOUND ALREADY_EXISTS PERMISSION_DENIED "
         "RESOURCE_EXHAUSTED FAILED_PRECONDITION ABORTED OUT_OF_RANGE UNIMPLEMENTED INTERNAL UNAVAILABLE DATA_LOSS "
         "UNAUTHENTICATED").split()


class CallFailed(Exception):
    def __init__(self, code, details):
        super().__init__(f"{code}: {details}")


def unary_call(socket_path, path, request, timeout):
    """One unary gRPC call over HTTP/2 (h2c with prior knowledge) on a unix socket: the serialised request
    in, the serialised answer out; CallFailed with the status the server answered, or DEADLINE_EXCEEDED /
    UNAVAILABLE when the deadline passes or the socket does not answer."""
    import h2.config
    import h2.connection
    import h2.events
    from urllib.parse import unquote
    deadline = time.monotonic() + timeout
    s = sock.socket(sock.AF_UNIX, sock.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.connect(socket_path)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", path),
                                (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers"),
                                ("grpc-timeout", f"{max(1, int(timeout * 1000))}m")])
        body = b"\0" + len(request).to_bytes(4, "big") + request
        answer, status, ended = bytearray(), {}, False
        while not ended:
            while body and conn.local_flow_control_window(sid) > 0:  # what the server's windows let through
                n = min(len(body), conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                conn.send_data(sid, body[:n], end_stream=n == len(body))
                body = body[n:]
            s.sendall(conn.data_to_send())
            s.settimeout(max(0.001, deadline - time.monotonic()))
            data = s.recv(1 << 16)
            if not data:
                raise CallFailed("UNAVAILABLE", "the runtime closed the connection")
            for e in conn.receive_data(data):
                if isinstance(e, h2.events.DataReceived) and e.stream_id == sid:
                    answer += e.data
                    conn.acknowledge_received_data(e.flow_controlled_length, sid)
                elif isinstance(e, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    status.update(e.headers)
                elif isinstance(e, h2.events.StreamEnded) and e.stream_id == sid:
                    ended = True
                elif isinstance(e, h2.events.StreamReset) and e.stream_id == sid:
                    raise CallFailed("UNAVAILABLE", f"the runtime reset the call (HTTP/2 error {e.error_code})")
                elif isinstance(e, h2.events.ConnectionTerminated):
                    raise CallFailed("UNAVAILABLE", f"the runtime ended the connection (HTTP/2 error {e.error_code})")
    except sock.timeout:
        raise CallFailed("DEADLINE_EXCEEDED", f"no answer within {timeout:g} s") from None
    except OSError as e:
        raise CallFailed("UNAVAILABLE", f"{socket_path}: {e.strerror or e}") from None
    finally:
        s.close()
    code = int(status.get("grpc-status", CODES.index("UNKNOWN")))
    if code != 0:
        name = CODES[code] if code < len(CODES) else str(code)
        raise CallFailed(name, unquote(status.get("grpc-message", f"HTTP status {status.get(':status', '?')}")))
    if len(answer) < 5 or answer[0] != 0 or int.from_bytes(answer[1:5], "big") != len(answer) - 5:
        raise CallFailed("INTERNAL", f"an answer of {len(answer)} bytes that is not one uncompressed gRPC message")
    return bytes(answer[5:])


class Cri:
    def __init__(self, gen, socket, timeout):
        sys.path.insert(0, gen)
        import api_pb2
        from google.protobuf import json_format
        self.pb, self.json_format, self.socket, self.timeout = api_pb2, json_format, socket, timeout
        self.runtime, self.images = "runtime.v1.RuntimeService", "runtime.v1.ImageService"

    def request(self, service, method, timeout=None, **fields):
        """The answer to METHOD of SERVICE; CallFailed when the runtime refuses it."""
        request = getattr(self.pb, method + "Request")(**fields)
        answer = unary_call(self.socket, f"/{service}/{method}", request.SerializeToString(), timeout or self.timeout)
        return getattr(self.pb, method + "Response").FromString(answer)

    def call(self, service, method, **fields):
        try:
            return self.request(service, method, **fields)
        except CallFailed as e:
            sys.exit(f"CRI {method} failed: {e}")

    def config(self, path, kind):
        with open(path) as f:
            return self.json_format.ParseDict(json.load(f), getattr(self.pb, kind)())

    def run(self, cmd, args):
        rt, pb = self.runtime, self.pb
        if cmd == "version":
            r = self.call(rt, "Version")
            print(r.runtime_name, r.runtime_version, r.runtime_api_version)
        elif cmd == "pull":
            r = self.call(self.images, "PullImage", image=pb.ImageSpec(image=args[0]))
            print(r.image_ref)
        elif cmd == "runp":
            print(self.call(rt, "RunPodSandbox", config=self.config(args[0], "PodSandboxConfig")).pod_sandbox_id)
        elif cmd == "create":
            r = self.call(rt, "CreateContainer", pod_sandbox_id=args[0],
                          config=self.config(args[1], "ContainerConfig"),
                          sandbox_config=self.config(args[2], "PodSandboxConfig"))
            print(r.container_id)
        elif cmd == "start":
            self.call(rt, "StartContainer", container_id=args[0])
        elif cmd == "checkpoint":
            self.call(rt, "CheckpointContainer", container_id=args[0], location=args[1],
                      timeout=int(self.timeout))
        elif cmd == "inspect":
            r = self.call(rt, "ContainerStatus", container_id=args[0])
            print(self.json_format.MessageToJson(r.status))
        elif cmd == "ps":
            for c in self.call(rt, "ListContainers").containers:
                print(c.id, c.pod_sandbox_id, pb.ContainerState.Name(c.state), c.metadata.name)
        elif cmd == "pods":
            for p in self.call(rt, "ListPodSandbox").items:
                print(p.id, pb.PodSandboxState.Name(p.state), p.metadata.name)
        elif cmd == "stop":
            self.call(rt, "StopContainer", container_id=args[0], timeout=0)
        elif cmd == "rm":
            self.call(rt, "RemoveContainer", container_id=args[0])
        elif cmd == "stopp":
            self.call(rt, "StopPodSandbox", pod_sandbox_id=args[0])
        elif cmd == "rmp":
            self.call(rt, "RemovePodSandbox", pod_sandbox_id=args[0])
        else:
            sys.exit(f"cri.py: unknown command {cmd}")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "generate":
        generate(sys.argv[2], sys.argv[3])
        return
    p = argparse.ArgumentParser(description="a CRI client: the kubelet's calls, one per command")
    p.add_argument("--gen", required=True, help="the directory of the generated code (cri.py generate)")
    p.add_argument("--socket", required=True, help="the runtime's CRI socket")
    p.add_argument("--timeout", type=float, default=60, help="seconds each call may take")
    p.add_argument("command")
    p.add_argument("args", nargs="*")
    a = p.parse_args()
    Cri(a.gen, a.socket, a.timeout).run(a.command, a.args)


if __name__ == "__main__":
    main()
