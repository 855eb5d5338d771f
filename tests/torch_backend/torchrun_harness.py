"""torchrun with script.py, its JSON lines collected as they come (the tests act on some mid-run)."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

SCRIPT = str(Path(__file__).with_name("script.py"))
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))  # this venv's, whatever PATH says
QUIET = {"OMP_NUM_THREADS": "1"}  # one thread per rank on a shared 2-core machine; torchrun warns otherwise


class TorchRun:
    """One torchrun (one node of the job) started with `argv` (ending in script.py's arguments)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], name: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            list(argv),
            env={**env, **QUIET},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[dict] = []
        self._new: queue.Queue[dict | None] = queue.Queue()
        self._stderr: list[str] = []
        self._pumps = [
            threading.Thread(target=self._pump_stdout, daemon=True),
            threading.Thread(target=self._pump_stderr, daemon=True),
        ]
        for pump in self._pumps:
            pump.start()

    def _pump_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                fields = json.loads(line)
                self.lines.append(fields)
                self._new.put(fields)
        self._new.put(None)

    def _pump_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    def stderr(self) -> str:
        return "".join(self._stderr)[-12000:]

    def wait_for(self, key: str, timeout: float) -> dict:
        """The next line that has `key` (earlier lines without it are kept in `lines` only)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                fields = self._new.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"{self.name}: no {key!r} within {timeout:g} s; stderr:\n{self.stderr()}"
                ) from None
            if fields is None:
                raise AssertionError(f"{self.name}: ended before {key!r}; stderr:\n{self.stderr()}")
            if key in fields:
                return fields

    def finish(self, timeout: float) -> list[dict]:
        """Every JSON line, once torchrun has exited 0 (else an AssertionError with its stderr)."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(
                f"{self.name}: still running after {timeout:g} s; stderr:\n{self.stderr()}"
            ) from None
        for pump in self._pumps:  # the last lines may still be on their way
            pump.join(timeout=10)
        assert code == 0, f"{self.name}: exit code {code}; stderr:\n{self.stderr()}"
        return self.lines

    def stop(self) -> None:
        """SIGTERM: torchrun passes it on to its workers and waits for them."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def finish_all(runs: Sequence[TorchRun], timeout: float) -> list[dict]:
    """Every run's JSON lines once all have exited 0; else one AssertionError with what each failed run
    said, and the stderr of the others too (a rank that ends another's job logs on its own node)."""
    lines, failures = [], []
    for run in runs:
        try:
            lines.extend(run.finish(timeout))
        except AssertionError as failure:
            failures.append(str(failure))
    if failures:
        failed = {failure.split(":", 1)[0] for failure in failures}
        others = [f"{run.name} (exit 0); stderr:\n{run.stderr()}" for run in runs if run.name not in failed]
        raise AssertionError("\n\n".join([*failures, *others]))
    return lines


def by_rank(lines: Sequence[dict], key: str) -> dict[int, object]:
    """{rank: value of `key`} over the lines that carry it."""
    return {line["rank"]: line[key] for line in lines if key in line}
