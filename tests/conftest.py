"""Fixtures shared by every test module: real etcd members (etcd_fixtures.py) and a daemon using one."""

import pytest
from daemon_harness import DaemonProcess
from etcd_fixtures import etcd, etcd_cluster, etcd_member

__all__ = ["etcd", "etcd_cluster", "etcd_daemon", "etcd_member"]


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
