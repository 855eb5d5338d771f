"""Polling helper for tests that wait on another process (a daemon, etcd, the kernel)."""

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
