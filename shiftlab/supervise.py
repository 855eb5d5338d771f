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

With --listen PATH it is also what `shiftd.socket` is: it binds and listens on the Unix socket PATH once
and passes it to every child it starts (fd 3, LISTEN_FDS and LISTEN_PID, as systemd's socket activation
does), so that a client's connect waits in the socket's backlog while the daemon restarts instead of
failing. SIGUSR1 is `systemctl restart`: SIGTERM to the child, and a new one as soon as it has exited.

    python -m shiftlab.supervise --state FILE [--restart-sec S] [--listen PATH] -- COMMAND [ARG...]
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
LISTEN_FD = 3  # where socket activation puts the first socket (SD_LISTEN_FDS_START)


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


def _pass_socket(fd: int) -> None:
    """In the child, before exec: the held socket as fd 3, and the variables that say so to it alone."""
    if fd == LISTEN_FD:
        os.set_inheritable(fd, True)
    else:
        os.dup2(fd, LISTEN_FD)  # inheritable, as dup2 makes it
    # the child's own environment (the exec takes it), with its own PID, which only the child knows
    os.environ.update(LISTEN_FDS="1", LISTEN_PID=str(os.getpid()), LISTEN_FDNAMES="shiftd.socket")


def bind_listener(path: Path) -> socket.socket:
    """A Unix stream socket listening on `path` (a stale one replaced), 0600 until the daemon sets its
    mode and group: nobody else connects before it says who may."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(umask)
    sock.listen(socket.SOMAXCONN)
    return sock


class Supervisor:
    """Runs `argv` until told to stop; restarts it after abnormal exits."""

    def __init__(
        self,
        argv: Sequence[str],
        state_path: Path,
        restart_sec: float = 0.5,
        restart_max: float = 8.0,
        stop_timeout: float = 4.0,
        listen: Path | None = None,
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
        self.restarting = False  # SIGUSR1: the child was told to stop, and a new one follows its exit
        self.listen = listen
        self._listener = bind_listener(listen) if listen is not None else None
        self._listen_ino = os.stat(listen).st_ino if listen is not None else 0  # the path we bound
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
        signal.signal(signal.SIGUSR1, self._on_restart)
        selector = selectors.DefaultSelector()
        selector.register(wake_r, selectors.EVENT_READ)
        selector.register(self._notify, selectors.EVENT_READ)
        self._start()
        try:
            while True:
                selector.select(self._timeout())
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
                self._read_notifications()
                result = self._step()
                if result is not None:
                    return result
        finally:
            self._unlisten()

    def _unlisten(self) -> None:
        """Close the held socket and remove its path, unless another process has bound it since."""
        if self._listener is None or self.listen is None:
            return
        with contextlib.suppress(OSError):
            if os.stat(self.listen).st_ino == self._listen_ino:
                self.listen.unlink()
        self._listener.close()

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
        if self.restarting:  # `systemctl restart`: whatever the exit, a new process now
            self.restarting, self.kill_at, self.restart_at = False, None, now
            return None
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
        parent, notify = os.getpid(), self._notify_name
        held = self._listener.fileno() if self._listener is not None else None

        def prepare() -> None:  # in the child; preexec_fn is safe here: the supervisor is single-threaded
            _die_with_parent(parent)
            os.environ["NOTIFY_SOCKET"] = notify  # env=None below: the exec takes the child's environ
            if held is not None:
                _pass_socket(held)

        self.child = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            preexec_fn=prepare,
            close_fds=held is None,  # else fd 3 would be closed after prepare(); the rest is not inheritable
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

    def _on_restart(self, _signum: int, _frame: object) -> None:
        if self.stopping or self.child is None or self.child.poll() is not None:
            return
        self.restarting = True
        self.child.send_signal(signal.SIGTERM)
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
    parser.add_argument(
        "--listen", type=Path, help="hold a Unix socket on this path for the child (socket activation)"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to supervise after --")
    supervisor = Supervisor(
        command, args.state, args.restart_sec, args.restart_max, args.stop_timeout, args.listen
    )
    try:
        return supervisor.run()
    except OSError as exc:  # e.g. the command cannot be executed
        print(f"supervise: {command[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
