"""A supervisor for the lab's daemons: what systemd's `Type=notify`, `Restart=on-failure` is on a host.

The lab has no systemd as PID 1, yet the daemon's fault tolerance is only real if a crashed shiftd
comes back on its own. This runs one command as its child, hands it a NOTIFY_SOCKET (the daemon
says READY=1 there, as to systemd), and after an abnormal exit (a non-zero status, or death by a
signal other than SIGTERM, SIGINT, SIGHUP or SIGPIPE) starts it again after a backoff. A clean exit
ends supervision, as systemd's `Restart=on-failure` does. A first start that fails before
READY is a broken service, not a crash: the supervisor then exits with the child's status, so
whoever started it sees the failure. SIGTERM (or SIGINT) is passed on to the child, SIGKILL
follows after --stop-timeout, and the child dies with the supervisor (PR_SET_PDEATHSIG), as a
service's cgroup would. The child's PID, restarts and last exit go to --state (JSON), rewritten
atomically, for `shift-lab status` and the tests.

    python -m shiftlab.supervise --state FILE [--restart-sec S] -- COMMAND [ARG...]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shiftlab.pids import proc_stat

PR_SET_PDEATHSIG = 1
CLEAN_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE}
STABLE_SECONDS = 10.0  # a child up this long after READY resets the backoff


def describe(status: int) -> str:
    """An exit status of subprocess (negative: killed by that signal) in words."""
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:  # a real-time signal has no name
            return f"killed by signal {-status}"
    return f"exited with status {status}"


def is_clean(status: int) -> bool:
    """Whether systemd's Restart=on-failure would leave this exit alone."""
    return status == 0 or (status < 0 and -status in CLEAN_SIGNALS)


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: SIGKILL when the supervisor dies, even if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(127)
    if os.getppid() != parent:
        os._exit(127)


class Supervisor:
    """Runs `argv` until told to stop; restarts it after abnormal exits."""

    def __init__(
        self,
        argv: Sequence[str],
        state_path: Path,
        restart_sec: float = 0.5,
        restart_max: float = 8.0,
        stop_timeout: float = 4.0,
    ) -> None:
        self.argv = list(argv)
        self.state_path = state_path
        self.restart_sec = restart_sec
        self.restart_max = restart_max
        self.stop_timeout = stop_timeout
        self.child: subprocess.Popen[bytes] | None = None
        self.ready_at: float | None = None
        self.ever_ready = False
        self.restarts = 0
        self.failures = 0  # abnormal exits in a row, for the backoff
        self.last_exit = ""
        self.stopping = False
        self.kill_at: float | None = None
        self.restart_at: float | None = None
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        # abstract: nothing to clean up; random: no other process guesses it and claims READY
        self._notify_name = f"@shift-supervise-{os.getpid()}-{secrets.token_hex(6)}"
        self._notify.bind("\0" + self._notify_name[1:])
        self._notify.setblocking(False)

    def run(self) -> int:
        """Supervise until a stop or a clean exit; returns the exit status for the supervisor."""
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the selector
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_stop)
        selector = selectors.DefaultSelector()
        selector.register(wake_r, selectors.EVENT_READ)
        selector.register(self._notify, selectors.EVENT_READ)
        self._start()
        while True:
            selector.select(self._timeout())
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 512)
            self._read_notifications()
            result = self._step()
            if result is not None:
                return result

    def _timeout(self) -> float | None:
        deadlines = [t for t in (self.kill_at, self.restart_at) if t is not None]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _step(self) -> int | None:
        """Act on what changed: a child's exit, a due restart, an overdue stop. An int ends the run."""
        now = time.monotonic()
        if self.child is not None and self.child.poll() is not None:
            result = self._exited(self.child.returncode, now)
            if result is not None:
                return result
        if self.child is None and self.stopping:
            return 0
        if self.restart_at is not None and now >= self.restart_at:
            self.restart_at = None
            self.restarts += 1
            self._start()
        if self.kill_at is not None and now >= self.kill_at and self.child is not None:
            self._log(f"pid {self.child.pid} still running {self.stop_timeout:g}s after SIGTERM; SIGKILL")
            self.child.kill()
            self.kill_at = None
        return None

    def _exited(self, status: int, now: float) -> int | None:
        assert self.child is not None
        pid, self.child = self.child.pid, None
        self.last_exit = describe(status)
        self._log(f"{self.argv[0]} (pid {pid}) {self.last_exit}")
        stable = self.ready_at is not None and now - self.ready_at >= STABLE_SECONDS
        self.ready_at = None
        self._save()
        if self.stopping:
            return 0
        if not self.ever_ready:
            return status if status > 0 else 128 - status  # a service that never started
        if is_clean(status):
            self._log("clean exit: not restarted (Restart=on-failure)")
            return 0
        self.failures = 0 if stable else self.failures + 1
        delay = min(self.restart_max, self.restart_sec * 2 ** max(0, self.failures - 1))
        self._log(f"restarting in {delay:g}s")
        self.restart_at = now + delay
        return None

    def _start(self) -> None:
        env = {**os.environ, "NOTIFY_SOCKET": self._notify_name}
        parent = os.getpid()
        self.child = subprocess.Popen(  # preexec_fn is safe here: the supervisor is single-threaded
            self.argv, env=env, stdin=subprocess.DEVNULL, preexec_fn=lambda: _die_with_parent(parent)
        )
        self._save()

    def _read_notifications(self) -> None:
        while True:
            try:
                data = self._notify.recv(4096)
            except BlockingIOError:
                return
            if b"READY=1" in data.split(b"\n") and self.child is not None and self.ready_at is None:
                self.ready_at = time.monotonic()
                self.ever_ready = True
                self._save()

    def _on_stop(self, signum: int, _frame: object) -> None:
        self.stopping = True
        self.restart_at = None
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)
            self.kill_at = time.monotonic() + self.stop_timeout

    def _save(self) -> None:
        child = self.child
        state: dict[str, Any] = {
            "supervisor": os.getpid(),
            "pid": child.pid if child else None,
            "start": stat[1] if child and (stat := proc_stat(child.pid)) else None,
            "ready": self.ready_at is not None,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
        }
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        tmp.write_text(json.dumps(state) + "\n")
        os.replace(tmp, self.state_path)

    def _log(self, text: str) -> None:
        print(f"supervise[{os.getpid()}]: {text}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shiftlab.supervise",
        description="Run COMMAND as systemd would with Type=notify and Restart=on-failure: restart it after "
        "an abnormal exit, with a doubling backoff; pass SIGTERM on; the child dies with the supervisor.",
    )
    parser.add_argument("--state", type=Path, required=True, help="JSON file: the child's PID, restarts")
    parser.add_argument("--restart-sec", type=float, default=0.5, help="first restart delay (default 0.5)")
    parser.add_argument("--restart-max", type=float, default=8.0, help="longest restart delay (default 8)")
    parser.add_argument(
        "--stop-timeout", type=float, default=4.0, help="SIGKILL the child this long after SIGTERM"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to supervise after --")
    supervisor = Supervisor(command, args.state, args.restart_sec, args.restart_max, args.stop_timeout)
    try:
        return supervisor.run()
    except OSError as exc:  # e.g. the command cannot be executed
        print(f"supervise: {command[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
