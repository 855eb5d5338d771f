"""One VM run: a temporary work share, QEMU booting the stock kernel, the console watched for progress and
deadlines, the command's output relayed as the guest writes it, its exit code read back; and always the
QEMU process ended (by its PID) and the work share removed.
"""

from __future__ import annotations

import collections
import compileall
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from shiftlab.rxe import host
from shiftlab.rxe.guest import JOB, MARK, OUTPUT, STATUS
from shiftlab.rxe.host import Kernel, Log, RxeError

CODE_ROOT = Path(__file__).resolve().parents[2]  # the tree shiftlab is imported from, seen as is in the guest
CODE_FOLDERS = ("libshift", "shiftd", "shiftlab", "tests", "bench", "examples")
INIT = Path(__file__).resolve().with_name("init.sh")
KVM_BOOT_DEADLINE = 60.0  # s: a KVM that does not reach init by then is taken as not working (TCG instead)
CONSOLE_LINES = 15  # kept for the error of a failed boot
# QEMU gets SIGKILL when this process dies, however it dies (no orphaned VM). setpriv sets it before the
# exec, so no Python runs between fork and exec: a preexec_fn did, in a child of a process with gRPC's
# threads, and the child sometimes died there (its console: gRPC's poller, "Bad file descriptor")
DIE_WITH_PARENT = ["setpriv", "--pdeathsig", "KILL", "--"]
GUEST_OWN = ("/tmp", "/run", "/dev/shm")  # tmpfs in the guest (init.sh)


@dataclass
class Job:
    argv: list[str]
    cwd: str = field(default_factory=os.getcwd)
    env: dict[str, str] = field(default_factory=dict)  # on top of the host's environment
    setup: bool = True  # the rxe devices
    check: bool = True  # perftest between rxe0 and rxe1 before the command
    timeout: float = 3600.0  # s for the whole run, boot included
    boot_timeout: float = 300.0  # s until the guest's init runs
    accel: str = "auto"  # auto, kvm, tcg
    memory: str = "4G"
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    install: bool = True  # apt-get what is missing


class BootTimeout(RxeError):
    pass


def stderr_log(text: str) -> None:
    print(f"shiftlab.rxe: {text}", file=sys.stderr, flush=True)


def run(job: Job, out: BinaryIO | None = None, log: Log = stderr_log) -> int:
    """Run job.argv in the VM; its output goes to `out` (stdout), progress to `log`; returns its exit
    code. Raises RxeError when the VM could not run it."""
    kernel = host.ensure_packages(job.install, log)
    _compile(CODE_ROOT, Path(job.cwd))
    qemu = host.qemu()
    accels = ["kvm", "tcg"] if job.accel == "auto" and host.kvm_candidate() else [job.accel]
    if accels == ["auto"]:
        accels = ["tcg"]
    for accel in accels:
        try:
            return _boot(job, kernel, qemu, accel, out or sys.stdout.buffer, log)
        except BootTimeout:
            if accel != accels[-1]:
                log("KVM did not reach init: trying TCG")
                continue
            raise
    raise AssertionError("unreachable")


def _compile(*trees: Path) -> None:
    """Byte-code for every module of the trees' code folders, written here: the guest sees them read-only,
    so each of its Python processes (pytest, every peer, shiftd, shiftctl) would compile again each module
    that lacks it, ten times slower under TCG than here. (The venv's packages were compiled by pip.)"""
    folders = {tree / name for tree in trees for name in CODE_FOLDERS}
    for folder in sorted(f for f in folders if f.is_dir()):
        compileall.compile_dir(folder, quiet=1, workers=0)


def kept_paths(job: Job) -> list[str]:
    """The host's folders under the guest's own /tmp, /run and /dev/shm (tmpfs there, init.sh) that the job
    needs: its cwd, the code tree, the Python (a checkout and its venv under /tmp, as a CI clone may be).
    init.sh mounts them again over the guest's tmpfs, read-only like the rest of the host's tree."""
    needed = {job.cwd: Path(job.cwd), str(CODE_ROOT): CODE_ROOT, sys.executable: Path(sys.executable).parent}
    if os.path.isabs(job.argv[0]):
        needed[job.argv[0]] = Path(job.argv[0]).parent
    hidden = set()
    for shown, folder in needed.items():
        own = next((own for own in GUEST_OWN if folder.is_relative_to(own)), None)
        if own is None:
            continue
        if str(folder) == own or ":" in str(folder) or any(c.isspace() for c in str(folder)):
            raise RxeError(
                f"{shown}: the guest has its own {own}; use a folder of its own, without ':' or spaces"
            )
        hidden.add(folder)
    outermost = [p for p in hidden if not any(p != q and p.is_relative_to(q) for q in hidden)]
    return sorted(str(p) for p in outermost)


def _boot(job: Job, kernel: Kernel, qemu: str, accel: str, out: BinaryIO, log: Log) -> int:
    work = Path(tempfile.mkdtemp(prefix="shift-rxe-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        host.make_initramfs(kernel, work / "initrd.img")
        env = {k: v for k, v in os.environ.items() if k != "TMPDIR"}  # the guest's /tmp is its own
        env["PYTHONUNBUFFERED"] = "1"  # output.log is relayed as it grows: a buffered pytest would be silent
        (work / JOB).write_text(
            json.dumps(
                {
                    "argv": job.argv,
                    "cwd": job.cwd,
                    "env": env | job.env,
                    "setup": job.setup,
                    "check": job.check,
                }
            )
        )
        argv = qemu_argv(qemu, kernel, work, accel, job.memory, job.cpus, kept_paths(job))
        started = time.monotonic()
        log(f"booting {kernel.version} under {accel.upper()} ({job.cpus} CPUs, {job.memory})")
        proc = subprocess.Popen(
            DIE_WITH_PARENT + argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        console = Console(proc, log, started)
        boot_deadline = KVM_BOOT_DEADLINE if accel == "kvm" and job.accel == "auto" else job.boot_timeout
        with Relay(work / OUTPUT, out):
            while proc.poll() is None:
                elapsed = time.monotonic() - started
                if not console.booted.is_set() and elapsed > boot_deadline:
                    raise BootTimeout(
                        f"boot timeout: no init after {elapsed:.0f} s; console: {console.tail()}"
                    )
                if elapsed > job.timeout:
                    raise RxeError(f"timed out after {elapsed:.0f} s; console: {console.tail()}")
                time.sleep(0.2)
        console.join()
        log(f"powered off after {time.monotonic() - started:.1f} s wall")
        return _result(work, console)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def qemu_argv(
    qemu: str, kernel: Kernel, work: Path, accel: str, memory: str, cpus: int, keep: Sequence[str] = ()
) -> list[str]:
    """The host's / read-only as the guest's root (9p tag /dev/root, as virtme's initramfs expects), the
    work share read-write (tag work), the console on stdout; no reboot, so that a panic ends QEMU."""
    for path in (work, CODE_ROOT, Path(sys.executable)):
        if any(c.isspace() for c in str(path)):
            raise RxeError(f"{path}: a path with white space cannot go on the kernel's command line")
    share = "security_model=none,multidevs=remap"
    accel_arg = "tcg,thread=multi" if accel == "tcg" else accel
    cmdline = (
        f"console=ttyS0 quiet loglevel=1 panic=-1 init={INIT} shiftlab.work={work} "
        f"shiftlab.python={sys.executable} shiftlab.code={CODE_ROOT}"
    )
    if keep:
        cmdline += f" shiftlab.keep={':'.join(keep)}"
    return [
        qemu, "-accel", accel_arg, "-machine", "q35", "-cpu", "max", "-smp", str(cpus), "-m", memory,
        "-nodefaults", "-no-reboot", "-display", "none", "-serial", "stdio",
        "-fsdev", f"local,id=root,path=/,readonly=on,{share}",
        "-device", "virtio-9p-pci,fsdev=root,mount_tag=/dev/root",
        "-fsdev", f"local,id=work,path={work},{share}",
        "-device", "virtio-9p-pci,fsdev=work,mount_tag=work",
        "-kernel", str(kernel.image), "-initrd", str(work / "initrd.img"), "-append", cmdline,
    ]  # fmt: skip


def _result(work: Path, console: Console) -> int:
    try:
        status = json.loads((work / STATUS).read_text())
    except (OSError, ValueError):
        raise RxeError(f"the guest ended without a result; console: {console.tail()}") from None
    if "error" in status:
        raise RxeError(f"in the guest: {status['error']}")
    return int(status["rc"])


class Console(threading.Thread):
    """Reads the serial console: the guest's MARK lines become progress lines, the last lines are kept."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Log, started: float) -> None:
        super().__init__(name="console", daemon=True)
        self._proc, self._log, self._t0 = proc, log, started
        self._lines: collections.deque[str] = collections.deque(maxlen=CONSOLE_LINES)
        self.booted = threading.Event()
        self.start()

    def run(self) -> None:
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            if not line:
                continue
            self._lines.append(line)
            if MARK in line:
                self.booted.set()
                text = line.split(MARK, 1)[1]
                self._log(f"{text}, {time.monotonic() - self._t0:.1f} s wall")

    def tail(self) -> str:
        return " | ".join(self._lines) or "(empty)"


class Relay:
    """Copies a file the guest appends to (through the work share) to `out` as it grows."""

    def __init__(self, path: Path, out: BinaryIO, period: float = 0.2) -> None:
        self._path, self._out, self._period = path, out, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)

    def __enter__(self) -> Relay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        offset = 0
        while True:
            stopping = self._stop.wait(self._period)
            offset += self._copy(offset)
            if stopping:
                return

    def _copy(self, offset: int) -> int:
        try:
            with self._path.open("rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return 0
        if data:
            self._out.write(data)
            self._out.flush()
        return len(data)
