"""The core's own threads run at once when woken (priority.c): real time where allowed, else a short slice."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from libshift.core._core import Context, prefer_latency

SHORT_SLICE_NS = 100_000


def in_thread(fn):
    """fn() on a new thread, its result (a thread's scheduling is its own: the test's stays as it was)."""
    result = []
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    thread.join()
    return result[0]


def sched_field(path: Path, name: str) -> int:
    for line in path.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return int(value.split()[0])
    raise AssertionError(f"{path} has no {name}")


def own_sched(name: str) -> int:
    return sched_field(Path("/proc/thread-self/sched"), name)


@pytest.mark.skipif(os.geteuid() != 0, reason="real time needs root (CAP_SYS_NICE)")
def test_a_thread_asking_gets_real_time() -> None:
    got, policy = in_thread(lambda: (prefer_latency(), os.sched_getscheduler(0)))
    assert (got, policy) == ("realtime", os.SCHED_FIFO)


def test_without_real_time_it_gets_the_least_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHIFT_REALTIME", "0")
    got, policy, slice_ns = in_thread(
        lambda: (prefer_latency(), os.sched_getscheduler(0), own_sched("se.slice"))
    )
    assert (got, policy, slice_ns) == ("short slice", os.SCHED_OTHER, SHORT_SLICE_NS)


def thread_name(task: Path) -> str:
    """The task's name, or "" once it has ended (a thread of an earlier test may end while we look)."""
    try:
        return (task / "comm").read_text().strip()
    except FileNotFoundError:
        return ""


def progress_threads() -> list[Path]:
    tasks = Path("/proc/self/task")
    return [t for t in tasks.iterdir() if thread_name(t) == "shift-progress"]


@pytest.mark.skipif(os.geteuid() != 0, reason="real time needs root (CAP_SYS_NICE)")
def test_a_contexts_progress_thread_runs_in_real_time() -> None:
    before = set(progress_threads())
    ctx = Context()
    try:
        deadline = time.monotonic() + 5
        while not (new := set(progress_threads()) - before) and time.monotonic() < deadline:
            time.sleep(0.01)  # the thread names itself once it has its priority
        assert len(new) == 1
        (task,) = new
        assert sched_field(task / "sched", "policy") == os.SCHED_FIFO
    finally:
        ctx.close()
