"""Real etcd members for tests (one member, or a three-member cluster), ended by PID at teardown.

Import the fixtures into a test module: `from etcd_fixtures import etcd, etcd_cluster, etcd_member`;
`out_of_reach` cuts a registry off from a member while etcd moves on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shiftlab.etcdproc import EtcdProcess, free_port


@pytest.fixture
def etcd_member(tmp_path: Path) -> Iterator[EtcdProcess]:
    """A member that is not started yet (for "etcd down at start" cases)."""
    member = EtcdProcess(data_dir=tmp_path / "etcd", log_path=tmp_path / "etcd.log")
    try:
        yield member
    finally:
        member.kill()


@pytest.fixture
def etcd(etcd_member: EtcdProcess) -> EtcdProcess:
    """A running single-member etcd on loopback."""
    etcd_member.start()
    return etcd_member


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[list[EtcdProcess]]:
    """Three running members of one cluster; started together since none is ready without quorum."""
    members = [
        EtcdProcess(data_dir=tmp_path / f"etcd{i}", name=f"rg{i}", log_path=tmp_path / f"etcd{i}.log")
        for i in range(3)
    ]
    initial = ",".join(f"{m.name}={m.peer_url}" for m in members)
    for member in members:
        member.initial_cluster = initial
    try:
        with ThreadPoolExecutor(len(members)) as pool:
            list(pool.map(lambda m: m.start(wait=30), members))
        yield members
    finally:
        for member in members:
            member.kill()


@contextlib.asynccontextmanager
async def out_of_reach(member: EtcdProcess) -> AsyncIterator[None]:
    """The member on its own data, but on a port the registry does not know, for the block's length.

    What happens inside the block (writes, compactions) happens while the registry is cut off.
    """
    home = member.client_port
    member.kill()
    member.client_port = free_port()
    await asyncio.to_thread(member.start)
    yield
    member.kill()
    member.client_port = home
    await asyncio.to_thread(member.start)
