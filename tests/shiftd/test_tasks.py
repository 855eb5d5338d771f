"""cancel_and_wait (shiftd/tasks.py): shiftd's stop ends its tasks even when one survives a cancel."""

from __future__ import annotations

import asyncio
import logging

import pytest

from shiftd.tasks import cancel_and_wait

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
