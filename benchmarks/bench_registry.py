"""A checkpoint image through a registry (bench.py --registry), the way a platform moves a container to a node
that has never seen it: the workload started in a podman container (runtime runc; CRIU loads this plugin from
/etc/criu/runc.conf and takes its options from /etc/criu/cuda_plugin.conf, as on a node), checkpointed into a
checkpoint image (podman container checkpoint --create-image), pushed with podman's default layer compression
to a registry on the loopback (docker-registry), and everything of that host removed; then on a "second host"
(an empty store at the same paths, as a node has podman's default paths: it must pull) the image pulled, the
page cache dropped, and the container restored from it (podman container restore IMAGE) until it answers as
it did before its checkpoint. Per variant of this
plugin: the pull, the restore to the first answer, their sum, and the layer as the registry holds it (its size
and compression, read from the image's manifest there).

podman, conmon and docker-registry come from the bundle's podman-kit.tar.xz (scripts/gpu-bundle.sh --podman:
Debian's builds with the libraries they need) or, without it, from this machine's PATH."""
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request

import bench_common as C
from bench_common import BUNDLE, CRIU, SCENARIOS, VARIANTS, footprint, log
from bench_run import (BATCHES, Workload, after_rewrite, answer, disk_read_bytes, drop_page_cache, free_port, parse_dump_log,
                       parse_restore_log, serving_weights, state, wait_for, workload_cmd)

REPO = "cuda-criu-bench"
BASE = "base:1"  # the containers' image: mount points and the host's top-level links, nothing else
# /etc/containers/policy.json: podman refuses to pull or commit without one.
POLICY = {"default": [{"type": "insecureAcceptAnything"}]}


def tools(names=("podman", "conmon", "docker-registry")):
    """{name: path} of podman, conmon and docker-registry (or those of names): the bundle's kit, unpacked once
    into the work folder, or this machine's."""
    kit = os.path.join(BUNDLE, "podman-kit.tar.xz")
    if os.path.exists(kit):
        dest = os.path.join(C.WORK, "podman-kit")
        if not os.path.isdir(dest):
            with tarfile.open(kit) as t:
                t.extractall(dest)
        return {n: os.path.join(dest, "bin", n) for n in names}
    found = {n: shutil.which(n) for n in names}
    if "conmon" in found:
        found["conmon"] = found["conmon"] or next((p for p in ("/usr/libexec/podman/conmon", "/usr/bin/conmon")
                                                   if os.path.exists(p)), None)
    missing = [n for n, p in found.items() if not p]
    if missing:
        raise RuntimeError(f"no {', '.join(missing)}: build the bundle with scripts/gpu-bundle.sh --podman "
                           "(or install podman and docker-registry)")
    return found


def runc_binary():
    runc = os.path.join(BUNDLE, "sbin", "runc")
    if not os.path.exists(runc):
        runc = shutil.which("runc")
    if not runc:
        raise RuntimeError("no runc in the bundle (sbin/runc) nor on this machine")
    # runc re-executes itself (runc init) with an empty environment: its libseccomp must be the system's.
    if subprocess.run("ldconfig -p | grep -q 'libseccomp\\.so\\.2 '", shell=True).returncode != 0:
        lib = os.path.join(BUNDLE, "lib", "libseccomp.so.2")
        log("this machine has no libseccomp.so.2: installing the bundle's copy into /usr/local/lib for runc")
        shutil.copy(lib, "/usr/local/lib/")
        subprocess.run(["ldconfig"], check=True)
    return runc


class Files:
    """Files written for the run in system places (/etc/criu/..., /etc/containers/policy.json): what was
    there is kept aside and put back by restore()."""

    def __init__(self):
        self.saved = []
        self.made = []  # folders made for them (/etc/criu on a machine without CRIU's configuration)

    def write(self, path, text):
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            os.makedirs(folder)
            self.made.append(folder)
        if not any(p == path for p, _ in self.saved):
            old = None
            if os.path.exists(path):
                with open(path) as f:
                    old = f.read()
            self.saved.append((path, old))
        with open(path, "w") as f:
            f.write(text)

    def restore(self):
        for path, old in reversed(self.saved):
            if old is None:
                os.unlink(path)
            else:
                with open(path, "w") as f:
                    f.write(old)
        for folder in reversed(self.made):
            try:
                os.rmdir(folder)
            except OSError:  # something else was put there meanwhile: it stays
                pass
        self.saved, self.made = [], []


class Podman:
    """podman with a store of its own in folder (one "host"), runtime runc through a wrapper that hands runc
    the bundle's CRIU, conmon from the kit, cgroupfs, no systemd."""

    def __init__(self, folder, kit, wrapper):
        self.folder, self.kit = folder, kit
        for d in ("storage", "run", "tmp"):
            os.makedirs(os.path.join(folder, d), exist_ok=True)
        conf = os.path.join(folder, "containers.conf")
        with open(conf, "w") as f:
            f.write(f'[engine]\nruntime = "runc"\nconmon_path = ["{kit["conmon"]}"]\ncgroup_manager = "cgroupfs"\n'
                    f'events_logger = "file"\n[engine.runtimes]\nrunc = ["{wrapper}"]\n')
        storage = os.path.join(folder, "storage.conf")
        with open(storage, "w") as f:
            f.write(f'[storage]\ndriver = "overlay"\ngraphroot = "{folder}/storage"\nrunroot = "{folder}/run"\n')
        registries = os.path.join(folder, "registries.conf")
        with open(registries, "w") as f:
            f.write("unqualified-search-registries = []\n")
        self.env = dict(os.environ, CONTAINERS_CONF=conf, CONTAINERS_STORAGE_CONF=storage,
                        CONTAINERS_REGISTRIES_CONF=registries, PATH=os.path.dirname(wrapper) + ":" + os.environ["PATH"])

    def __call__(self, *args, timeout=600):
        cmd = [self.kit["podman"], "--tmpdir", os.path.join(self.folder, "tmp"), *args]
        p = subprocess.run(cmd, env=self.env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args[:3])} ... failed (exit {p.returncode}): "
                               f"{(p.stderr or p.stdout).strip()[-600:]}")
        return p.stdout.strip()

    def wipe(self):
        """Everything of this host gone: what is left is a second host, whose empty store has the same paths
        (a checkpoint image names the paths of the host that made it: conmon's files in runroot, say)."""
        self.quiet("rm", "-a", "-f", "-t", "0")
        self.quiet("rmi", "-a", "-f")
        subprocess.run(["umount", "-R", os.path.join(self.folder, "storage", "overlay")], capture_output=True)
        for d in ("storage", "run", "tmp"):
            shutil.rmtree(os.path.join(self.folder, d), ignore_errors=True)
            os.makedirs(os.path.join(self.folder, d))

    def quiet(self, *args):
        try:
            self(*args, timeout=120)
        except (RuntimeError, subprocess.TimeoutExpired):
            pass

    def inspect(self, name, fmt):
        return self("inspect", "-f", fmt, name, timeout=60)

    def log_of(self, name, which, dest):
        """CRIU's dump.log or restore.log of a container (kept by --keep) copied to dest."""
        src = os.path.join(self.inspect(name, "{{.StaticDir}}"), which)
        if os.path.exists(src):
            shutil.copy(src, dest)
            return dest
        return None


class Registry:
    """docker-registry on 127.0.0.1, its storage in folder; stop() ends it and removes its storage."""

    def __init__(self, binary, folder):
        self.folder = folder
        port = free_port()
        os.makedirs(folder, exist_ok=True)
        conf = os.path.join(folder, "config.yml")
        with open(conf, "w") as f:
            f.write(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {folder}/data\n"
                    f"http:\n  addr: 127.0.0.1:{port}\n")
        self.proc = subprocess.Popen([binary, "serve", conf], stdin=subprocess.DEVNULL,
                                     stdout=open(os.path.join(C.WORK, "logs", "registry.log"), "a"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.address = f"127.0.0.1:{port}"

        def up():
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited ({self.proc.returncode}): see logs/registry.log")
            try:
                urllib.request.urlopen(f"http://{self.address}/v2/", timeout=1).close()
                return True
            except OSError:
                return False
        wait_for("the registry to listen", up, 20)

    def layers(self, repo, tag):
        """[(media type, bytes)] of the layers of repo:tag, from its manifest in the registry."""
        req = urllib.request.Request(f"http://{self.address}/v2/{repo}/manifests/{tag}", headers={"Accept": ", ".join(
            ["application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"])})
        with urllib.request.urlopen(req, timeout=30) as r:
            return [(layer["mediaType"], layer["size"]) for layer in json.loads(r.read())["layers"]]

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def compression_of(media_type):
    for name in ("zstd", "gzip"):
        if media_type.endswith("+" + name):
            return name
    return "none"


def base_image_tar(path, links=()):
    """The containers' image: the mount points the binds need and the host's top-level symbolic links
    (/bin -> usr/bin and the like), so that the host's binaries run there as they are; and the symbolic
    links of links ([(path, target)], with the folders above them)."""
    dirs = ["usr", "etc", "proc", "sys", "dev", "tmp", "run", "var", "var/tmp", "root", "opt", "mnt"]
    links = [(d, os.readlink("/" + d)) for d in ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
             if os.path.islink("/" + d)] + [(p.lstrip("/"), target) for p, target in links]
    for p, _ in links:
        parts = p.split("/")[:-1]
        dirs += ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    with tarfile.open(path, "w") as t:
        for d in dict.fromkeys(dirs):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d in ("tmp", "var/tmp") else 0o755
            t.addfile(info)
        for p, target in links:
            info = tarfile.TarInfo(p)
            info.type, info.linkname = tarfile.SYMTYPE, target
            t.addfile(info)


def mount_options(workload_paths):
    """podman run's mounts for a workload that runs the host's own binaries: the host's /usr and /etc (and
    /lib, /bin... where they are folders, not links) read-only, each mount below them as a bind of its own
    (CRIU dumps only the mounts it is told of: the driver's own file system under /usr, say), and the
    workload's folders (the bundle, the work folder read-write, the model's weights, a Python prefix outside
    /usr, the library folders of LD_LIBRARY_PATH) at their own paths."""
    tops = ["/usr", "/etc"] + [p for p in ("/lib", "/lib64", "/bin", "/sbin", "/opt")
                               if os.path.isdir(p) and not os.path.islink(p)]
    with open("/proc/self/mountinfo") as f:
        points = sorted({line.split()[4] for line in f}, key=len)
    binds = [(p, True) for p in tops]
    binds += [(m, True) for m in points if any(m.startswith(t + "/") for t in tops)]
    for p, ro in workload_paths:
        p = os.path.realpath(p)
        if os.path.isdir(p) and not any(p == b or p.startswith(b + "/") for b, _ in binds):
            binds.append((p, ro))
    opts = []
    for p, ro in binds:
        opts += ["--mount", f"type=bind,source={p},destination={p},bind-nonrecursive=true" + (",ro=true" if ro else "")]
    return opts


def ulimits():
    """Open files and processes: podman's defaults for root (the hard maxima) may be more than a machine lets a
    container set; the test containers' limits, at most this benchmark's own."""
    return [a for name, limit, most in (("nofile", resource.RLIMIT_NOFILE, 65536), ("nproc", resource.RLIMIT_NPROC, 32768))
            for a in ("--ulimit", "{0}={1}:{1}".format(name, min(resource.getrlimit(limit)[0], most)))]


def gpu_device_nodes():
    """The host's NVIDIA device nodes (the fake GPU has none)."""
    nodes = [os.path.join("/dev", n) for n in sorted(os.listdir("/dev")) if n.startswith("nvidia")]
    caps = "/dev/nvidia-caps"
    if os.path.isdir(caps):
        nodes = [n for n in nodes if n != caps] + [os.path.join(caps, n) for n in sorted(os.listdir(caps))]
    return nodes


class ContainerWorkload(Workload):
    """A scenario's workload as the process of a podman container on the host's network; what Workload
    checks (its state file, a server's answers) it checks the same way."""

    def __init__(self, pod, image, kind, size, name, extra):
        self.pod, self.name, self.kind = pod, name, kind
        self.state = os.path.join(C.WORK, f"{name}.state")
        self.files = [self.state]
        self.clear_state()
        cmd, env, self.port = workload_cmd(kind, size, 1, self.state, extra)
        env = env or {}
        self.batches = BATCHES
        paths = [(BUNDLE, True), (C.WORK, False), (sys.prefix, True), (sys.base_prefix, True)]
        if kind == "serve":
            paths.append((serving_weights(extra[0]), True))
        paths += [(p, True) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
        paths += [(os.environ[v], False) for v in ("FAKEGPU_DIR",) if v in os.environ]  # a dry run's fake GPU
        # The workload's environment is the benchmark's, as it is for every other scenario (--env-host).
        envs = [a for k, v in env.items() if os.environ.get(k) != v for a in ("--env", f"{k}={v}")]
        self.t0 = time.monotonic()
        self.out = os.path.join(C.WORK, f"{name}.out")
        # No SELinux label or AppArmor profile: a host with either enabled but without podman's policy
        # installed (as the GPU machine would be) could not start the container.
        pod("run", "-d", "--name", name, "--network", "host", "--security-opt", "label=disable",
            "--security-opt", "apparmor=unconfined", "--env-host", "--env", f"HOME={C.WORK}",
            "--shm-size", "1g", *ulimits(), *[a for n in gpu_device_nodes() for a in ("--device", n)], *mount_options(paths), *envs,
            image, *cmd)
        self.ready_at = wait_for(f"{name} to be ready", lambda: state(self.state).get("status") or not self.running(), 600)
        if state(self.state).get("status") != "ok":
            logs = subprocess.run([pod.kit["podman"], "logs", name], capture_output=True, text=True, env=pod.env).stdout
            raise RuntimeError(f"{name}: {state(self.state) or 'no state file'}; its output: {logs.strip()[-400:]}")
        self.adopt()
        if kind == "serve":
            self.answers = {b: answer(self.port, b) for b in self.batches}

    def running(self):
        try:
            return self.pod.inspect(self.name, "{{.State.Status}}") == "running"
        except RuntimeError:
            return False

    def adopt(self):
        self.pid = int(self.pod.inspect(self.name, "{{.State.Pid}}"))
        self.pids = [self.pid]

    def kill(self):
        self.pod.quiet("rm", "-f", "-t", "0", self.name)


def runc_wrapper(bindir, runc, keep=None):
    """bindir/runc: runc with the bundle's CRIU (and a dry run's fake GPU), and bindir/criu; its path. With
    keep, a folder: CRIU's log of a checkpoint or restore that fails is copied there (a runtime that removes
    its work folder with the failed container keeps it nowhere else)."""
    os.makedirs(bindir)
    wrapper = os.path.join(bindir, "runc")
    fake = "".join(f"export {k}='{v}'\n" for k, v in os.environ.items() if k.startswith("FAKEGPU_"))
    with open(wrapper, "w") as f:
        if not keep:
            f.write(f"#!/bin/sh\n{fake}exec {runc} --criu {CRIU} \"$@\"\n")
        else:
            f.write(f"""#!/bin/bash
{fake}{runc} --criu {CRIU} "$@" && exit 0
rc=$? prev="" work="" cmd=""
for a in "$@"; do
	[ "$prev" = --work-path ] && work=$a
	case "$a" in checkpoint | restore) [ -n "$cmd" ] || cmd=$a ;; esac
	prev=$a
done
log=$work/dump.log
[ "$cmd" = restore ] && log=$work/restore.log
[ -n "$cmd" ] && [ -f "$log" ] && cp "$log" "{keep}/$cmd-failed-$(date +%s%N).log"
exit $rc
""")
    os.chmod(wrapper, 0o755)
    os.symlink(CRIU, os.path.join(bindir, "criu"))  # podman asks criu for its version before a checkpoint
    return wrapper


def plugin_config(files, variant):
    """The plugin as a node has it: CRIU's libdir for runc, the variant's options (and those of this run's
    environment, which criu_env hands the other scenarios' CRIU) in cuda_plugin.conf."""
    files.write("/etc/criu/runc.conf", f"libdir {VARIANTS[variant]['libdir']}\n")
    options = {k: v for k, v in os.environ.items() if k.startswith("CUDA_CRIU_") and k != "CUDA_CRIU_CONFIG"}
    options.update(VARIANTS[variant].get("env", {}))
    files.write("/etc/criu/cuda_plugin.conf",
                "".join(f"{k[len('CUDA_CRIU_'):].lower().replace('_', '-')}={v}\n" for k, v in options.items()))


def one_variant(scenario, variant, layers, tools_, runc, files, out):
    """The path through the registry for one variant, its image pushed once per layer compression in layers
    (podman's --compression-format: gzip, zstd), each restored on its own; appends their figures to out."""
    kind, size, _, *extra = SCENARIOS[scenario]
    extra = extra[0] if extra else ()
    name = f"{scenario}-{variant}".replace("+", "-")
    top = os.path.join(C.WORK, "registry-" + name)
    shutil.rmtree(top, ignore_errors=True)
    # On this disk at once, at most: the image and a layer per compression in the registries (a layer taken
    # as 3/4 of the image); then the layers not yet pulled, the image pulled and the checkpoint podman copies
    # out of it to restore from. A registry is another machine's disk: each goes once pulled from.
    gpu, image, zero = footprint(scenario)
    on_disk, n = image - gpu * zero, len(layers)
    need = max(1 + 0.75 * n, 2 + 0.75 * (n - 1)) * on_disk + 1
    free = shutil.disk_usage(C.WORK).free / C.GIB
    if free < need:
        raise RuntimeError(f"{C.WORK} has {free:.0f} GiB free, the path through a registry with {', '.join(layers)} "
                           f"layers needs about {need:.0f} GiB: ask for fewer (--registry-layers)")
    wrapper = runc_wrapper(os.path.join(top, "bin"), runc)
    plugin_config(files, variant)
    host = Podman(os.path.join(top, "host"), tools_, wrapper)
    registries = {"base": Registry(tools_["docker-registry"], os.path.join(top, "registry-base"))}
    base, local = f"{registries['base'].address}/{REPO}/{BASE}", f"localhost/{REPO}/{name}:checkpoint"
    logs = os.path.join(C.WORK, "logs")
    common = {"variant": variant, "round": 0}
    try:
        tar = os.path.join(top, "base.tar")
        base_image_tar(tar)
        host("import", tar, base)
        host("push", "--tls-verify=false", base)
        log(f"{name}: the workload in a container on the first host")
        w = ContainerWorkload(host, base, kind, size, name, extra)
        phases = ", ".join(f"{k[:-2]} {v} s" for k, v in state(w.state).items() if k.endswith("_s"))
        log(f"{name}: ready {w.ready_at - w.t0:.1f} s after its start{f' (its own steps: {phases})' if phases else ''}; "
            "checkpointing it into an image")
        after_rewrite(name, w.iterations)
        t = time.monotonic()
        host("container", "checkpoint", "--keep", "--create-image", local, name)
        common["checkpoint_cmd_s"] = time.monotonic() - t
        before = w.iterations()
        # The state file as the checkpoint left it (the workload holds it open, at its size), put back before
        # each restore: its progress is judged from these values.
        at_checkpoint = open(w.state, "rb").read()
        if host.log_of(name, "dump.log", os.path.join(logs, f"{name}-registry-dump.log")):
            common.update(parse_dump_log(os.path.join(logs, f"{name}-registry-dump.log")))
        w.kill()  # and its checkpoint folder with it: the image holds the checkpoint now
        common["image_gib"] = int(host("image", "inspect", "-f", "{{.Size}}", local)) / C.GIB
        pushed = {}
        for comp in layers:
            registries[comp] = Registry(tools_["docker-registry"], os.path.join(top, "registry-" + comp))
            ref = f"{registries[comp].address}/{REPO}/{name}:checkpoint"
            t = time.monotonic()
            host("push", "--tls-verify=false", "--compression-format", comp, local, ref)
            got = registries[comp].layers(f"{REPO}/{name}", "checkpoint")
            pushed[comp] = {"push_s": time.monotonic() - t, "layer_gib": sum(n for _, n in got) / C.GIB,
                            "layer_compression": ",".join(sorted({compression_of(m) for m, _ in got})), "ref": ref}
            log(f"{name}: checkpoint {common['checkpoint_cmd_s']:.1f} s; pushed with {comp} layers in "
                f"{pushed[comp]['push_s']:.1f} s ({pushed[comp]['layer_gib']:.2f} GiB in the registry)")
        host.wipe()  # the second host: it must pull

        for comp in layers:
            r = dict(common, what=f"{scenario}: through a registry, {variant}" + (f", {comp} layers" if len(layers) > 1 else ""))
            ref = pushed[comp].pop("ref")
            r.update(pushed[comp])
            log(f"{name}: the second host pulls the image with {comp} layers, then restores it")
            host("pull", "--tls-verify=false", base)
            t = time.monotonic()
            host("pull", "--tls-verify=false", ref)
            r["pull_s"] = time.monotonic() - t
            registries.pop(comp).stop()
            with open(w.state, "r+b") as f:
                f.write(at_checkpoint)
                f.truncate(len(at_checkpoint))
            drop_page_cache()  # a node that pulled the image some time before its restore
            read0 = disk_read_bytes()
            t0 = time.monotonic()
            host("container", "restore", "--keep", "--name", name, ref)
            r["restore_cmd_s"] = time.monotonic() - t0
            w.adopt()
            r["ready_s"] = w.healthy_after(before) - t0
            r["read_gib"] = (disk_read_bytes() - read0) / C.GIB
            r["seconds"] = r["pull_s"] + r["ready_s"]
            restore_log = os.path.join(logs, f"{name}-{comp}-registry-restore.log")
            if host.log_of(name, "restore.log", restore_log):
                r.update(parse_restore_log(restore_log))
            log(f"{name}: through a registry ({r['layer_compression']} layers, {r['layer_gib']:.2f} GiB in the registry, "
                f"{r['image_gib']:.2f} GiB unpacked): checkpoint {r['checkpoint_cmd_s']:.2f} s, push {r['push_s']:.2f} s; "
                f"on the second host pull {r['pull_s']:.2f} s, then (page cache dropped) restore {r['restore_cmd_s']:.2f} s, "
                f"first answer {r['ready_s']:.2f} s after it began ({r['read_gib']:.1f} GiB read from disk): "
                f"{r['seconds']:.2f} s from the pull, data verified")
            out.append(r)
            host.wipe()
    finally:
        host.wipe()
        for registry in registries.values():
            registry.stop()
        shutil.rmtree(top, ignore_errors=True)


def through_registry(scenario, layers, out, failures):
    """bench.py --registry for one scenario, every variant of this plugin (the in-tree plugin's variants are
    left out: podman would run its CRIU with the in-tree plugin and NVIDIA's utility alike, which the round
    trips compare already). Appends to out, and a variant that fails to failures."""
    tools_ = tools()
    runc = runc_binary()
    files = Files()
    try:
        if not os.path.exists("/etc/containers/policy.json"):  # a machine without podman has none
            files.write("/etc/containers/policy.json", json.dumps(POLICY) + "\n")
        for variant in [v for v in VARIANTS if v.startswith("ours")]:
            try:
                one_variant(scenario, variant, layers, tools_, runc, files, out)
            except Exception as e:  # noqa: BLE001 (the next variant runs)
                log(f"{scenario} {variant} through a registry: FAILED: {e}")
                failures.append({"scenario": f"{scenario} (registry)", "variant": variant, "round": 0, "error": str(e)})
    finally:
        files.restore()
