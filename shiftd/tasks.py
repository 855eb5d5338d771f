"""Ending asyncio tasks for sure, as shiftd's stop must.

A task can outlive one cancel. Python 3.11's `asyncio.wait_for` drops a cancellation that arrives in the
loop turn its awaited call ends (bpo-42130, fixed in 3.12): the call's result or error comes out instead.
A retry loop around such a call (an etcd watch whose calls fail at once while etcd is unreachable) then
goes on, and a stop that awaited it hung until systemd's SIGKILL, its lease never revoked. So a task still
running a moment after its cancel is cancelled again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

RECANCEL_SECONDS = 0.1


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
