"""The udev monitor: kernel uevents for veths created and deleted in a namespace of the test's own.

This machine runs no udev daemon, so what can be tested for real is the kernel-uevent fallback
and the message that says so.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import resource
from pathlib import Path

import pytest
from nsutil import NetnsLoop, ip, netns, open_sockets

from shiftd.monitors.udev import UdevMonitor
from shiftd.nic import DeviceChange

NO_UDEV = "no udev daemon"


def test_description_says_which_source(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    control = tmp_path / "control"
    caplog.set_level(logging.INFO, logger="shiftd.monitors.udev")
    assert UdevMonitor(lambda change: None, control).description == "kernel uevents (no udev daemon)"
    control.touch()
    assert UdevMonitor(lambda change: None, control).description == "udev"
    assert [r.getMessage() for r in caplog.records if NO_UDEV in r.getMessage()] == [
        f"no udev daemon ({control} is missing): watching kernel uevents instead"
    ]


async def _start(monitor: UdevMonitor) -> asyncio.Task[None]:
    task = asyncio.create_task(monitor.run())
    await asyncio.sleep(0.05)  # let it subscribe before the test makes devices
    return task


async def _cancel(task: asyncio.Task[None]) -> bool:
    """Cancel and wait, keeping the task (and whatever its traceback holds) alive, as a daemon's
    TaskGroup would; True when it ended by the cancellation."""
    task.cancel()
    await asyncio.wait([task])
    return task.cancelled()


@pytest.mark.lab
def test_kernel_uevents_for_veth_add_and_remove(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="shiftd.monitors.udev")
    changes: queue.Queue[DeviceChange] = queue.Queue()
    with netns("mn") as ns, NetnsLoop(ns) as loop:
        sockets = open_sockets()
        monitor = UdevMonitor(changes.put, tmp_path / "no-udev-control")
        task = loop.call(_start(monitor))
        ip("-n", ns, "link", "add", "mnu0", "type", "veth", "peer", "name", "mnu1")
        ip("-n", ns, "link", "del", "mnu0")
        seen = set()
        while len(seen) < 4:
            seen.add(changes.get(timeout=5))
        assert seen == {
            DeviceChange(action, "net", name) for action in ("add", "remove") for name in ("mnu0", "mnu1")
        }
        assert task.done() is False
        assert monitor.description == "kernel uevents (no udev daemon)"
        assert loop.call(_cancel(task)), "the monitor did not end by cancellation"
        assert open_sockets() == sockets, "the monitor left its uevent socket open"
    assert sum(NO_UDEV in r.getMessage() for r in caplog.records) == 1


def test_off_when_no_monitor_can_be_opened(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    monitor = UdevMonitor(lambda change: None, tmp_path / "no-udev-control")
    asyncio.run(_run_without_free_fds(monitor))
    assert monitor.description.startswith("off: cannot open a kernel monitor: ")
    assert "Too many open files" in monitor.description
    assert f"device add/remove is not watched: {monitor.description}" in caplog.text


async def _run_without_free_fds(monitor: UdevMonitor) -> None:
    """Run the monitor while the process may open no new file (a real EMFILE, not a mock)."""
    lowest_free = os.dup(0)
    os.close(lowest_free)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    try:
        await asyncio.wait_for(monitor.run(), 5)  # returns at once: nothing to watch with
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
