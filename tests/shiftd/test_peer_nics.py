"""shiftd's following of peer hosts' NIC records (shiftd/peer_nics.py), against a real etcd: what its agents
hear of a peer's NIC going down and coming back, and what they do not (our own NICs, a record deleted)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from waiting import until

from libshift.api.shift.v1 import common_pb2
from shiftd.agents import encode
from shiftd.peer_nics import PeerNics
from shiftd.registry import Registry
from shiftlab.etcdproc import EtcdProcess

pytestmark = pytest.mark.timeout(60)
UP, DOWN = common_pb2.NIC_STATE_UP, common_pb2.NIC_STATE_DOWN


def registry(member: EtcdProcess, host: str) -> Registry:
    endpoint = [(member.client_host, member.client_port)]
    return Registry(endpoint, host, lease_ttl=3, timeout=1.0, retry_initial=0.05, retry_max=0.5)


def nic(device: str, state: int, reason: str = "", gid: str = "") -> str:
    return encode(common_pb2.Nic(device=device, netdev=f"{device}-nd", state=state, reason=reason, gid=gid))


@contextlib.asynccontextmanager
async def following(
    peer: Registry, mine: Registry
) -> AsyncIterator[tuple[PeerNics, list[common_pb2.NicEvent]]]:
    """h1's PeerNics running on `mine` for the block, and what it told; both registries stopped after."""
    told: list[common_pb2.NicEvent] = []
    follower = PeerNics(mine, "h1", told.append)
    task = asyncio.create_task(follower.run())
    try:
        yield follower, told
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await mine.stop()
        await peer.stop()


def test_a_peers_nic_going_down_and_back_is_told_with_its_host_and_gid(etcd: EtcdProcess) -> None:
    async def scenario() -> None:
        peer, mine = registry(etcd, "h0"), registry(etcd, "h1")
        await peer.start()
        await mine.start()
        peer.put("nics/h0/mlx5_0", nic("mlx5_0", UP, gid="::ffff:198.18.0.1"))
        peer.put("nics/h0/mlx5_1", nic("mlx5_1", DOWN, "operator_fail", "::ffff:198.18.1.1"))
        mine.put("nics/h1/mlx5_0", nic("mlx5_0", DOWN, "carrier_lost"))  # our own: not a peer's
        assert await peer.wait_synced(5) and await mine.wait_synced(5)
        async with following(peer, mine) as (follower, told):
            # what was down when the watch began: told, and in the snapshot a new agent stream gets
            assert await until(lambda: len(told) == 1)
            assert (told[0].host, told[0].device, told[0].gid) == ("h0", "mlx5_1", "::ffff:198.18.1.1")
            assert (told[0].state, told[0].reason) == (DOWN, "operator_fail")
            assert [(e.host, e.device) for e in follower.down()] == [("h0", "mlx5_1")]
            peer.put("nics/h0/mlx5_0", nic("mlx5_0", DOWN, "carrier_lost", "::ffff:198.18.0.1"))
            assert await until(lambda: len(told) == 2)
            assert (told[1].device, told[1].state, told[1].previous_state) == ("mlx5_0", DOWN, UP)
            peer.put("nics/h0/mlx5_0", nic("mlx5_0", DOWN, "carrier_lost", "::ffff:198.18.0.1"))  # no change
            peer.put("nics/h0/mlx5_1", nic("mlx5_1", UP, "recovered", "::ffff:198.18.1.1"))
            assert await until(lambda: len(told) == 3)
            assert (told[2].device, told[2].state, told[2].previous_state) == ("mlx5_1", UP, DOWN)
            assert [e.device for e in follower.down()] == ["mlx5_0"]
            # the peer's shiftd stops (its lease revoked, its records deleted): forgotten, not a failure
            await peer.stop(revoke=True)
            assert await until(lambda: not follower.records)
            assert follower.down() == [] and len(told) == 3
            assert all(e.host == "h0" for e in told)  # never our own NICs

    asyncio.run(scenario())


def test_an_unreadable_record_is_skipped(etcd: EtcdProcess) -> None:
    async def scenario() -> None:
        peer, mine = registry(etcd, "h0"), registry(etcd, "h1")
        await peer.start()
        await mine.start()
        async with following(peer, mine) as (follower, told):
            peer.put("nics/h0/mlx5_0", "{not json")
            peer.put("nics/h0/mlx5_1", nic("mlx5_1", DOWN, "operator_fail"))
            assert await until(lambda: len(told) == 1)
            assert told[0].device == "mlx5_1" and set(follower.records) == {("h0", "mlx5_1")}

    asyncio.run(scenario())


def test_a_peers_nic_given_another_gid_is_told_with_the_gid_it_had(etcd: EtcdProcess) -> None:
    """A NIC re-addressed while down (a repair), then back up: the GID change is told on its own, state
    unchanged, so that QPs reconnect to the new GID; the return is told as usual, with no GID change."""

    async def scenario() -> None:
        peer, mine = registry(etcd, "h0"), registry(etcd, "h1")
        await peer.start()
        await mine.start()
        old, new = "::ffff:198.18.0.1", "::ffff:198.18.0.99"
        peer.put("nics/h0/mlx5_0", nic("mlx5_0", DOWN, "carrier_lost", old))
        assert await peer.wait_synced(5)
        async with following(peer, mine) as (_, told):
            assert await until(lambda: len(told) == 1)
            assert (told[0].gid, told[0].previous_gid) == (old, "")
            peer.put("nics/h0/mlx5_0", nic("mlx5_0", DOWN, "carrier_lost", ""))  # the old address deleted
            peer.put("nics/h0/mlx5_0", nic("mlx5_0", DOWN, "carrier_lost", new))  # ... and the new one added
            assert await until(lambda: len(told) == 2)
            assert (told[1].state, told[1].previous_state) == (DOWN, DOWN)
            assert (told[1].gid, told[1].previous_gid) == (new, old)
            peer.put("nics/h0/mlx5_0", nic("mlx5_0", UP, "recovered", new))
            assert await until(lambda: len(told) == 3)
            assert (told[2].state, told[2].gid, told[2].previous_gid) == (UP, new, "")
            await asyncio.sleep(0.2)
            assert len(told) == 3

    asyncio.run(scenario())
