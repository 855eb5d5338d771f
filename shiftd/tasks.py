"""Ending asyncio tasks for sure, as shiftd's stop must; and keeping the long-running ones running.

A task can outlive one cancel. Python 3.11's `asyncio.wait_for` drops a cancellation that arrives in the
loop turn its awaited call ends (bpo-42130, fixed in 3.12): the call's result or error comes out instead.
A retry loop around such a call (an etcd watch whose calls fail at once while etcd is unreachable) then
goes on, and a stop that awaited it hung until systemd's SIGKILL, its lease never revoked. So a task still
running a moment after its cancel is cancelled again.

A watch that raises (a monitor meeting a sysfs file it did not expect) would otherwise end in silence, and
shiftd would go on answering with the last states it saw: `supervised` logs what it raised and runs it again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

log = logging.getLogger(__name__)
RECANCEL_SECONDS = 0.1
RESTART_SECONDS = 1.0  # between a watch's failure and its next run: a watch that fails at once does not spin


async def cancel_and_wait(tasks: Iterable[asyncio.Future]) -> None:
    """Cancel `tasks` and return once every one has ended; what they raised is dropped."""
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_SECONDS)
    for task in tasks:  # retrieved, so that asyncio does not log them as never retrieved
        if not task.cancelled():
            task.exception()


async def supervised(name: str, run: Callable[[], Awaitable[None]], pause: float = RESTART_SECONDS) -> None:
    """Run `run()` until it returns (a watch that is off: no udev) or is cancelled; each time it raises,
    log it and run it again after `pause`."""
    while True:
        try:
            return await run()
        except Exception:
            log.exception("%s failed; running it again in %gs", name, pause)
        await asyncio.sleep(pause)
