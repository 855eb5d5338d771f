"""A program on a lab host that speaks JSON lines: what the lab tests and benchmarks drive their peers with.

The program runs inside a host's namespace (`Lab.exec_command`), takes orders as JSON lines on stdin and
answers in JSON lines on stdout, which a thread moves into a queue so a read can time out. Its stderr
goes to a file, never a pipe: a chatty program (SHIFT_TEST_LOG=INFO) would block on a full pipe nobody
reads until it fails. The tail of that file is what a failure message shows.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from shiftlab.lab import Lab

STDERR_TAIL = 6000  # characters of stderr a failure message shows
_ENDED = ""  # what the pump queues at the end of stdout: a real line always has its "\n"


class LabProcessError(RuntimeError):
    """The program did not say what was awaited: it ended, timed out, or printed something not JSON.

    A RuntimeError, not an AssertionError: it is the program under test failing, not a check of the
    caller's; pytest reports it as a failure all the same, and a benchmark turns it into its exit message.
    """


class LabProcess:
    """`argv` on lab host `host`, spoken to in JSON lines; `end()` it (the error paths end it themselves)."""

    def __init__(
        self,
        lab: Lab,
        host: str,
        argv: Sequence[str],
        *,
        stderr_file: Path | None = None,
        timeout: float = 60.0,
    ) -> None:
        """`stderr_file` keeps the program's stderr after the run (default: an anonymous file);
        `timeout` is how long a `read` waits unless told otherwise."""
        command, env = lab.exec_command(host, argv)
        self.host = host
        self.timeout = timeout
        self._log: IO[str] = (
            open(stderr_file, "w+")  # noqa: SIM115  (closed by end())
            if stderr_file
            else tempfile.TemporaryFile("w+")  # noqa: SIM115
        )
        self._tail = ""
        self._proc = subprocess.Popen(
            command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True
        )
        self._lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._ended = False
        threading.Thread(target=self._pump, name=f"labproc-{host}", daemon=True).start()

    @property
    def pid(self) -> int:
        """The program's PID: `ip netns exec` execs it, so the PID is the program's own."""
        return self._proc.pid

    def _pump(self) -> None:
        assert self._proc.stdout is not None
        with self._proc.stdout:
            for line in self._proc.stdout:
                self._lines.put(line)
        self._lines.put(_ENDED)

    def read(self, key: str, timeout: float | None = None) -> dict[str, Any]:
        """The next line that has `key`, skipping the others (state changes, progress).

        LabProcessError, with the tail of stderr, if none comes within `timeout` or the program ends
        first; either way the program is ended, so the message is complete.
        """
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not self._ended:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.end(grace=0)
                raise LabProcessError(self._failure(f"no {key!r} within {timeout:g}s")) from None
            if line == _ENDED:
                self._ended = True
                break
            try:
                fields = json.loads(line)
            except json.JSONDecodeError:
                self.end(grace=0)
                raise LabProcessError(self._failure(f"not a JSON line: {line.strip()[:200]!r}")) from None
            if key in fields:
                return fields
        code = self.end(grace=5)
        raise LabProcessError(self._failure(f"ended (exit {code}) before saying {key!r}"))

    def send(self, **fields: object) -> None:
        """One line of orders; to a program that has already ended it goes nowhere, and the next read
        says why it ended."""
        assert self._proc.stdin is not None
        if self._proc.stdin.closed:  # end() has been
            return
        with contextlib.suppress(BrokenPipeError):
            self._proc.stdin.write(json.dumps(fields) + "\n")
            self._proc.stdin.flush()

    def ask(self, key: str, timeout: float | None = None, **fields: object) -> dict[str, Any]:
        """send(**fields), then read(key)."""
        self.send(**fields)
        return self.read(key, timeout)

    def stderr(self) -> str:
        """The tail of what the program wrote to stderr so far (all of it once ended)."""
        if self._log.closed:
            return self._tail
        self._log.flush()
        self._log.seek(0)
        return self._log.read()[-STDERR_TAIL:]

    def end(self, grace: float = 15.0) -> int:
        """Close its stdin, give it `grace` seconds to exit, kill it if it has not; its exit status.

        Idempotent; end(grace=0) is "kill it now" for cleanup paths.
        """
        if not self._log.closed:
            if self._proc.stdin:
                with contextlib.suppress(BrokenPipeError):
                    self._proc.stdin.close()
            try:
                self._proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._tail = self.stderr()
            self._log.close()
        return self._proc.returncode

    def _failure(self, what: str) -> str:
        return f"{self.host}: {what}; stderr:\n{self.stderr()}"
