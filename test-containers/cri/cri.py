#!/usr/bin/python3
"""A CRI client for the container tests: the calls the kubelet makes to a container runtime's CRI socket,
one per command, in the spirit of crictl (which Debian does not package).

    cri.py generate API_PROTO DIR            Python code for the CRI's api.proto (runtime.v1) into DIR
    cri.py --gen DIR --socket SOCK COMMAND [ARGS...]

The code is generated from the api.proto of Debian's golang-k8s-cri-api-dev with grpc_tools (Debian's
python3-grpc-tools, whose protoc predates the field option debug_redact: the copy it reads has that
option taken out, nothing else). Commands (configurations are JSON files in the protobuf JSON mapping of
PodSandboxConfig and ContainerConfig):

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
import subprocess
import sys


def generate(proto, out):
    os.makedirs(out, exist_ok=True)
    with open(proto) as f:
        text = f.read()
    with open(os.path.join(out, "api.proto"), "w") as f:
        f.write(re.sub(r"\s*\[debug_redact = true\]", "", text))
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", out, "--python_out", out,
                    "--grpc_python_out", out, os.path.join(out, "api.proto")], check=True)


class Cri:
    def __init__(self, gen, socket, timeout):
        sys.path.insert(0, gen)
        import grpc
        import api_pb2
        import api_pb2_grpc
        from google.protobuf import json_format
        self.grpc, self.pb, self.json_format, self.timeout = grpc, api_pb2, json_format, timeout
        channel = grpc.insecure_channel("unix://" + socket)
        self.runtime = api_pb2_grpc.RuntimeServiceStub(channel)
        self.images = api_pb2_grpc.ImageServiceStub(channel)

    def call(self, service, method, **fields):
        request = getattr(self.pb, method + "Request")(**fields)
        try:
            return getattr(service, method)(request, timeout=self.timeout)
        except self.grpc.RpcError as e:
            sys.exit(f"CRI {method} failed: {e.code().name}: {e.details()}")

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
