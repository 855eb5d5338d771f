"""What keeps a fleet's daemons on etcd when it is loaded: the lease kept alive while writes fail, and the
daemons spread over the members (bench/fleet_scale.py found both: at 300 simulated hosts every lease was
lost while etcd was slow, and every client moved at once when the first member died)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from shiftd.registry import EtcdSecurity, Registry
from shiftd.registry_conn import spread_endpoints
from shiftlab.etcdproc import EtcdProcess

pytestmark = pytest.mark.timeout(60)


def test_spread_endpoints_start_each_host_on_its_own_member() -> None:
    endpoints = [("10.0.0.1", 2379), ("10.0.0.2", 2379), ("10.0.0.3", 2379)]
    firsts = [spread_endpoints(endpoints, f"h{i}")[0] for i in range(60)]
    assert set(firsts) == set(endpoints)  # every member leads some hosts' lists
    assert max(firsts.count(e) for e in endpoints) < 40
    assert spread_endpoints(endpoints, "h7") == spread_endpoints(endpoints, "h7")  # the same at each start
    assert sorted(spread_endpoints(endpoints, "h7")) == endpoints  # a rotation: every member stays
    assert spread_endpoints(endpoints[:1], "h7") == endpoints[:1]


def test_lease_outlives_writes_that_keep_failing(etcd: EtcdProcess, tmp_path: Path) -> None:
    """etcd refuses every write for 3 lease TTLs (the user may only read) and the backoff would grow
    past the TTL: the keep-alive still goes out first in every pass, so the lease is never lost."""
    etcd.enable_auth("root-password")
    etcd.etcdctl("role", "add", "reader")
    etcd.etcdctl("role", "grant-permission", "reader", "--prefix=true", "read", "/shift/")
    etcd.etcdctl("user", "add", "shiftd:secret")
    etcd.etcdctl("user", "grant-role", "shiftd", "reader")
    password = tmp_path / "password"
    password.write_text("secret\n")
    security = EtcdSecurity(user="shiftd", password_file=str(password))
    endpoints = [(etcd.client_host, etcd.client_port)]

    async def scenario() -> tuple[int | None, dict[str, int]]:
        reg = Registry(
            endpoints, "h0", lease_ttl=2, timeout=1.0, retry_initial=0.5, retry_max=20.0, security=security
        )
        await reg.start()
        reg.put("qp/g/1", "a")
        await asyncio.sleep(6.5)
        lease, errors = reg.lease_id, reg.errors
        ttl = json.loads(
            await asyncio.to_thread(etcd.etcdctl, "lease", "timetolive", f"{lease or 0:x}", "-w", "json")
        )
        assert ttl["ttl"] > 0, ttl
        await reg.stop(revoke=False)
        return lease, errors

    lease, errors = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert lease is not None
    assert errors.get("auth", 0) >= 3, errors  # the writes were refused all along
    assert "lease_lost" not in errors, errors
