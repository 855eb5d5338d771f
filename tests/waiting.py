"""Polling helpers for tests that wait on another process (a daemon, etcd, the kernel)."""

import asyncio
import time


def wait_until(predicate, timeout=10.0, interval=0.02):
    """The first truthy value of predicate() within `timeout` s, else its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


async def until(predicate, timeout=5.0, interval=0.05):
    """wait_until for a test on an event loop: whether predicate() came true within `timeout` s, sleeping
    on the loop between looks (the loop's tasks, a watch, run meanwhile)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval)
    return True
