"""shiftd/tasks.py: shiftd's stop ends its tasks even when one survives a cancel (cancel_and_wait), and a
watch that fails is logged and run again (supervised)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from shiftd.tasks import cancel_and_wait, supervised

pytestmark = pytest.mark.timeout(10)


class RetryLoop:
    """A retry loop whose call lost the first `cancels` cancellations, as Python 3.11's wait_for does when
    the call ends in the same loop turn (the etcd watch's loop, etcd unreachable)."""

    def __init__(self, cancels: int) -> None:
        self.cancels, self.swallowed = cancels, 0

    async def run(self) -> None:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if self.swallowed >= self.cancels:
                    raise
                self.swallowed += 1
                asyncio.current_task().uncancel()


@pytest.mark.parametrize("cancels", [0, 1, 3])
def test_a_task_that_survives_its_cancels_is_ended(cancels: int) -> None:
    async def main() -> int:
        loop = RetryLoop(cancels)
        task = asyncio.create_task(loop.run())
        await asyncio.sleep(0.05)
        await cancel_and_wait([task])
        assert task.cancelled()
        return loop.swallowed

    assert asyncio.run(main()) == cancels


def test_a_failed_task_is_ended_and_its_error_not_left_unretrieved(caplog: pytest.LogCaptureFixture) -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    async def main() -> None:
        task = asyncio.create_task(fails())
        await asyncio.sleep(0)
        await cancel_and_wait([task, asyncio.create_task(asyncio.sleep(60))])
        assert isinstance(task.exception(), RuntimeError)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(main())
    assert "never retrieved" not in caplog.text


def test_the_callers_own_cancel_still_reaches_it() -> None:
    async def main() -> None:
        stubborn = RetryLoop(cancels=10**6)
        task = asyncio.create_task(stubborn.run())
        stopping = asyncio.create_task(cancel_and_wait([task]))
        await asyncio.sleep(0.3)
        stopping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopping
        assert not task.done() and stubborn.swallowed >= 2  # it was cancelled again, and again
        stubborn.cancels = 0
        await cancel_and_wait([task])

    asyncio.run(main())


def test_a_supervised_watch_that_fails_is_logged_and_run_again(caplog: pytest.LogCaptureFixture) -> None:
    runs: list[int] = []

    async def watch() -> None:
        runs.append(len(runs))
        if len(runs) <= 2:
            raise OSError("a sysfs file it did not expect")
        await asyncio.sleep(60)

    async def main() -> None:
        task = asyncio.create_task(supervised("monitor rdma_sysfs", watch, pause=0.01))
        while len(runs) < 3:
            await asyncio.sleep(0.01)
        await cancel_and_wait([task])
        assert task.cancelled()  # its own cancel still ends it

    with caplog.at_level(logging.ERROR, logger="shiftd.tasks"):
        asyncio.run(main())
    assert runs == [0, 1, 2]
    failed = "monitor rdma_sysfs failed; running it again in 0.01s"
    assert [r.getMessage() for r in caplog.records] == [failed] * 2
    assert all(r.exc_info for r in caplog.records)


def test_a_supervised_watch_that_returns_is_not_run_again() -> None:
    runs: list[int] = []

    async def off() -> None:  # udev's, with no monitor to open
        runs.append(1)

    asyncio.run(supervised("monitor udev", off, pause=0.01))
    assert runs == [1]
