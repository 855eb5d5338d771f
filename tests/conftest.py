"""Fixtures shared by every test module: real etcd members (etcd_fixtures.py) and a daemon using one; the
`soft_roce` marker's rule."""

import subprocess
from functools import cache
from pathlib import Path

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


@cache
def soft_roce_loadable() -> bool:
    """The running kernel has rdma_rxe, loaded or as a module it can load (not this project's host kernel,
    which has no RDMA support; Debian's stock kernel in shiftlab.rxe's VM has it)."""
    if Path("/sys/module/rdma_rxe").exists():
        return True
    try:
        probe = subprocess.run(["modprobe", "--dry-run", "--quiet", "rdma_rxe"], capture_output=True)
    except FileNotFoundError:  # no kmod: a kernel without modules (this project's host has none)
        return False
    return probe.returncode == 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked `soft_roce` is left out (deselected, not skipped) where the kernel has no rdma_rxe:
    `make test-rxe` runs it in a VM whose kernel has."""
    if soft_roce_loadable():
        return
    left_out = [item for item in items if item.get_closest_marker("soft_roce")]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker("soft_roce")]
