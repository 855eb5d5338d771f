"""The runner behind every collective: in call order, futures for DDP, and a ring failure breaks the group."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch

from libshift.torch.work import SerialRunner


@pytest.fixture
def runner():
    runner = SerialRunner("test-runner")
    yield runner
    runner.close()


def test_calls_run_in_order_and_return_at_once(runner):
    gate = threading.Event()
    order: list[int] = []
    first = runner.submit("all_reduce", "first", lambda: (gate.wait(10), order.append(1)))
    second = runner.submit("broadcast", "second", lambda: order.append(2))
    assert not first.is_completed() and not second.is_completed()  # the caller goes on meanwhile
    gate.set()
    assert second.wait() and first.is_completed()
    assert order == [1, 2]
    assert first.get_future().wait() == "first"
    assert second.get_future().wait() == "second"


def test_a_small_call_runs_on_the_callers_thread_only_when_nothing_is_pending(runner):
    threads: list[str] = []
    here = threading.current_thread().name

    def note() -> None:
        threads.append(threading.current_thread().name)

    first = runner.submit("barrier", None, note, inline=True)
    assert first.is_completed() and threads == [here]  # done before submit returned
    gate = threading.Event()
    runner.submit("all_reduce", None, lambda: gate.wait(10))  # a large one, running on the runner
    behind = runner.submit("barrier", None, note, inline=True)
    assert not behind.is_completed()  # queued behind it, in call order, not run beside it
    gate.set()
    assert behind.wait() and threads == [here, "test-runner"]


def test_a_mistake_fails_only_its_call(runner):
    def mistake() -> None:
        raise ValueError("root must be a rank in [0, 2), got 7")

    bad = runner.submit("broadcast", None, mistake)
    with pytest.raises(ValueError, match=r"^broadcast: root must be a rank in \[0, 2\), got 7$"):
        bad.wait()
    assert runner.submit("barrier", None, lambda: None).wait()


def test_a_ring_failure_breaks_the_group(runner):
    def lost() -> None:
        raise ConnectionError("peer 1 is gone")

    with pytest.raises(ConnectionError, match="peer 1 is gone"):
        runner.submit("all_reduce", None, lost).wait()
    ran = []
    later = runner.submit("barrier", None, lambda: ran.append(True))
    with pytest.raises(
        RuntimeError, match=r"barrier: the group is broken since all_reduce failed \(peer 1 is gone\)"
    ):
        later.wait()
    with pytest.raises(RuntimeError, match="broken"):
        later.get_future().wait()
    assert ran == []


def test_wait_with_a_timeout_names_the_call(runner):
    gate = threading.Event()
    work = runner.submit("all_gather", None, lambda: gate.wait(10))
    with pytest.raises(RuntimeError, match=r"^shift backend: all_gather did not complete within 0.05 s$"):
        work.wait(timedelta(seconds=0.05))
    gate.set()
    assert work.wait(timedelta(0))  # torch's "no timeout"


def test_future_callbacks_see_the_tensors(runner):
    """DDP's reducer chains .then() on the future and reads the tensors from it."""
    tensor = torch.ones(3)
    work = runner.submit("all_reduce", [tensor], lambda: tensor.mul_(2))
    doubled = work.get_future().then(lambda fut: fut.value()[0] + 1)
    assert torch.equal(doubled.wait(), torch.full((3,), 3.0))
