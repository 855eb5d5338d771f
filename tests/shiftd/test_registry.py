"""shiftd.registry against a real etcd: publish, outages, leases, lookups, resumable watches."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from etcd_fixtures import out_of_reach

from shiftd.registry import Registry, RegistryUnavailable, WatchEvent
from shiftlab.etcdproc import EtcdProcess, free_port

pytestmark = pytest.mark.timeout(60)
PREFIX = "/shift/v1/"
# How long a watch may take to deliver again after etcd came back. The reconnect backoff is capped
# at 0.5 s, but gRPC's connection attempts time out while a restarted etcd is not yet serving, and
# on a loaded 2-core CI machine a resume once took longer than 5 s. These tests check what is
# delivered, not how fast.
AFTER_OUTAGE = 20.0


def run(coro: Coroutine[Any, Any, Any], timeout: float = 40) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def registry(members: list[EtcdProcess], host: str = "h0", **kwargs: Any) -> Registry:
    options = {"lease_ttl": 3, "timeout": 1.0, "retry_initial": 0.05, "retry_max": 0.5} | kwargs
    return Registry([(m.client_host, m.client_port) for m in members], host, **options)


def stored(member: EtcdProcess, key: str) -> tuple[str, int] | None:
    """(value, lease id) of a key as etcd itself reports it, read with etcdctl."""
    reply = json.loads(member.etcdctl("get", PREFIX + key, "-w", "json"))
    if not reply.get("kvs"):
        return None
    kv = reply["kvs"][0]
    return base64.b64decode(kv["value"]).decode(), int(kv.get("lease", 0))


def count(member: EtcdProcess, prefix: str = "") -> int:
    reply = member.etcdctl("get", PREFIX + prefix, "--prefix", "--keys-only", "-w", "json")
    return int(json.loads(reply).get("count", 0))


def member_status(member: EtcdProcess) -> tuple[int, int]:
    """(this member's id, the leader's id) as the member reports them."""
    status = json.loads(member.etcdctl("endpoint", "status", "-w", "json"))[0]["Status"]
    return status["header"]["member_id"], status["leader"]


def make_leader(members: list[EtcdProcess], new: EtcdProcess) -> None:
    """Move the cluster's leadership to `new` (etcd's own transfer, asked of the current leader)."""
    new_id, leader_id = member_status(new)
    if new_id != leader_id:
        leader = next(m for m in members if member_status(m)[0] == leader_id)
        leader.etcdctl("move-leader", f"{new_id:x}")
    assert member_status(new) == (new_id, new_id)


def watchers(member: EtcdProcess) -> int:
    """How many watches the member serves right now (its own gauge)."""
    with urllib.request.urlopen(f"http://{member.endpoint}/metrics", timeout=2) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("etcd_debugging_mvcc_watcher_total "):
                return int(float(line.split()[1]))
    raise AssertionError(f"etcd at {member.endpoint} exports no watcher gauge")


def until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def freeze(proc: subprocess.Popen[Any]) -> None:
    """SIGSTOP `proc` and wait until every thread of it has stopped: the signal is delivered when a thread
    of it next runs, and on a loaded machine another thread could answer a request meanwhile (a CI run saw
    a write sent just after the signal come back applied)."""
    proc.send_signal(signal.SIGSTOP)

    def stopped() -> bool:
        tasks = list(Path(f"/proc/{proc.pid}/task").iterdir())
        return all((task / "stat").read_text().rsplit(")", 1)[1].split()[0] in "tT" for task in tasks)

    assert until(stopped, 5), f"pid {proc.pid} did not stop"


async def collect(events: AsyncIterator[WatchEvent], into: list[WatchEvent]) -> None:
    async for event in events:
        into.append(event)


def state_of(reg: Registry, events: list[WatchEvent]) -> str:
    """What a failed wait saw: the events so far and the registry's link."""
    seen_so_far = [(e.type, e.key, e.value) for e in events]
    return f"events {seen_so_far}; connected {reg.connected}; errors {reg.errors}"


async def seen(into: list[WatchEvent], want: Callable[[list[WatchEvent]], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not want(into):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def test_free_ports_are_never_handed_out_twice() -> None:
    """Three members of a cluster once got two equal peer ports (etcd: "has duplicate url")."""
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


# ---- publish and look up -------------------------------------------------------------------------


def test_publish_get_delete_and_revoke_on_stop(etcd: EtcdProcess) -> None:
    async def scenario() -> None:
        reg = registry([etcd])
        await reg.start()
        reg.put("nics/h0/mlx5_0", '{"state":"UP"}')
        for i in range(200):  # more than one transaction's worth (128 ops)
            reg.put(f"qp/g0/{i}", str(i))
        assert reg.pending == 201
        assert await reg.wait_synced(10)
        assert reg.connected and reg.pending == 0 and reg.lease_id
        assert stored(etcd, "nics/h0/mlx5_0") == ('{"state":"UP"}', reg.lease_id)
        assert count(etcd, "qp/g0/") == 200
        assert await reg.get("nics/h0/mlx5_0") == '{"state":"UP"}'
        assert await reg.get("nics/h0/absent") is None

        reg.delete("qp/g0/7")
        reg.put("qp/g0/8", "changed")
        assert reg.pending == 2
        assert (await reg.get("qp/g0/7"), await reg.get("qp/g0/8")) == (None, "changed")  # our own writes
        assert await reg.wait_synced(5)
        assert stored(etcd, "qp/g0/7") is None
        assert stored(etcd, "qp/g0/8") == ("changed", reg.lease_id)
        with pytest.raises(ValueError, match="relative"):
            reg.put("/shift/v1/x", "y")

        await reg.stop(revoke=True)
        assert count(etcd) == 0  # revoked: gone at once, not at expiry
        assert reg.errors == {}

    run(scenario())


def test_oversized_write_is_rejected_without_blocking_others(etcd: EtcdProcess) -> None:
    kinds: list[str] = []

    async def scenario() -> None:
        reg = registry([etcd], on_error=kinds.append)
        await reg.start()
        reg.put("qp/g0/big", "x" * (1600 << 10))  # over etcd's 1.5 MiB request limit
        reg.put("qp/g0/huge", "x" * (3 << 20))  # over its gRPC message limit too
        for i in range(20):
            reg.put(f"qp/g0/{i}", "y" * (100 << 10))  # 2 MiB in all: needs more than one transaction
        assert await reg.wait_synced(10)
        assert count(etcd, "qp/g0/") == 20
        assert reg.errors == {"rejected": 2} and kinds == ["rejected", "rejected"]
        assert reg.connected
        await reg.stop()

    run(scenario())


def test_etcd_down_at_start_then_up(etcd_member: EtcdProcess) -> None:
    kinds: list[str] = []

    async def scenario() -> None:
        reg = registry([etcd_member], on_error=kinds.append)
        started = time.monotonic()
        await reg.start()
        assert time.monotonic() - started < 0.5
        reg.put("hosts/h0", "v1")
        await asyncio.sleep(0.5)
        assert reg.pending == 1 and not reg.connected and reg.lease_id is None
        assert kinds and set(kinds) <= {"unavailable", "timeout"}
        assert reg.errors["unavailable"] + reg.errors.get("timeout", 0) == len(kinds)
        with pytest.raises(RegistryUnavailable, match=r"did not answer within 1s"):
            await reg.get("hosts/h1")  # another host's key (our own pending one we know: test_publish_...)

        await asyncio.to_thread(etcd_member.start)
        assert await reg.wait_synced(10), "pending writes did not drain after etcd came up"
        assert stored(etcd_member, "hosts/h0") == ("v1", reg.lease_id)
        await reg.stop()

    run(scenario())


@pytest.mark.parametrize("wipe", [False, True], ids=["same-data-dir", "wiped-data-dir"])
def test_keys_come_back_after_etcd_restart(etcd: EtcdProcess, wipe: bool) -> None:
    async def scenario() -> None:
        reg = registry([etcd])
        await reg.start()
        reg.put("hosts/h0", "up")
        assert await reg.wait_synced(10)
        first_lease = reg.lease_id

        etcd.kill()
        if wipe:
            shutil.rmtree(etcd.data_dir)
        reg.put("nics/h0/mlx5_1", "DOWN")  # while etcd is away
        await asyncio.sleep(0.3)
        assert reg.pending >= 1 and not reg.connected

        await asyncio.to_thread(etcd.start)
        assert await reg.wait_synced(10)
        assert stored(etcd, "hosts/h0") == ("up", reg.lease_id)
        assert stored(etcd, "nics/h0/mlx5_1") == ("DOWN", reg.lease_id)
        assert (reg.lease_id != first_lease) == wipe  # a wiped store has no lease: a new one was granted
        await reg.stop()

    run(scenario())


# ---- leases ------------------------------------------------------------------------------------------

CHILD = """
import asyncio, sys
from shiftd.registry import Registry

async def main():
    reg = Registry([("127.0.0.1", int(sys.argv[1]))], "child", lease_ttl=2, retry_initial=0.05, retry_max=0.3)
    await reg.start()
    reg.put("hosts/child", "alive")
    assert await reg.wait_synced(10)
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def start_child(member: EtcdProcess) -> subprocess.Popen[str]:
    """A separate daemon-like process that publishes hosts/child and then idles."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(member.client_port)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def test_sigkilled_owner_keys_vanish_at_lease_expiry(etcd: EtcdProcess) -> None:
    child = start_child(etcd)
    try:
        assert stored(etcd, "hosts/child") is not None
        child.kill()
        child.wait()
        killed = time.monotonic()
        assert stored(etcd, "hosts/child") is not None  # still there: nobody revoked it
        assert until(lambda: stored(etcd, "hosts/child") is None, 6)
        assert 1.0 < time.monotonic() - killed < 5.5
    finally:
        child.kill()
        child.wait()


def test_lease_regranted_after_it_expired(etcd: EtcdProcess) -> None:
    """The owner is frozen (SIGSTOP) past its ttl: etcd expires the lease; thawed, it re-publishes."""
    child = start_child(etcd)
    try:
        before = stored(etcd, "hosts/child")
        assert before is not None
        child.send_signal(signal.SIGSTOP)
        assert until(lambda: stored(etcd, "hosts/child") is None, 8), "lease did not expire"
        child.send_signal(signal.SIGCONT)
        assert until(lambda: stored(etcd, "hosts/child") is not None, 8), "key was not re-published"
        after = stored(etcd, "hosts/child")
        assert after is not None and after[0] == "alive" and after[1] not in (0, before[1])
    finally:
        child.send_signal(signal.SIGCONT)
        child.kill()
        child.wait()


def test_lease_revoked_behind_our_back_is_regranted(etcd: EtcdProcess) -> None:
    kinds: list[str] = []

    async def scenario() -> None:
        reg = registry([etcd], lease_ttl=3, on_error=kinds.append)
        await reg.start()
        reg.put("hosts/h0", "up")
        assert await reg.wait_synced(10)
        old = reg.lease_id
        assert old is not None
        await asyncio.to_thread(etcd.etcdctl, "lease", "revoke", f"{old:x}")
        assert stored(etcd, "hosts/h0") is None
        # the next keepalive (ttl/3 = 1 s) finds the lease gone
        assert await seen([], lambda _: reg.lease_id not in (None, old) and reg.pending == 0, 5)
        assert stored(etcd, "hosts/h0") == ("up", reg.lease_id)
        assert kinds == ["lease_lost"]
        await reg.stop()

    run(scenario())


# ---- lookups -------------------------------------------------------------------------------------------


def test_wait_for_a_key_published_later(etcd: EtcdProcess) -> None:
    async def scenario() -> None:
        reader, writer = registry([etcd], "h0"), registry([etcd], "h1")
        await reader.start()
        await writer.start()

        async def publish_later() -> None:
            await asyncio.sleep(0.5)
            writer.put("qp/gid1/77", "backup-qpn-99")

        started = time.monotonic()
        task = asyncio.create_task(publish_later())
        assert await reader.wait_for("qp/gid1/77", 5) == "backup-qpn-99"
        assert 0.4 < time.monotonic() - started < 3
        await task
        assert await reader.wait_for("qp/gid1/77", 1) == "backup-qpn-99"  # already there: no wait
        assert await reader.wait_for("qp/gid1/78", 0.3) is None
        await writer.stop()
        await reader.stop()

    run(scenario())


# ---- watches -------------------------------------------------------------------------------------------


def test_watch_resumes_across_etcd_restart(etcd: EtcdProcess) -> None:
    async def scenario() -> None:
        reg = registry([etcd])
        await reg.start()
        events: list[WatchEvent] = []
        watcher = asyncio.create_task(collect(reg.watch_prefix("nics/"), events))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(etcd.etcdctl, "put", PREFIX + "nics/h1/a", "1")
        await asyncio.to_thread(etcd.etcdctl, "put", PREFIX + "hosts/h1", "ignored")
        assert await seen(events, lambda e: len(e) == 1, 5)

        etcd.kill()
        await asyncio.sleep(0.3)
        await asyncio.to_thread(etcd.start)
        await asyncio.to_thread(etcd.etcdctl, "put", PREFIX + "nics/h1/b", "2")
        await asyncio.to_thread(etcd.etcdctl, "del", PREFIX + "nics/h1/a")
        assert await seen(events, lambda e: len(e) >= 3, AFTER_OUTAGE), state_of(reg, events)
        await asyncio.sleep(0.3)  # no replay of old events may follow
        assert [(e.type, e.key, e.value) for e in events] == [
            ("PUT", "nics/h1/a", "1"),
            ("PUT", "nics/h1/b", "2"),
            ("DELETE", "nics/h1/a", None),
        ]
        assert [e.revision for e in events] == sorted({e.revision for e in events})
        await reg.stop()
        await asyncio.wait_for(watcher, 2)  # the watch ends when the registry stops

    run(scenario())


def test_watch_without_events_resumes_where_it_started(
    etcd: EtcdProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """A watch that has delivered nothing yet resumes from where it started, not from "now".

    Resuming "from now" would lose for good what was written while it was cut off. (It failed twice in CI
    with no event at all and the link connected; a failure now shows whether the watch was created again,
    in the log, and whether etcd serves it.)
    """
    caplog.set_level(logging.INFO, logger="shiftd.registry")

    async def scenario() -> None:
        reg = registry([etcd])
        await reg.start()
        events: list[WatchEvent] = []
        watcher = asyncio.create_task(collect(reg.watch_prefix("nics/"), events))
        assert await asyncio.to_thread(until, lambda: watchers(etcd) == 1, 5)
        async with out_of_reach(etcd):
            await asyncio.to_thread(etcd.etcdctl, "put", PREFIX + "nics/h1/a", "while-away")
        await asyncio.to_thread(etcd.etcdctl, "put", PREFIX + "nics/h1/b", "after")
        assert await seen(events, lambda e: len(e) >= 2, AFTER_OUTAGE), (
            f"{state_of(reg, events)}; etcd serves {watchers(etcd)} watches"
        )
        await asyncio.sleep(0.3)
        assert [(e.key, e.value) for e in events] == [("nics/h1/a", "while-away"), ("nics/h1/b", "after")]
        assert "resumed from revision" in caplog.text
        await reg.stop()
        await asyncio.wait_for(watcher, 2)

    run(scenario())


def test_watch_resyncs_after_etcd_wiped(etcd: EtcdProcess) -> None:
    """A store restarted empty is behind the watch's revision: resync instead of waiting for it."""

    async def scenario() -> None:
        reg = registry([etcd])
        await reg.start()
        events: list[WatchEvent] = []
        watcher = asyncio.create_task(collect(reg.watch_prefix("nics/"), events))
        await asyncio.sleep(0.3)
        for value in "1234":
            await asyncio.to_thread(etcd.etcdctl, "put", PREFIX + "nics/h1/a", value)
        assert await seen(events, lambda e: len(e) == 4, 5)

        etcd.kill()
        shutil.rmtree(etcd.data_dir)
        await asyncio.to_thread(etcd.start)
        await asyncio.to_thread(etcd.etcdctl, "put", PREFIX + "nics/h1/b", "new")
        assert await seen(events, lambda e: len(e) >= 6, AFTER_OUTAGE), state_of(reg, events)
        await asyncio.sleep(0.3)
        assert [(e.type, e.key, e.value) for e in events[4:]] == [
            ("DELETE", "nics/h1/a", None),
            ("PUT", "nics/h1/b", "new"),
        ]
        await reg.stop()
        await asyncio.wait_for(watcher, 2)

    run(scenario())


def test_watch_resyncs_after_compaction(etcd: EtcdProcess) -> None:
    """While the watch is cut off, etcd moves on and compacts past the watch's revision."""

    async def scenario() -> None:
        reg = registry([etcd])
        await reg.start()
        events: list[WatchEvent] = []
        watcher = asyncio.create_task(collect(reg.watch_prefix("qp/"), events))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(etcd.etcdctl, "put", PREFIX + "qp/g/1", "a")
        await asyncio.to_thread(etcd.etcdctl, "put", PREFIX + "qp/g/2", "b")
        assert await seen(events, lambda e: len(e) == 2, 5)

        async with out_of_reach(etcd):  # writes and a real compaction
            changes = [("put", "qp/g/1", "a2"), ("del", "qp/g/2"), ("put", "qp/g/3", "c")]
            for verb, key, *value in changes:
                await asyncio.to_thread(etcd.etcdctl, verb, PREFIX + key, *value)
            revision = json.loads(etcd.etcdctl("get", "x", "-w", "json"))["header"]["revision"]
            await asyncio.to_thread(etcd.etcdctl, "compact", str(revision))

        assert await seen(events, lambda e: len(e) >= 5, AFTER_OUTAGE), state_of(reg, events)
        await asyncio.to_thread(etcd.etcdctl, "put", PREFIX + "qp/g/4", "d")
        assert await seen(events, lambda e: len(e) >= 6, 5)
        assert [(e.type, e.key, e.value) for e in events] == [
            ("PUT", "qp/g/1", "a"),
            ("PUT", "qp/g/2", "b"),
            ("DELETE", "qp/g/2", None),  # resync: gone since we last saw it
            ("PUT", "qp/g/1", "a2"),  # resync: the current state
            ("PUT", "qp/g/3", "c"),
            ("PUT", "qp/g/4", "d"),  # and live events after it
        ]
        await reg.stop()
        await asyncio.wait_for(watcher, 2)

    run(scenario())


# ---- shutdown and clusters --------------------------------------------------------------------------------


@pytest.mark.parametrize("outage", ["killed", "frozen"])
def test_stop_with_etcd_down_is_bounded(etcd: EtcdProcess, outage: str) -> None:
    async def scenario() -> None:
        reg = registry([etcd], timeout=1.0)
        await reg.start()
        reg.put("hosts/h0", "up")
        assert await reg.wait_synced(10)
        assert etcd.proc is not None
        if outage == "killed":
            etcd.kill()
        else:
            freeze(etcd.proc)  # connection open, no answers
        started = time.monotonic()
        await reg.stop(revoke=True)
        assert time.monotonic() - started < 1.5

    try:
        run(scenario())
    finally:
        if etcd.proc is not None:
            etcd.proc.send_signal(signal.SIGCONT)


@pytest.mark.parametrize("outage", ["killed", "frozen"])
def test_cluster_member_lost_writes_and_watches_continue(
    etcd_cluster: list[EtcdProcess], outage: str
) -> None:
    """Member 0, the one gRPC's pick_first talks to, is made the leader and then lost.

    Killed: its connection breaks at once, the watch's reconnect races the write, and the write
    meets a leader election (it may time out on the client and still be applied). Frozen: TCP
    stays up and nothing answers; only an unanswered HTTP/2 ping can tell (within the keepalive
    interval plus the timeout), else every call, the watch included, stays with the dead member.
    """
    lost = etcd_cluster[0]

    async def scenario() -> None:
        await asyncio.to_thread(make_leader, etcd_cluster, lost)
        reg = registry(etcd_cluster)
        await reg.start()
        events: list[WatchEvent] = []
        watcher = asyncio.create_task(collect(reg.watch_prefix("nics/"), events))
        reg.put("hosts/h0", "up")
        assert await reg.wait_synced(10)
        lease = reg.lease_id
        assert await asyncio.to_thread(until, lambda: watchers(lost) == 1, 5)
        assert lost.proc is not None
        lost.proc.send_signal(signal.SIGKILL if outage == "killed" else signal.SIGSTOP)
        reg.put("nics/h0/mlx5_0", "UP")
        assert await reg.wait_synced(12)
        assert await reg.get("nics/h0/mlx5_0") == "UP"
        assert stored(etcd_cluster[1], "nics/h0/mlx5_0") == ("UP", lease)
        assert stored(etcd_cluster[2], "hosts/h0") == ("up", lease)
        assert await seen(events, lambda e: len(e) >= 1, 3)
        await asyncio.sleep(0.5)  # a second event (the write repeated) would be here by now
        assert [(e.type, e.key, e.value) for e in events] == [("PUT", "nics/h0/mlx5_0", "UP")]
        await reg.stop()
        await asyncio.wait_for(watcher, 2)
        assert count(etcd_cluster[1]) == 0

    try:
        run(scenario())
    finally:
        if lost.proc is not None:
            lost.proc.send_signal(signal.SIGCONT)


def test_write_whose_reply_was_lost_is_not_repeated(etcd: EtcdProcess) -> None:
    """etcd frozen with the transaction in its socket: the client gives up, etcd applies it on thaw.

    The audit after the failure must find the key already written, not put it a second time
    (every watcher would see the second put as a second event).
    """

    async def scenario() -> None:
        reg = registry([etcd], lease_ttl=30)  # no keep-alive due while frozen: the write fails first
        await reg.start()
        events: list[WatchEvent] = []
        watcher = asyncio.create_task(collect(reg.watch_prefix("nics/"), events))
        reg.put("hosts/h0", "up")
        assert await reg.wait_synced(10)
        assert await asyncio.to_thread(until, lambda: watchers(etcd) == 1, 5)
        assert etcd.proc is not None
        freeze(etcd.proc)
        try:
            reg.put("nics/h0/mlx5_0", "UP")
            assert await seen([], lambda _: not reg.connected, 5)  # the client gave up
            assert reg.pending == 1
        finally:
            etcd.proc.send_signal(signal.SIGCONT)
        assert await reg.wait_synced(10)
        assert await seen(events, lambda e: len(e) >= 1, 3)
        await asyncio.sleep(0.5)
        assert [(e.type, e.key, e.value) for e in events] == [("PUT", "nics/h0/mlx5_0", "UP")]
        await reg.stop()
        await asyncio.wait_for(watcher, 2)

    run(scenario())
