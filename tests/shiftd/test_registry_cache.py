"""The registry's lookups from its peer cache (shiftd/registry_cache.py), against real etcd members.

What a lookup answers must stay what etcd holds: after updates and deletes, a host's lease lapsing, a
compaction while the cache was cut off, and a member dying in the middle of a burst of writes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.request
from typing import Any

import pytest
from etcd_fixtures import out_of_reach
from waiting import until

from shiftd.registry import Registry
from shiftlab.etcdproc import EtcdProcess

pytestmark = pytest.mark.timeout(60)
PREFIX = "/shift/v1/"


def registry(members: list[EtcdProcess], host: str, **kwargs: Any) -> Registry:
    options = {"lease_ttl": 3, "timeout": 1.0, "retry_initial": 0.05, "retry_max": 0.5} | kwargs
    return Registry([(m.client_host, m.client_port) for m in members], host, **options)


def ranges(member: EtcdProcess) -> int:
    """The reads (Range requests) the member has served so far, by its own counter."""
    with urllib.request.urlopen(f"http://{member.endpoint}/metrics", timeout=2) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("etcd_mvcc_range_total "):
                return int(float(line.split()[1]))
    raise AssertionError("no etcd_mvcc_range_total")


def held(member: EtcdProcess, prefix: str) -> dict[str, str]:
    """What etcd holds under PREFIX + prefix, keys relative to PREFIX (read with etcdctl)."""
    reply = json.loads(member.etcdctl("get", "--prefix", PREFIX + prefix, "-w", "json"))
    return {
        base64.b64decode(kv["key"]).decode()[len(PREFIX) :]: base64.b64decode(kv["value"]).decode()
        for kv in reply.get("kvs", [])
    }


def test_lookups_are_answered_from_the_cache_and_follow_etcd(etcd: EtcdProcess) -> None:
    async def scenario() -> None:
        owner, peer = registry([etcd], "h0"), registry([etcd], "h1")
        await owner.start()
        await peer.start()
        owner.put("qp/g0/1", "a")
        assert await owner.wait_synced(5)
        assert await peer.lookup("qp/g0/1") == "a"  # reads the group, starts its watch
        before = ranges(etcd)
        assert [await peer.lookup("qp/g0/1") for _ in range(20)] == ["a"] * 20
        assert ranges(etcd) == before  # from memory
        owner.put("qp/g0/1", "a2")
        assert await until(lambda: peer.cache.cached("qp/g0/1") == "a2", 5)
        # a lookup that waits is woken by the watch's PUT
        later = asyncio.get_running_loop().call_later(0.3, owner.put, "qp/g0/2", "b")
        assert await peer.lookup("qp/g0/2", wait=5) == "b"
        later.cancel()
        owner.delete("qp/g0/1")
        assert await until(lambda: peer.cache.cached("qp/g0/1") is None, 5)
        assert await peer.lookup("qp/g0/1") is None  # a miss asks etcd itself
        assert await peer.lookup("qp/g0/9", wait=0.2) is None
        assert await peer.lookup("hosts/h9") is None  # not a peer's mapping: a plain read, no group
        assert len(peer.cache) == 1
        await owner.stop()
        await peer.stop()

    asyncio.run(asyncio.wait_for(scenario(), 40))


def test_a_lapsed_hosts_keys_leave_the_cache(etcd: EtcdProcess) -> None:
    """The owner dies without revoking: when its lease runs out its keys leave the peer's cache too."""

    async def scenario() -> None:
        owner, peer = registry([etcd], "h0", lease_ttl=2), registry([etcd], "h1")
        await owner.start()
        await peer.start()
        owner.put("qp/g0/1", "a")
        owner.put("mr/g0/7", "k")
        assert await owner.wait_synced(5)
        assert await peer.lookup("qp/g0/1") == "a" and await peer.lookup("mr/g0/7") == "k"
        crashed = time.monotonic()
        await owner.stop(revoke=False)
        gone = lambda: peer.cache.cached("qp/g0/1") is None and peer.cache.cached("mr/g0/7") is None  # noqa: E731
        assert await until(gone, 2 + 2)
        assert time.monotonic() - crashed < 2 + 1.5  # the lease's TTL and etcd's expiry tick
        assert await peer.lookup("qp/g0/1") is None
        await peer.stop()

    asyncio.run(asyncio.wait_for(scenario(), 40))


def test_cache_matches_etcd_after_a_compaction_while_cut_off(etcd: EtcdProcess) -> None:
    async def scenario() -> None:
        peer = registry([etcd], "h1")
        await peer.start()
        for key, value in (("qp/g0/1", "a"), ("qp/g0/2", "b")):
            await asyncio.to_thread(etcd.etcdctl, "put", PREFIX + key, value)
        assert await peer.lookup("qp/g0/1") == "a"
        async with out_of_reach(etcd):  # writes, a delete and a real compaction while cut off
            for args in (("put", "qp/g0/1", "a2"), ("del", "qp/g0/2"), ("put", "qp/g0/3", "c")):
                await asyncio.to_thread(etcd.etcdctl, args[0], PREFIX + args[1], *args[2:])
            revision = json.loads(etcd.etcdctl("get", "x", "-w", "json"))["header"]["revision"]
            await asyncio.to_thread(etcd.etcdctl, "compact", str(revision))
        want = held(etcd, "qp/g0/")
        assert want == {"qp/g0/1": "a2", "qp/g0/3": "c"}
        cached = lambda: {k: peer.cache.cached(k) for k in ("qp/g0/1", "qp/g0/2", "qp/g0/3")}  # noqa: E731
        assert await until(lambda: cached() == {**want, "qp/g0/2": None}, 20), cached()
        await peer.stop()

    asyncio.run(asyncio.wait_for(scenario(), 50))


def test_nothing_lost_when_a_member_dies_mid_burst(etcd_cluster: list[EtcdProcess]) -> None:
    """A burst of 1,500 writes (12 transactions); the member every client talks to is killed once the
    first transactions are in. Every key ends in etcd exactly once, under the one lease, and a peer's
    cache of the group ends equal to etcd."""

    async def scenario() -> None:
        owner, peer = registry(etcd_cluster, "h0"), registry(etcd_cluster, "h1")
        await owner.start()
        await peer.start()
        assert await owner.wait_synced(10)
        assert await peer.lookup("qp/g0/0") is None  # follows the group from before the burst
        lease = owner.lease_id
        want = {f"qp/g0/{n}": f"value-{n}-" + "x" * 200 for n in range(1500)}
        for key, value in want.items():
            owner.put(key, value)
        assert await until(lambda: owner.pending < 1400, 10)
        etcd_cluster[0].kill()  # pick_first's member: every call and watch moves to another
        assert await owner.wait_synced(30), owner.errors
        assert owner.lease_id == lease
        survivor = etcd_cluster[1]
        assert held(survivor, "qp/g0/") == want
        leases = json.loads(
            survivor.etcdctl("get", "--prefix", PREFIX + "qp/g0/", "-w", "json", "--keys-only")
        )
        assert {int(kv["lease"]) for kv in leases["kvs"]} == {lease}
        assert await until(lambda: all(peer.cache.cached(k) == v for k, v in want.items()), 20)
        await owner.stop()
        await peer.stop()

    asyncio.run(asyncio.wait_for(scenario(), 55))
