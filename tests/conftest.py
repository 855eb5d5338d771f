"""Fixtures shared by every test module: real etcd members (etcd_fixtures.py) and a daemon using one."""

import os

import pytest
from daemon_harness import DaemonProcess
from etcd_fixtures import etcd, etcd_cluster, etcd_member

__all__ = ["etcd", "etcd_cluster", "etcd_daemon", "etcd_member"]

TIMING_SKIP = pytest.mark.skip(
    reason="marked `timing`: fails now and then on a quiet machine, cause not yet found (issue 4); "
    "run with SHIFT_RUN_TIMING=1 or make test-timing"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Quarantine, said out loud: `timing` tests are reported as skipped with the reason, never as passed."""
    if os.environ.get("SHIFT_RUN_TIMING") == "1":
        return
    for item in items:
        if item.get_closest_marker("timing"):
            item.add_marker(TIMING_SKIP)


@pytest.fixture
def etcd_daemon(tmp_path, etcd):
    """A real shiftd with one tcp device on `lo` (never failed) and a real etcd, lease 3 s."""
    daemon = DaemonProcess(
        tmp_path / "d",
        sections={
            "devices": {"mlx5_0": "lo"},
            "etcd": {"endpoints": [etcd.endpoint], "lease_ttl_seconds": 3},
        },
    )
    daemon.start()
    yield daemon
    daemon.stop()
