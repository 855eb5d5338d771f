"""Processes the lab started, named by PID and kernel start time: a recycled PID is never signalled."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of a process from /proc/PID/stat, or None when there is no such process.

    The start time, with the PID, names one process: a recycled PID is never taken for it.
    """
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text.rpartition(")")[2].split()
    return fields[0], int(fields[19])


@dataclass(frozen=True)
class Pid:
    """A process the lab started: its PID and the kernel's start time for it (/proc/PID/stat)."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> Pid:
        stat = proc_stat(pid)
        return cls(pid, stat[1] if stat else -1)

    def alive(self) -> bool:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, os.WNOHANG)  # reap it if it is our own dead child
        stat = proc_stat(self.pid)
        return stat is not None and stat[1] == self.start and stat[0] != "Z"


def stop(pids: Sequence[Pid], timeout: float) -> None:
    """SIGTERM the live ones, wait up to `timeout`, then SIGKILL whatever is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = [p for p in pids if p.alive()]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, sig)
        deadline = time.monotonic() + timeout
        while any(p.alive() for p in live) and time.monotonic() < deadline:
            time.sleep(0.05)


def end(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
    """Signal a child of ours, SIGKILL it if it outlives `timeout`, reap it; its exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
