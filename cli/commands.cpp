// The command table (commands.h): every command of cuda-criu with its handler, options and manual page.
// help.cpp prints the pages; docs/cli.md carries the same content in short.
#include "commands.h"

#include <algorithm>
#include <map>

#include "cli.h"

namespace cuda_criu::cli {

// The handlers, each in its command's file.
int cmd_check(const Invocation &);
int cmd_inspect(const Invocation &);
int cmd_ps(const Invocation &);
int cmd_status(const Invocation &);
int cmd_action(const Invocation &); // lock, checkpoint, restore, unlock, suspend, resume
int cmd_compat(const Invocation &);
int cmd_selftest(const Invocation &);
int cmd_selftest_workload(const Invocation &);
int cmd_roundtrip(const Invocation &);
int cmd_migrate(const Invocation &);
int cmd_help(const Invocation &);

namespace {

const char kActionExit[] = R"(0  every process reached the state asked for
1  an operation failed for at least one process (each failure is on stderr, with the process's
   state after it)
2  bad usage)";

const Command kCommands[] = {
	{"check", cmd_check, Operands::Some, "check that this machine can checkpoint and restore CUDA processes",
	 "[PID...]",
	 R"(A preflight in the spirit of `criu check`. Each check prints one line

    ok|warn|fail  NAME  DETAIL

and a `hint:` line below a warn or fail that says how to fix it. The checks:

  driver            the NVIDIA driver library loads; its path, the kernel module's version and the
                    CUDA version; a library of another version than the loaded module fails
  checkpoint-api    the driver has the cuCheckpointProcess* functions (driver r570 or newer)
  gpuN              each GPU: UUID, model, memory (free memory through NVML), PCI bus id
  persistence       every GPU's persistence mode is on (through NVML), so that GPUs stay initialized
                    while every process on them is checkpointed; without NVML, whether
                    nvidia-persistenced runs (/var/run/nvidia-persistenced; nvidia-smi is never run,
                    so a mode set with `nvidia-smi -pm 1` is then not seen)
  nvml              NVML (libnvidia-ml.so.1) loads, so that a restore can check the free memory of
                    the GPUs it uses (without it, only their total memory)
  criu              the CRIU binary (--criu, else the one beside cuda-criu: for PREFIX/bin/cuda-criu
                    PREFIX/lib/cuda-criu/sbin/criu, as in the Debian package, or PREFIX/sbin/criu, as
                    in the GPU bundle; else /usr/local/sbin, /usr/sbin, /usr/bin; one found only
                    through $PATH is named but not run) and its version
  criu-device-hooks CRIU 4.0 or newer: the device hooks the plugin needs
  criu-patch        CRIU carries this project's patch (its symbol criu_resume_devices_late_errors_fatal),
                    which makes a failed GPU restore fail the restore instead of leaving the process
                    running without its GPU state
  plugin            cuda_plugin.so (ours, not CRIU's own plugin of the same name) is where criu loads
                    plugins from: the last `libdir` of /etc/criu/default.conf, $HOME/.criu/default.conf
                    and $CRIU_CONFIG_FILE, else $CRIU_LIBS_DIR, else the plugin beside cuda-criu
                    (the one its commands give criu with -L: PREFIX/plugin for PREFIX/bin/cuda-criu,
                    as in the GPU bundle and the build tree, or where `cmake --install` put it),
                    else /usr/lib/criu; or in --libdir DIR
  runtime-NAME      for each container runtime installed (runc, crun, podman, containerd): whether the
                    CRIU it runs loads our plugin, from which directory and why (runc.conf, crun.conf,
                    the environment the runtime passes), that its criu is 4.0 or newer, and the fix when
                    not; a warning only, as the machine may not use that runtime
  plugin-options    the plugin's options (CUDA_CRIU_* variables, /etc/criu/cuda_plugin.conf) parse
  privileges        root, or CAP_SYS_PTRACE with CAP_CHECKPOINT_RESTORE (or CAP_SYS_ADMIN)
  kernel            checkpoint/restore support (CONFIG_CHECKPOINT_RESTORE: /proc/sys/kernel/ns_last_pid,
                    kcmp(), /proc/self/map_files)
  ptrace            the Yama ptrace policy allows CRIU to attach
  thp               the transparent huge page mode: `always` is ok, `madvise` or `never` a warning
                    (the driver's checkpoint buffer gets huge pages only with `always`, which makes
                    checkpoint and restore faster); the hint sets it until reboot
  pid-N             for each PID given: whether a dump of it gets past what the plugin refuses
                    before it locks anything (a process stopped, or one sharing GPU memory with
                    another process through CUDA IPC: it would be checkpointed into an image the
                    driver cannot restore), so that a process that cannot be checkpointed shows
                    before the dump

On a machine without an NVIDIA GPU (no /proc/driver/nvidia/gpus entry and no CUDA_CRIU_LIBCUDA) the
driver checks warn instead of failing, unless --require-gpu is given.

CUDA_CRIU_CRIU_CONFIG_DIR, when set, is read in place of /etc/criu for CRIU's configuration files
(default.conf, runc.conf, crun.conf): for tests, which must not touch the machine's.)",
	 R"(--json            print one JSON object instead of lines: "result" (ok, warn or fail), "checks"
                  (a list of {"name", "status", "detail", "hint"}), "driver", "gpus", "criu" and
                  "runtimes" (a list of {"name", "binary", "version", "loads_plugin", "plugin_dir",
                  "libdir_source"})
--require-gpu     a missing driver or GPU is a failure even on a machine without NVIDIA GPUs
--criu PATH       check this CRIU binary instead of searching the usual places
--libdir DIR      check the plugin in DIR, the directory given to `criu -L`, instead of the places
                  CRIU and the container runtimes look by default
--libcuda PATH    the driver library to check (default: CUDA_CRIU_LIBCUDA, else libcuda.so.1 through
                  the loader's search path)
--runtimes LIST   the runtimes to report on, comma-separated (runc, crun, podman, containerd), or
                  none (default: every one installed)
--containerd PATH the containerd to report on (runtime-containerd), named by its configuration file
                  or the socket it serves, instead of the installed one: its version, whether its CRI
                  checkpoints for the kubelet and restores from checkpoint images (2.0 and newer, the
                  CRI not disabled), and whether the CRIU under it loads our plugin)",
	 R"(0  no check failed (warnings allowed)
1  at least one check failed
2  bad usage)",
	 R"(cuda-criu check
cuda-criu check --json | python3 -m json.tool
cuda-criu check --criu /opt/criu/sbin/criu --libdir /opt/criu/lib --require-gpu
cuda-criu check --runtimes none $(pgrep -f train.py)
cuda-criu check --runtimes none --containerd /run/containerd/containerd.sock)", nullptr},

	{"inspect", cmd_inspect, Operands::Some, "show what the plugin stored in a CRIU image directory, and verify it",
	 "DIR",
	 R"(Reads cuda-plugin.img, the file cuda_plugin.so adds to CRIU's image directory DIR at the end of a
dump, and prints the image format version, the plugin and NVIDIA driver versions, the host, when it
was written and how long the checkpoint took; every GPU the dumped processes used (ordinal, UUID,
model, memory, PCI bus id); and one line per CUDA process: its pid, its pid inside its own namespace,
the CUDA state the dump found it in, the GPU state the checkpoint added to its memory, the time to
lock it and to checkpoint it, and its GPUs.

Then who holds the GPU state:

  the plugin's GPU image (cuda-gpu*.img)
                    written by the plugin itself (gpu-image=plugin, the default): a restore
                    needs this project's cuda_plugin.so; CRIU's own CUDA plugin, or none,
                    refuses the image
  CRIU's pages images (pages-*.img)
                    gpu-image=criu (CUDA_CRIU_GPU_IMAGE=criu), a CRIU without
                    criu-patches/0004, or a dump to a page server: CRIU's own CUDA plugin can
                    restore it too

and, for a GPU image, its id, its data files (size, bytes written, bytes on disk: zero pages are
holes), and per process the GPU state (its checkpoint ranges), the bytes stored, the share in
all-zero 2 MiB chunks (not stored) and the number of chunks, with totals; the write time and rate.
Every stored chunk carries a CRC-32C.

A directory without cuda-plugin.img is not an error: CRIU's own CUDA plugin writes no such file, nor
does a dump without CUDA processes. A file that is truncated, corrupt, of another kind (wrong
magic), or written by a newer plugin (a newer image format) is an error that says which, as is a GPU
image whose index (cuda-gpu.img) is missing or of another dump.

--verify checks that every file a restore needs is present and whole, one line per check

    ok|FAIL  NAME  DETAIL

  cuda-plugin.img   parses (absent is fine: no CUDA process, or CRIU's own CUDA plugin)
  inventory.img     CRIU's inventory parses, and lists the GPU image only when cuda-plugin.img
                    names one
  cuda-gpu.img      present, of this dump (its id), and covers each process's GPU state
  cuda-gpu-N.img    each data file: present, of this dump (its header), not cut short
  checksums         every chunk of GPU state read back against its CRC-32C (in parallel)
  pagemap-N.img     for each of CRIU's pagemaps, its pages-N.img holds at least the bytes its
                    entries declare (pages of a parent image, or served by lazy migration, are not
                    in it)

and a result line with the bytes read, the time and the rate. A FAIL names the file and what is
wrong: the chunk's address, file and offset for a checksum, the entry and offsets for a pages file
cut short. CRIU keeps no checksum of the processes' ordinary memory: its pages files are checked for
their size only; only the GPU state, when the plugin's GPU image holds it, is checksummed. Run it
after every copy of an image to another host, before the restore.)",
	 R"(--json            print one JSON object: "directory", "cuda_image" (false when there is no
                  cuda-plugin.img), "gpu_state_in" ("gpu_image", "criu_pages", or null without
                  cuda-plugin.img), "gpu_image" (null without one: else "id", "chunk_bytes",
                  "checksum", "write_us", "write_gb_per_s", "files" [{"name", "size",
                  "data_bytes", "present", "disk_bytes"}], "processes" [{"pid", "ns_pid",
                  "state_bytes", "stored_bytes", "zero_bytes", "zero_share", "chunks"}] and
                  "total"), and when there is a cuda-plugin.img "version", "plugin_version",
                  "driver_version", "hostname", "created_unix", "device_phase_us", "gpus" and
                  "processes". With --verify: "directory", "result" (ok or fail),
                  "gpu_state_in", "checks" [{"name", "status", "detail"}], "bytes_read",
                  "seconds", "gb_per_s" and "checksums" (what they cover)
--verify          check that every file the image needs is present and whole (above) instead of
                  describing it)",
	 R"(0  the image was read, or the directory has no cuda-plugin.img; with --verify, every check passed
1  DIR or one of its files cannot be read, or a file is corrupt, foreign or too new; with --verify,
   a file is missing, cut short or damaged
2  bad usage)",
	 R"(cuda-criu inspect /var/lib/checkpoints/job42
cuda-criu inspect --json /var/lib/checkpoints/job42 | jq '.gpu_image.total.zero_share'
rsync -a job42/ gpuhost2:/var/lib/checkpoints/job42/ &&
    ssh gpuhost2 cuda-criu inspect --verify /var/lib/checkpoints/job42)", nullptr},

	{"ps", cmd_ps, Operands::Some, "list the CUDA processes on this machine and their checkpoint state",
	 "",
	 R"(Finds every process that has the NVIDIA driver library (libcuda.so*) mapped by reading /proc, asks
the driver for its CUDA state and its restore thread, and prints

    PID  STATE  RESTORE-TID  COMMAND

STATE is running, locked, checkpointed or failed. A process the driver cannot answer for (it loaded
libcuda but never initialized CUDA, or it belongs to a user whose processes you may not inspect)
shows "-"; --json gives the driver's reason. Processes of other users are visible to root only.)",
	 R"(--json            print {"processes": [{"pid", "state", "restore_tid", "command", "error"}]};
                  "state" and "restore_tid" are null and "error" says why when the driver could
                  not answer)",
	 R"(0  the list was printed (it may be empty)
1  the driver library cannot be loaded
2  bad usage)",
	 R"(cuda-criu ps
cuda-criu ps --json | jq '.processes[] | select(.state == "checkpointed") | .pid')", nullptr},

	{"status", cmd_status, Operands::Some, "print the CUDA checkpoint state of processes",
	 "[PID...]",
	 R"(Prints one line "PID STATE" per process, STATE being running, locked, checkpointed or failed.
Without a PID it lists every CUDA process on the machine, like `cuda-criu ps`.)",
	 R"(--json            print {"processes": [{"pid", "state", "restore_tid", "error"}]})",
	 R"(0  every state was printed
1  the state of at least one process could not be read (not a CUDA process, no such process, or
   no permission)
2  bad usage)",
	 R"(cuda-criu status 4242
cuda-criu status --json 4242 4243)", nullptr},

	{"lock", cmd_action, Operands::Some, "block new CUDA work in processes and wait for the work in flight",
	 "PID...",
	 R"(Locks each process: new CUDA calls block, and work already submitted is waited for. A process must
be running; it is then locked, ready for `checkpoint`, or for `unlock`. All processes are handled at
once. Prints "PID STATE" for each process that made it.)",
	 R"(--timeout SECONDS how long the driver waits for work in flight before it gives up (default: the
                  plugin's lock-timeout option, 10 s unless configured; 0 waits for ever)
--json            print {"processes": [{"pid", "ok", "state", "error"}]})",
	 kActionExit,
	 R"(cuda-criu lock --timeout 30 4242)", nullptr},

	{"checkpoint", cmd_action, Operands::Some, "move the GPU state of locked processes into their host memory",
	 "PID...",
	 R"(Checkpoints each process, which must be locked: the driver copies its device memory into the
process's own memory and releases its GPU resources. The process is then checkpointed: CRIU can dump
it without the GPU, and `restore` brings the state back.)",
	 R"(--timeout SECONDS how long to wait for the driver (default: the plugin's checkpoint-timeout option,
                  600 s unless configured; 0 waits for ever). A driver call cannot be cancelled:
                  when it times out, the process stays in whatever state the driver leaves it
--json            print {"processes": [{"pid", "ok", "state", "error"}]})",
	 kActionExit,
	 R"(cuda-criu lock 4242 && cuda-criu checkpoint 4242)", nullptr},

	{"restore", cmd_action, Operands::Some, "move the GPU state of checkpointed processes back onto GPUs",
	 "PID...",
	 R"(Restores each process, which must be checkpointed: the driver reacquires GPUs and copies the
device memory back. The process stays locked; `unlock` lets it run. With --device-map a process
checkpointed on one GPU is restored onto another.)",
	 R"(--timeout SECONDS how long to wait for the driver (default: the plugin's restore-timeout option,
                  600 s unless configured; 0 waits for ever)
--device-map OLD=NEW,...
                  restore what ran on GPU OLD onto GPU NEW. GPUs are given by UUID (GPU-..., as
                  `nvidia-smi -L` and `cuda-criu check` print them) or by index (this machine's
                  CUDA device ordinal). The driver wants every GPU of the machine paired, also
                  GPUs hidden from the process by CUDA_VISIBLE_DEVICES: the GPUs the map leaves
                  out are paired as the plugin pairs them (themselves when free, else a GPU of the
                  same model), so on two GPUs 0=1 is restored as 0=1,1=0
--json            print {"processes": [{"pid", "ok", "state", "error"}]})",
	 kActionExit,
	 R"(cuda-criu restore 4242 && cuda-criu unlock 4242
cuda-criu restore --device-map GPU-5f1b2c3d-0000-4000-8000-000000000001=GPU-77aa0e12-0000-4000-8000-000000000002 4242
cuda-criu restore --device-map 0=1,1=0 4242)", nullptr},

	{"unlock", cmd_action, Operands::Some, "let CUDA work proceed again in locked processes",
	 "PID...",
	 R"(Unlocks each process, which must be locked: blocked CUDA calls go on and the process is running.)",
	 R"(--timeout SECONDS how long to wait for the driver (default: the plugin's restore-timeout option)
--json            print {"processes": [{"pid", "ok", "state", "error"}]})",
	 kActionExit,
	 R"(cuda-criu unlock 4242)", nullptr},

	{"suspend", cmd_action, Operands::Some, "lock and checkpoint processes: free their GPUs, keep their state",
	 "PID...",
	 R"(Brings each process to checkpointed from wherever it is: a running process is locked and
checkpointed, a locked one checkpointed, a checkpointed one left alone. Its GPU memory is then free
for others until `resume`.)",
	 R"(--timeout SECONDS the lock timeout (default: the plugin's lock-timeout option); the checkpoint
                  step waits up to the plugin's checkpoint-timeout option
--json            print {"processes": [{"pid", "ok", "state", "error"}]})",
	 kActionExit,
	 R"(cuda-criu suspend 4242; sleep 60; cuda-criu resume 4242)", nullptr},

	{"resume", cmd_action, Operands::Some, "bring processes back to running from any state",
	 "PID...",
	 R"(Brings each process back to running: a checkpointed process is restored and unlocked, a locked one
unlocked, a running one left alone. This is also the way out for a process an interrupted dump left
locked or checkpointed. Where another caller acts on a process at the same time (the dump's guard
bringing it back too), it is taken again from its state then, for up to 10 s.)",
	 R"(--timeout SECONDS how long to wait for the driver (default: the plugin's restore-timeout option)
--device-map OLD=NEW,...
                  as for `restore`: restore onto other GPUs (UUIDs or indices)
--json            print {"processes": [{"pid", "ok", "state", "error"}]})",
	 kActionExit,
	 R"(cuda-criu resume 4242 4243)", nullptr},

	{"compat", cmd_compat, Operands::Raw, "accept the command line of NVIDIA's cuda-checkpoint utility",
	 "OPTIONS\ncuda-checkpoint OPTIONS   (this program invoked through a link named cuda-checkpoint)",
	 R"(Runs the same driver calls as the commands above behind the command line of NVIDIA's
cuda-checkpoint utility, and prints what it prints, so that scripts written for it work unchanged,
and so does CRIU's own CUDA plugin, which runs `cuda-checkpoint` from $PATH. The build puts a
cuda-checkpoint link to cuda-criu next to it (bin/cuda-checkpoint); put its directory first in the
PATH that CRIU sees.

  --action lock|checkpoint|restore|unlock --pid PID [--timeout MS] [--device-map OLD=NEW,...]
  --toggle --pid PID [--timeout MS] [--device-map OLD=NEW,...]
  --get-state --pid PID
  --get-restore-tid --pid PID
  -h, --help      print the usage (which mentions --action: CRIU's plugin looks for it)

Nothing is printed on success but by --get-state and --get-restore-tid; a failure prints a message
on stderr.)",
	 R"(--action ACTION   lock, checkpoint, restore or unlock: do one step of the state machine
--toggle          running: lock and checkpoint; checkpointed: restore and unlock
--get-state       print running, locked, checkpointed or failed, and a newline
--get-restore-tid print the id of the process's restore thread and a newline
-p, --pid PID     the process
--timeout MS      milliseconds, as cuda-checkpoint takes them: the lock timeout for lock and toggle,
                  the wait for the driver otherwise
--device-map OLD=NEW,...
                  GPU pairs (UUIDs or indices) for restore and toggle)",
	 R"(0  success
1  the operation failed
2  bad usage)",
	 R"(cuda-criu compat --get-state --pid 4242
ln -s /usr/local/bin/cuda-criu /usr/local/bin/cuda-checkpoint
PATH=/opt/cuda-criu/bin:$PATH criu dump -t 4242 -D img -L /usr/lib/criu-intree)", nullptr},

	{"selftest", cmd_selftest, Operands::None, "checkpoint and restore a built-in CUDA workload through CRIU and check its data",
	 "",
	 R"(The quick way to see that the whole stack works on this machine: driver, GPU, CRIU and the plugin.
It starts a small workload (this program again, using only the CUDA driver API through
dlopen("libcuda.so.1"): no compiler, no CUDA toolkit) in its own session with its output in a file.
The workload fills N MiB of GPU memory with a known pattern, then forever reads it back, checks
every byte, rewrites a part, and records its progress in a state file. The selftest then

  start    waits until the workload has filled and checked its memory
  dump     runs `criu dump -L LIBDIR` on it and checks that the plugin recorded it in the image
  exit     waits until CRIU has ended the process
  restore  runs `criu restore -d -L LIBDIR`
  verify   checks that the process is running again on the GPU, that its data is intact and that it
           goes on making progress

and prints each step's result and time. Needs root (CRIU does). The work directory (images and logs)
is removed on success and kept when a step after setup fails; an interrupted run removes it.)",
	 R"(--criu PATH       the CRIU binary (default: the one beside cuda-criu, for
                  PREFIX/bin/cuda-criu PREFIX/lib/cuda-criu/sbin/criu (the Debian package's) or
                  PREFIX/sbin/criu; else /usr/local/sbin/criu, /usr/sbin/criu or /usr/bin/criu)
--libdir DIR      the plugin directory given to CRIU with -L (default: the one beside cuda-criu,
                  PREFIX/plugin or where `cmake --install` put the plugin, when it holds
                  cuda_plugin.so; else /usr/lib/criu); it must hold this project's cuda_plugin.so
--mb N            MiB of GPU memory the workload uses (default 256)
--libcuda PATH    the driver library for the workload, this program and the plugin (default: the
                  workload uses libcuda.so.1 from the loader's search path; the others their usual
                  setting, see ENVIRONMENT in `cuda-criu help`)
--dir DIR         where to create the work directory (default /tmp)
--keep            keep the work directory even on success)",
	 R"(0  the round trip worked and the data came back intact
1  a step failed (the step, the reason and the log to read are printed)
2  bad usage)",
	 R"(cuda-criu selftest
cuda-criu selftest --mb 1024 --criu /opt/criu/sbin/criu --libdir /opt/criu/lib)", nullptr},

	{"roundtrip", cmd_roundtrip, Operands::Program, "check that your own program survives a checkpoint and restore (for CI)",
	 "-- CMD [ARGS...]",
	 R"(For CI: one command that checks that a program, a GPU program above all, survives a checkpoint and
a restore. It starts CMD in its own session (no terminal; stdin /dev/null, stdout and stderr into a
log file in the work directory), waits until it is ready, and then, --repeat times:

  dump     `criu dump -L LIBDIR` of the whole process tree into a fresh image directory; the image's
           size and the GPU state the plugin saved are reported
  exit     waits until every process of the tree is gone (CRIU ends what it dumps)
  restore  `criu restore -d -L LIBDIR` (CUDA_CRIU_DEVICE_MAP set from --device-map)
  health   the program is alive and healthy again: the health command passes, or else the readiness
           criterion holds again (the ready file is modified, a new output line matches, the port
           accepts, or the program lives through the delay); then it must live on for --settle

With --leave-running, the dump leaves the program running (`criu dump -R`), and `exit` is replaced by

  running  the program, left running, is still healthy after the dump
  kill     it is killed, so that `restore` brings it back from the image and `health` checks that

Readiness (one of them, or a --health-cmd alone): --ready-file appears (or, when it exists already,
is modified), a line of the output matches --ready-log, 127.0.0.1:--ready-port accepts a connection,
or the program lives --ready-delay seconds. A health command is run through /bin/sh -c with
ROUNDTRIP_PID (the root process), ROUNDTRIP_CYCLE, ROUNDTRIP_PHASE (start, running or restore),
ROUNDTRIP_LOG (the program's output) and ROUNDTRIP_DIR (the work directory) in its environment; exit 0
means healthy, anything else is retried until --health-timeout. It is also run once before the first
dump: a command that never passes fails the start, not the restore.

Each step prints a line `CYCLE STEP ok|FAIL TIME DETAIL`. A failure prints what failed, a hint where one
is known, and the lines that explain it: CRIU's errors and the plugin's lines from CRIU's log, CRIU's
own output, the program's last output, the health command's output. Every process started (the
program, whatever it forked, the restored tree, CRIU, the health command) is killed at the end, also on
SIGINT, SIGTERM or SIGHUP, and the work directory is removed unless --keep-images. Needs root.)",
	 R"(--ready-file PATH the program is ready when PATH appears (or is modified, when it exists already)
--ready-log REGEX ready when a line of its output matches the POSIX extended regular expression
--ready-port PORT ready when 127.0.0.1:PORT accepts connections (the dump then gets
                  --skip-in-flight: the probe's connections must not stop it)
--ready-delay SECONDS
                  ready when it has lived that long
--health-cmd CMD  healthy when `/bin/sh -c CMD` exits 0 (default: the readiness criterion again)
--settle SECONDS  once healthy, the program must live on that long (default 1; 0: no wait)
--repeat N        N dump/restore cycles of the same program (default 1)
--leave-running   dump with criu -R; check the running program, then kill it and restore it
--require-cuda    a dump in which the plugin found no CUDA process is a failure
--device-map OLD=NEW,...
                  restore with CUDA_CRIU_DEVICE_MAP set: onto other GPUs
--criu PATH       the CRIU binary (default: the one beside cuda-criu, for
                  PREFIX/bin/cuda-criu PREFIX/lib/cuda-criu/sbin/criu (the Debian package's) or
                  PREFIX/sbin/criu; else /usr/local/sbin/criu, /usr/sbin/criu or /usr/bin/criu)
--libdir DIR      the directory of cuda_plugin.so, given to CRIU with -L (default: the one beside
                  cuda-criu, PREFIX/plugin or where `cmake --install` put the plugin, when it holds
                  cuda_plugin.so; else /usr/lib/criu)
--criu-env NAME=VALUE
                  set in CRIU's environment only (repeatable), e.g. LD_LIBRARY_PATH=DIR for a CRIU
                  whose libraries are not installed
--criu-arg ARG    one more argument for criu dump and criu restore (repeatable), e.g.
                  --tcp-established or --ext-unix-sk
--dir DIR         the work directory (new, or empty and writable by you alone; default: a new one in
                  $TMPDIR or /tmp). Large GPU images need room: point it at a disk, not a tmpfs
--keep-images     keep the work directory: images-N/ (each cycle's images and CRIU logs),
                  program.log, criu-*.out
--start-timeout SECONDS    to get ready (default 120)
--dump-timeout SECONDS     for criu dump, and then for the processes to end (default 600)
--restore-timeout SECONDS  for criu restore (default 600)
--health-timeout SECONDS   to be healthy again (default 60)
--json FILE       write the report as JSON: "result", "exit_status", "steps" (cycle, step, result,
                  seconds, detail, hint, image_bytes, gpu_state_bytes, cuda_processes, log), "failure"
--junit FILE      write the report as JUnit XML: one testsuite, one testcase per step and cycle
--name NAME       the name in the reports (default: the program's name))",
	 R"(0  every cycle passed
1  a dump, a restore or a health check failed: the program did not survive (the step, the reason
   and the log lines that explain it are printed)
2  bad usage
3  the round trip could not be tried: not root (one line, no report), setup failed (no CRIU, no
   plugin), or the program did not get ready, so nothing was checkpointed; or it passed but a report
   could not be written
A signal (SIGINT, SIGTERM, SIGHUP) ends it, after the cleanup, with that signal (130, 143, 129).)",
	 R"(cuda-criu roundtrip --ready-file /tmp/state -- ./my_cuda_app --state /tmp/state
cuda-criu roundtrip --repeat 3 --junit rt.xml --ready-log 'model loaded' -- python3 serve.py
cuda-criu roundtrip --ready-port 8000 --health-cmd 'curl -sf localhost:8000/health' -- ./server
cuda-criu roundtrip --criu /opt/criu/sbin/criu --criu-env LD_LIBRARY_PATH=/opt/criu/lib \
    --libdir /opt/criu/plugin --ready-delay 30 -- python3 train.py)", nullptr},

	{"migrate", cmd_migrate, Operands::Some, "move a process tree to another host: page server, dump, copy, restore",
	 "--to DIR [--target CMD] PID",
	 R"(Moves the process tree of PID (GPU state and all) to another host, as migration tools drive CRIU:

  1. `criu page-server -D DIR -d` on the target, listening on --address:--port
  2. `criu dump -t PID --page-server` here: the pages (the GPU state among them) stream to the target
     while the dump runs; the rest of the image goes into a work directory here
  3. that rest is copied into DIR on the target (tar here, piped into tar there)
  4. `criu restore -D DIR -d` on the target

Every command for the target runs through the prefix --target (split at spaces), e.g. "ssh gpu2" or
"nsenter -t 4242 -m -p"; without it the target is this host. The target needs the same CRIU (at
--target-criu, default the path used here) and cuda_plugin.so in --libdir, and the same GPU model
(or CUDA_CRIU_DEVICE_MAP through --criu-env). With --via copy, the whole image is dumped here first and
then copied (the baseline for the downtime the page server saves).

It prints each step with its time and the downtime: from the dump's start (the processes stop) to the
restore's end (they run on the target). A failed dump leaves the processes running here, as they were;
a failed copy or restore says where the image is and how to restore it by hand. Needs root.)",
	 R"(--to DIR          the image directory on the target (absolute; made if missing)
--target CMD      the command prefix that runs a command on the target (default: this host)
--address ADDR    the page server's address, as this host reaches the target (default 127.0.0.1)
--port PORT       the page server's port (default 27027)
--via MODE        page-server (default) or copy
--criu PATH       the CRIU binary here (default: the one beside cuda-criu, for
                  PREFIX/bin/cuda-criu PREFIX/lib/cuda-criu/sbin/criu (the Debian package's) or
                  PREFIX/sbin/criu; else /usr/local/sbin/criu, /usr/sbin/criu or /usr/bin/criu)
--target-criu PATH
                  the CRIU binary on the target (default: the one used here)
--libdir DIR      the directory of cuda_plugin.so on both hosts, given to CRIU with -L (default: the
                  one beside cuda-criu here, as for roundtrip; else /usr/lib/criu)
--criu-env NAME=VALUE
                  set in CRIU's environment on both hosts (repeatable)
--criu-arg ARG    one more argument for criu dump and criu restore (repeatable), e.g.
                  --tcp-established or --shell-job
--dir DIR         the work directory here (default: a new one in $TMPDIR or /tmp)
--keep            keep the work directory
--timeout SECONDS for the dump, the copy and the restore each (default 600))",
	 R"(0  the processes run on the target
1  the dump, the copy or the restore failed (what failed, and where the processes and the image
   are, is printed)
2  bad usage
3  nothing was tried: not root, no CRIU or plugin, the target's directory or page server failed)",
	 R"(cuda-criu migrate --target 'ssh gpu2' --address 10.0.0.2 --to /var/lib/ckpt/job 4242
cuda-criu migrate --to /srv/images --criu-arg --tcp-established 4242)", nullptr},

	{"help", cmd_help, Operands::Some, "print the manual of cuda-criu or of one of its commands",
	 "[COMMAND]",
	 R"(Prints the overview, or the page of COMMAND. `cuda-criu COMMAND --help` does the same.)",
	 nullptr,
	 R"(0  the help was printed
2  no such command)",
	 R"(cuda-criu help restore)", "--commands"},
	// The workload selftest runs under CRIU: internal, no page.
	{kSelftestWorkloadCommand, cmd_selftest_workload, Operands::None, nullptr, nullptr, nullptr, nullptr, nullptr,
	 nullptr, "--mb N\n--state FILE\n--libcuda PATH\n--interval-ms MS"},
};

// A line of an OPTIONS text that begins an option: "[-a, ]--name [VALUE]" (a VALUE starts before the
// help's column, 18), or nullopt.
std::optional<OptionSpec> option_line(const std::string &line)
{
	if (line.empty() || line[0] != '-')
		return std::nullopt;
	OptionSpec o;
	size_t at = 0;
	auto word = [&] {
		size_t b = line.find_first_not_of(' ', at), e = line.find(' ', b);
		at = e == std::string::npos ? line.size() : e;
		return b == std::string::npos ? std::string() : line.substr(b, at - b);
	};
	o.name = word();
	if (o.name.back() == ',') {
		o.alias = o.name.substr(0, o.name.size() - 1);
		o.name = word();
	}
	if (size_t b = line.find_first_not_of(' ', at); b != std::string::npos && b < 18)
		o.value = word();
	o.repeatable = line.find("(repeatable)") != std::string::npos;
	return o;
}

void add_options(std::vector<OptionSpec> &out, const char *text, bool shown)
{
	std::string line;
	for (const char *p = text; p && *p; p++) {
		if (*p != '\n')
			line += *p;
		if (*p == '\n' || !p[1]) {
			if (auto o = option_line(line)) {
				o->shown = shown;
				out.push_back(std::move(*o));
			}
			line.clear();
		}
	}
}

} // namespace

std::span<const Command> commands() { return kCommands; }

const Command *find_command(const std::string &name)
{
	auto it = std::find_if(std::begin(kCommands), std::end(kCommands), [&](const Command &c) { return name == c.name; });
	return it == std::end(kCommands) ? nullptr : it;
}

const std::vector<OptionSpec> &options_of(const Command &c)
{
	static std::map<const Command *, std::vector<OptionSpec>> cache;
	auto [it, added] = cache.try_emplace(&c);
	if (added) {
		add_options(it->second, c.options, true);
		add_options(it->second, c.hidden_options, false);
	}
	return it->second;
}

int run_command(const Command &c, const std::vector<std::string> &args)
{
	if (c.operands == Operands::Raw) {
		Invocation raw{c, {}};
		raw.args.positionals = args;
		return c.run(raw);
	}
	auto parsed = parse_args(args, options_of(c), c.operands == Operands::Program);
	if (!parsed)
		return usage_error(c.name, parsed.error().message());
	if (parsed->has("--help")) {
		print_help(c.name);
		return kExitOk;
	}
	if (c.operands == Operands::None && !parsed->positionals.empty())
		return usage_error(c.name, "takes no arguments, got '" + parsed->positionals[0] + "'");
	return c.run(Invocation{c, std::move(*parsed)});
}

} // namespace cuda_criu::cli
