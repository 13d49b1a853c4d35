"""Kubernetes' own path (bench.py --cri): the calls the kubelet makes to containerd 2's CRI, with the workload as
a pod's container. On "node 1" (a containerd of its own: root, state, socket, content store) the workload's
pod sandbox and container are started (RunPodSandbox, CreateContainer, StartContainer; the GPU's device
nodes given to it), then checkpointed (CheckpointContainer to an archive). The archive becomes a checkpoint
image (the archive as its one layer, the annotation containerd's CRI looks for) pushed to a registry on the
loopback, and node 1's pod is removed. "Node 2" (another containerd, an empty store: it pulls) pulls the
image, the page cache is dropped, and a new pod sandbox with a container created from that image is started,
which restores it, until it answers as it did before its checkpoint. Per variant of this plugin: the
checkpoint, the image's build and push, the pull, the start (restore) and the first answer.

runc runs CRIU with this plugin from /etc/criu/runc.conf and its options from /etc/criu/cuda_plugin.conf, as on
a node. containerd 2.1, its runc shim, the CRI client (test-containers/cri/cri.py, its messages generated
from the CRI's api.proto, its calls over h2) and a static busybox for the pod sandbox's pause image come
from the bundle's cri-kit.tar.xz (scripts/gpu-bundle.sh --cri), or from the folder BENCH_CRI_KIT names, laid
out the same way (bin/containerd, bin/containerd-shim-runc-v2, bin/busybox, containerd-node.toml: a node's
configuration, py/cri.py, py/api_pb2.py and the Python packages they need). docker-registry as for --registry.

The containers run the host's own binaries: the host's /usr and /etc (and /lib, /opt... where they are
folders) bound at their own paths. The CRI binds recursively and CRIU dumps only the mounts the runtime
names, so a folder with another file system mounted below it is bound child by child, its symbolic links put
into the base image, and each file system its own mount: no mount nested in another one is left unnamed."""
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
import urllib.parse
import urllib.request

import bench_common as C
from bench_common import BUNDLE, SCENARIOS, VARIANTS, footprint, log
from bench_registry import (Files, Registry, base_image_tar, gpu_device_nodes, plugin_config, runc_binary,
                            runc_wrapper, tools)
from bench_run import (BATCHES, Workload, after_rewrite, answer, disk_read_bytes, drop_page_cache, parse_dump_log, parse_restore_log,
                       serving_weights, state, wait_for, workload_cmd)

REPO = "cuda-criu-bench"
NAMESPACE = "cuda-criu-bench"
CHECKPOINT_ANNOTATION = "org.criu.checkpoint.container.name"  # containerd's CRI restores an image that has it
LAYER = "application/vnd.oci.image.layer.v1.tar"
# Pods and containers on the host's network with a PID namespace each (the kubelet's default), and no
# AppArmor profile: left unsaid, containerd loads its default one where AppArmor is enabled, which needs
# apparmor_parser (a GPU machine may have neither it nor the profile).
SECURITY = {"namespace_options": {"network": "NODE", "pid": "CONTAINER"}, "apparmor": {"profile_type": "Unconfined"}}


def kit():
    """The folder of containerd, its shim, busybox and the CRI client (see the module's text)."""
    folder = os.environ.get("BENCH_CRI_KIT")
    if not folder:
        tar = os.path.join(BUNDLE, "cri-kit.tar.xz")
        if not os.path.exists(tar):
            raise RuntimeError("no CRI kit: build the bundle with scripts/gpu-bundle.sh --cri (or set BENCH_CRI_KIT)")
        folder = os.path.join(C.WORK, "cri-kit")
        if not os.path.isdir(folder):
            with tarfile.open(tar) as t:
                t.extractall(folder)
    for f in ("bin/containerd", "bin/containerd-shim-runc-v2", "bin/busybox", "containerd-node.toml", "py/cri.py",
              "py/api_pb2.py"):
        if not os.path.exists(os.path.join(folder, f)):
            raise RuntimeError(f"the CRI kit {folder} has no {f}")
    return folder


def cri_client(kit_folder):
    """The cri module of the kit (its messages' code and the Python packages it needs first on the path).
    protobuf's own Python implementation: the kit's copy has no compiled part for this Python."""
    os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
    py = os.path.join(kit_folder, "py")
    if py not in sys.path:
        sys.path.insert(0, py)
    # Where the kit carries protobuf (the GPU bundle's kit), its protobuf alone, whatever this Python has:
    # its own `google` may be a regular package (an __init__.py extending its path) or one that its
    # site-packages' .pth files made at start, and the kit's protobuf would load a compiled part of another
    # version from there (google._upb). This process needs no other google package. A kit without it
    # (the tests' own) uses this Python's.
    ours = os.path.join(py, "google")
    if os.path.isdir(ours):
        import google
        if list(google.__path__) != [ours]:
            google.__path__ = [ours]
            for m in [m for m in sys.modules if m.startswith(("google.protobuf", "google._upb"))]:
                del sys.modules[m]
    import cri
    return cri


def push_image(registry, repo, tag, layers, cmd, annotations=None):
    """An OCI image of the given layers (uncompressed tar files) and command pushed to registry (the
    registry's HTTP API, as a client pushes); its reference."""
    base = f"http://{registry.address}/v2/{repo}"

    def blob(path=None, data=None):
        h = hashlib.sha256()
        if path:
            with open(path, "rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
            size = os.path.getsize(path)
        else:
            h.update(data)
            size = len(data)
        digest = "sha256:" + h.hexdigest()
        with urllib.request.urlopen(urllib.request.Request(base + "/blobs/uploads/", method="POST"), timeout=60) as r:
            location = urllib.parse.urljoin(base + "/", r.headers["Location"])
        url = location + ("&" if "?" in location else "?") + "digest=" + urllib.parse.quote(digest)
        body = open(path, "rb") if path else data
        try:
            req = urllib.request.Request(url, data=body, method="PUT",
                                         headers={"Content-Length": str(size), "Content-Type": "application/octet-stream"})
            urllib.request.urlopen(req, timeout=3600).close()
        finally:
            if path:
                body.close()
        return digest, size

    diff_ids, descriptors = [], []
    for path in layers:
        digest, size = blob(path=path)
        diff_ids.append(digest)  # uncompressed: the layer's digest is its diff id
        descriptors.append({"mediaType": LAYER, "digest": digest, "size": size})
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": cmd, "Env": ["PATH=/usr/bin:/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    cdigest, csize = blob(data=config)
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cdigest, "size": csize},
                "layers": descriptors}
    if annotations:
        manifest["annotations"] = annotations
    req = urllib.request.Request(f"{base}/manifests/{tag}", data=json.dumps(manifest).encode(), method="PUT",
                                 headers={"Content-Type": manifest["mediaType"]})
    urllib.request.urlopen(req, timeout=60).close()
    return f"{registry.address}/{repo}:{tag}"


def host_binds(workload_paths):
    """[(path, read-only)] to bind at their own paths, and [(path, target)] of symbolic links for the base image:
    the host's /usr and /etc (/lib, /bin... where they are folders) and the workload's folders, none of them
    with another mount point below it (such a folder is bound child by child)."""
    with open("/proc/self/mountinfo") as f:
        points = {line.split()[4] for line in f}
    tops = [(p, True) for p in ["/usr", "/etc"] + [p for p in ("/lib", "/lib64", "/bin", "/sbin", "/opt")
                                                    if os.path.isdir(p) and not os.path.islink(p)]]
    for p, ro in workload_paths:
        p = os.path.realpath(p)
        if os.path.isdir(p) and not any(p == t or p.startswith(t + "/") for t, _ in tops):
            tops.append((p, ro))
    binds, links = [], []

    def cover(path, ro):
        if not any(m.startswith(path + "/") for m in points):
            binds.append((path, ro))
            return
        for name in sorted(os.listdir(path)):
            child = os.path.join(path, name)
            if os.path.islink(child):
                links.append((child, os.readlink(child)))
            elif os.path.isdir(child) or os.path.isfile(child):
                cover(child, ro)

    for p, ro in tops:
        cover(p, ro)
    return binds, links


class Node:
    """A containerd 2 of its own in folder (root, state, sockets, runc root), spoken to through its CRI socket."""

    def __init__(self, folder, kit_folder, bindir, pause):
        self.folder = folder
        self.kept = os.path.join(C.WORK, "logs", "-".join(folder.rstrip("/").split("/")[-2:]))  # see stop()
        os.makedirs(os.path.join(folder, "logs"), exist_ok=True)
        self.socket = os.path.join(folder, "containerd.sock")
        cri = cri_client(kit_folder)
        self.client = cri.Cri(os.path.join(kit_folder, "py"), self.socket, 600)
        self.failed = cri.CallFailed
        self.pb = self.client.pb
        conf = os.path.join(folder, "config.toml")
        with open(os.path.join(kit_folder, "containerd-node.toml")) as f:
            text = f.read()
        with open(conf, "w") as f:
            f.write(text.replace("@NODE@", folder).replace("@RUNC@", f"{bindir}/runc").replace("@PAUSE@", pause))
        env = dict(os.environ, PATH=f"{bindir}:{kit_folder}/bin:{os.environ['PATH']}")
        # Last: a node whose containerd runs is one the caller stops.
        self.proc = subprocess.Popen([os.path.join(kit_folder, "bin", "containerd"), "--config", conf], env=env,
                                     stdin=subprocess.DEVNULL, stdout=open(os.path.join(folder, "containerd.log"), "w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self):
        """Until containerd serves its CRI (stop() ends it either way)."""
        def up():
            if self.proc.poll() is not None:
                raise RuntimeError(f"containerd exited ({self.proc.returncode}): its log is the work folder's "
                                   f"logs/{os.path.basename(self.kept)}/containerd.log")
            try:
                self.client.request("runtime.v1.RuntimeService", "Version", timeout=5)
                return True
            except self.failed:
                return False
        wait_for("containerd to serve its CRI", up, 30)

    def call(self, service, method, **fields):
        try:
            return self.client.request(service, method, **fields)
        except self.failed as e:
            raise RuntimeError(f"CRI {method} on {os.path.basename(self.folder)} failed: {e}") from None

    def rt(self, method, **fields):
        return self.call("runtime.v1.RuntimeService", method, **fields)

    def pull(self, image):
        return self.call("runtime.v1.ImageService", "PullImage", image=self.pb.ImageSpec(image=image)).image_ref

    def message(self, kind, value):
        from google.protobuf import json_format
        return json_format.ParseDict(value, getattr(self.pb, kind)())

    def pod(self, name):
        """A pod sandbox on the host's network (the workload's port as on the host); its id and configuration."""
        config = self.message("PodSandboxConfig", {
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": "uid-" + name, "attempt": 0},
            "log_directory": os.path.join(self.folder, "logs", name),
            "linux": {"security_context": SECURITY}})
        os.makedirs(os.path.join(self.folder, "logs", name), exist_ok=True)
        return self.rt("RunPodSandbox", config=config).pod_sandbox_id, config

    def create(self, pod, pod_config, image, name, cmd, envs, binds):
        config = self.message("ContainerConfig", {
            "metadata": {"name": name, "attempt": 0}, "image": {"image": image}, "command": cmd,
            # KeyValue's value is bytes in the CRI (base64 in protobuf's JSON mapping)
            "envs": [{"key": k, "value": base64.b64encode(v.encode()).decode()} for k, v in envs.items()],
            "log_path": name + ".log",
            "mounts": [{"container_path": p, "host_path": p, "readonly": ro} for p, ro in binds],
            "devices": [{"container_path": d, "host_path": d, "permissions": "rwm"} for d in gpu_device_nodes()],
            "linux": {"security_context": SECURITY}})
        return self.rt("CreateContainer", pod_sandbox_id=pod, config=config, sandbox_config=pod_config).container_id

    def pid(self, ctr):
        with open(os.path.join(self.folder, "state", "io.containerd.runtime.v2.task", "k8s.io", ctr, "init.pid")) as f:
            return int(f.read())

    def restore_log(self, ctr, dest):
        """CRIU's log of the container's restore copied to dest: where the shim keeps it once the restore
        succeeded, or in runc's work folder after a failed one. dest, or None where there is none."""
        task = ("io.containerd.runtime.v2.task", "k8s.io", ctr)
        for src in (os.path.join(self.folder, "root", *task, "restore.log"),
                    os.path.join(self.folder, "state", *task, "work", "restore.log")):
            if os.path.exists(src):
                shutil.copy(src, dest)
                return dest
        return None

    def stop(self):
        """Every pod of the node stopped and removed, containerd stopped, what it left behind removed; its log
        and its containers' output kept in the work folder's logs."""
        shutil.copytree(os.path.join(self.folder, "logs"), self.kept, dirs_exist_ok=True)
        shutil.copy(os.path.join(self.folder, "containerd.log"), self.kept)
        try:
            for p in self.rt("ListPodSandbox").items:
                self.rt("StopPodSandbox", pod_sandbox_id=p.id)
                self.rt("RemovePodSandbox", pod_sandbox_id=p.id)
        except RuntimeError as e:
            log(f"cleaning up {self.folder}: {e}")
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        # Its mounts, and those of its store elsewhere: where a restore from a checkpoint image fails,
        # containerd 2.1 leaves the image's snapshot mounted on a temporary folder (/tmp/checkpointN).
        with open("/proc/self/mountinfo") as f:
            fields = [line.split() for line in f]
        mounts = sorted((x[4] for x in fields if x[4].startswith(self.folder + "/") or x[3].startswith(self.folder + "/")),
                        reverse=True)
        for m in mounts:
            subprocess.run(["umount", "-l", m], capture_output=True)
            if not m.startswith(self.folder + "/"):
                try:
                    os.rmdir(m)
                except OSError:
                    pass
        shutil.rmtree(self.folder, ignore_errors=True)


class PodWorkload(Workload):
    """A scenario's workload as a pod's container on node; what Workload checks (its state file, a server's
    answers) it checks the same way."""

    def __init__(self, node, image, kind, size, name, extra, binds):
        self.node, self.name, self.kind = node, name, kind
        self.state = os.path.join(C.WORK, f"{name}.state")
        self.files = [self.state]
        self.clear_state()
        cmd, env, self.port = workload_cmd(kind, size, 1, self.state, extra)
        self.batches = BATCHES
        self.envs = dict(env or os.environ, HOME=C.WORK)
        self.binds = binds
        self.cmd = cmd
        self.t0 = time.monotonic()
        self.pod, self.pod_config = node.pod(name)
        self.ctr = node.create(self.pod, self.pod_config, image, name, cmd, self.envs, binds)
        node.rt("StartContainer", container_id=self.ctr)
        self.ready_at = wait_for(f"{name} to be ready", lambda: state(self.state).get("status") or not self.running(), 600)
        if state(self.state).get("status") != "ok":
            raise RuntimeError(f"{name}: {state(self.state) or 'no state file'}; its output: the work folder's "
                               f"logs/{os.path.basename(node.kept)}/{name}")
        self.adopt()
        if kind == "serve":
            self.answers = {b: answer(self.port, b) for b in self.batches}

    def running(self):
        s = self.node.rt("ContainerStatus", container_id=self.ctr).status.state
        return s == self.node.pb.CONTAINER_RUNNING

    def adopt(self):
        self.pid = self.node.pid(self.ctr)
        self.pids = [self.pid]

    def kill(self):
        self.node.rt("StopPodSandbox", pod_sandbox_id=self.pod)
        self.node.rt("RemovePodSandbox", pod_sandbox_id=self.pod)


def one_variant(scenario, variant, kit_folder, runc, registry_binary, files, out):
    kind, size, _, *extra = SCENARIOS[scenario]
    extra = extra[0] if extra else ()
    name = f"{scenario}-{variant}".replace("+", "-")
    # The nodes beside the work folder, not in it: the containers bind the work folder, which must not hold
    # the nodes' own mounts (a container's root file system would be a mount nested in that bind).
    top = os.path.join(os.path.dirname(C.WORK.rstrip("/")), "cuda-criu-cri-" + name)
    shutil.rmtree(top, ignore_errors=True)
    # On this disk at once, at most: the registry's copy of the checkpoint, node 2's pulled layer, its
    # unpacked snapshot and the copy containerd makes of it to restore from (the archive is removed once
    # pushed; the registry once the container is created, containerd pulling the checkpoint's base image then).
    gpu, image_gib, zero = footprint(scenario)
    need = 4.2 * (image_gib - gpu * zero) + 1
    free = shutil.disk_usage(os.path.dirname(top)).free / C.GIB
    if free < need:
        raise RuntimeError(f"{os.path.dirname(top)} has {free:.0f} GiB free, the path through the CRI needs about "
                           f"{need:.0f} GiB")
    logs = os.path.join(C.WORK, "logs")
    bindir = os.path.join(top, "bin")
    runc_wrapper(bindir, runc, logs)
    plugin_config(files, variant)
    paths = [(BUNDLE, True), (C.WORK, False), (sys.prefix, True), (sys.base_prefix, True)]
    if kind == "serve":
        paths.append((serving_weights(extra[0]), True))
    paths += [(p, True) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    paths += [(os.environ[v], False) for v in ("FAKEGPU_DIR",) if v in os.environ]  # a dry run's fake GPU
    binds, links = host_binds(paths)
    layers = os.path.join(top, "layers")
    os.makedirs(layers)
    base_image_tar(os.path.join(layers, "base.tar"), links)
    with tarfile.open(os.path.join(layers, "pause.tar"), "w") as t:
        t.add(os.path.realpath(os.path.join(kit_folder, "bin", "busybox")), "busybox")
    nodes = []
    r = {"variant": variant, "round": 0, "what": f"{scenario}: through the CRI, {variant}"}
    registry = Registry(registry_binary, os.path.join(top, "registry"))
    try:
        base = push_image(registry, f"{REPO}/base", "1", [os.path.join(layers, "base.tar")], ["/bin/sh"])
        pause = push_image(registry, f"{REPO}/pause", "1", [os.path.join(layers, "pause.tar")],
                           ["/busybox", "sleep", "2147483647"])
        node1 = Node(os.path.join(top, "node1"), kit_folder, bindir, pause)
        nodes.append(node1)
        node1.wait_ready()
        node1.pull(base)
        log(f"{name}: the workload as a pod's container on node 1 ({len(binds)} binds)")
        w = PodWorkload(node1, base, kind, size, name, extra, binds)
        log(f"{name}: ready {w.ready_at - w.t0:.1f} s after its start; CheckpointContainer")
        archive = os.path.join(top, "checkpoint.tar")
        after_rewrite(name, w.iterations)
        t = time.monotonic()
        node1.rt("CheckpointContainer", container_id=w.ctr, location=archive, timeout=600)
        r["checkpoint_cmd_s"] = time.monotonic() - t
        before = w.iterations()
        at_checkpoint = open(w.state, "rb").read()
        with tarfile.open(archive) as t_:
            member = next((m for m in t_ if m.name.lstrip("./") == "dump.log"), None)
            if member:
                with open(os.path.join(logs, f"{name}-cri-dump.log"), "wb") as f:
                    f.write(t_.extractfile(member).read())
                r.update(parse_dump_log(os.path.join(logs, f"{name}-cri-dump.log")))
        w.kill()  # the pod has moved
        t = time.monotonic()
        image = push_image(registry, f"{REPO}/{name}", "checkpoint", [archive], None, {CHECKPOINT_ANNOTATION: name})
        r["image_push_s"] = time.monotonic() - t
        r["archive_gib"] = os.path.getsize(archive) / C.GIB
        os.unlink(archive)
        log(f"{name}: CheckpointContainer {r['checkpoint_cmd_s']:.1f} s ({r['archive_gib']:.2f} GiB archive); "
            f"checkpoint image built and pushed in {r['image_push_s']:.1f} s; node 2 pulls it and restores it")
        node2 = Node(os.path.join(top, "node2"), kit_folder, bindir, pause)
        nodes.append(node2)
        node2.wait_ready()
        t = time.monotonic()
        node2.pull(image)
        r["pull_s"] = time.monotonic() - t
        with open(w.state, "r+b") as f:
            f.write(at_checkpoint)
            f.truncate(len(at_checkpoint))
        w.node = node2
        w.pod, w.pod_config = node2.pod(name)
        w.ctr = node2.create(w.pod, w.pod_config, image, name, w.cmd, w.envs, binds)
        registry.stop()  # and its copy of the checkpoint with it
        shutil.rmtree(registry.folder, ignore_errors=True)
        drop_page_cache()  # a node that pulled the image some time before its restore
        read0 = disk_read_bytes()
        t0 = time.monotonic()
        try:
            node2.rt("StartContainer", container_id=w.ctr)
        except RuntimeError:
            kept = node2.restore_log(w.ctr, os.path.join(logs, f"{name}-cri-restore-failed.log"))
            if kept:
                with open(kept, errors="replace") as f:
                    log(f"{name}: the restore failed; CRIU's errors ({kept}):\n" +
                        "".join(line for line in f if "Error" in line or "cuda_plugin" in line)[-3000:])
            raise
        r["restore_cmd_s"] = time.monotonic() - t0
        w.adopt()
        r["ready_s"] = w.healthy_after(before) - t0
        r["read_gib"] = (disk_read_bytes() - read0) / C.GIB
        r["seconds"] = r["pull_s"] + r["ready_s"]
        restore_log = node2.restore_log(w.ctr, os.path.join(logs, f"{name}-cri-restore.log"))
        if restore_log:
            r.update(parse_restore_log(restore_log))
        log(f"{name}: through the CRI: CheckpointContainer {r['checkpoint_cmd_s']:.2f} s, image push "
            f"{r['image_push_s']:.2f} s; on node 2 pull {r['pull_s']:.2f} s, then (page cache dropped) StartContainer "
            f"{r['restore_cmd_s']:.2f} s, first answer {r['ready_s']:.2f} s after it began ({r['read_gib']:.1f} GiB "
            f"read from disk): {r['seconds']:.2f} s from the pull, data verified")
        out.append(r)
    finally:
        for n in nodes:
            n.stop()
        registry.stop()
        shutil.rmtree(top, ignore_errors=True)


def through_cri(scenario, out, failures):
    """bench.py --cri for one scenario, every variant of this plugin. Appends to out, and a variant that
    fails to failures."""
    kit_folder = kit()
    runc = runc_binary()
    registry = tools(("docker-registry",))["docker-registry"]
    files = Files()
    try:
        for variant in [v for v in VARIANTS if v.startswith("ours")]:
            try:
                one_variant(scenario, variant, kit_folder, runc, registry, files, out)
            except Exception as e:  # noqa: BLE001 (the next variant runs)
                where = "".join(traceback.format_tb(e.__traceback__)[-3:]).rstrip()
                log(f"{scenario} {variant} through the CRI: FAILED: {type(e).__name__}: {e}\n{where}")
                failures.append({"scenario": f"{scenario} (CRI)", "variant": variant, "round": 0, "error": str(e)})
    finally:
        files.restore()
