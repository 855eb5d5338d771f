"""Fault tolerance of the daemon on the lab: etcd members die, etcd goes away, shiftd and agents are killed.

One 2x2 lab with a 3-member etcd cluster for the module. A ShiftQP stream runs from h0 to h1 through
tests/failover/peer.py while the faults happen; a sampler in h1's namespace watches the packets arriving on
its NICs, so "the stream never stops" is measured on the wire, not taken from the programs' word. Holder
processes (a libshift Agent each, publishing synthetic QP mappings) stand for the many agents of a host.
Every test leaves the lab as it found it: processes running, NICs up. Lab names start with "pf".
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

from libshift.gid import gid_of_ipv4
from shiftlab import netns
from shiftlab.lab import Lab
from shiftlab.labproc import LabProcess
from shiftlab.pids import Pid

pytestmark = [pytest.mark.lab, pytest.mark.timeout(240)]

PEER = str(Path(__file__).parents[1] / "failover" / "peer.py")
HOLDER_QPN = 0x400000  # synthetic QPNs of the holders, far above the provider's; each test its own range

HOLDER = r"""
import json, sys
from libshift.agent import Agent
from libshift.verbs import Endpoint
gid, backup_gid, base, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
agent = Agent.connect(name="holder")
print(json.dumps({"ready": True}), flush=True)
sys.stdin.readline()
for qpn in range(base, base + count):
    agent.publish_qp(Endpoint(gid, qpn, 0, "mlx5_0", "tcp"), Endpoint(backup_gid, qpn, 0, "mlx5_1", "tcp"))
print(json.dumps({"published": count}), flush=True)
for _ in sys.stdin:
    print(json.dumps({"reconnects": agent.reconnects}), flush=True)
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab(f"pf{os.getpid() % 100000}", hosts=2, nics=2, etcd_members=3)
    lab.up()
    try:
        yield lab
    finally:
        lab.down()


# ---- talking to the lab --------------------------------------------------------------------------


def shiftctl(lab: Lab, host: str, *args: str) -> subprocess.CompletedProcess[str]:
    """shiftctl on `host`, patient: a daemon that has just started serves its agents' re-publishing first."""
    argv, env = lab.exec_command(host, ["shiftctl", "--timeout", "20", *args])
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def status(lab: Lab, host: str) -> dict[str, Any]:
    """`shiftctl status --json`, which (protobuf JSON) leaves out fields at their default: 0, false, []."""
    result = shiftctl(lab, host, "status", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def agent_pids(lab: Lab, host: str) -> set[int]:
    return {int(agent["pid"]) for agent in status(lab, host).get("agents", [])}


def etcdctl(lab: Lab, *args: str, endpoints: list[str] | None = None) -> str:
    argv = ["etcdctl", "--endpoints", ",".join(endpoints or lab.etcd_endpoints), "--command-timeout", "5s"]
    result = subprocess.run(
        netns.command(lab.shape.mgmt_ns, [*argv, *args]),
        capture_output=True,
        text=True,
        env={**os.environ, "ETCDCTL_API": "3"},
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def leases(lab: Lab, prefix: str, endpoint: str | None = None) -> dict[str, int]:
    """key -> lease of every key under `prefix`; from one member's own store when `endpoint` is given."""
    args = ["get", "--prefix", prefix, "--keys-only", "-w", "json"]
    if endpoint:
        args += ["--consistency", "s"]  # serializable: that member answers from what it has itself
    out = json.loads(etcdctl(lab, *args, endpoints=[endpoint] if endpoint else None))
    return {base64.b64decode(kv["key"]).decode(): int(kv.get("lease", 0)) for kv in out.get("kvs", [])}


def host_keys(lab: Lab, host: str) -> dict[str, int]:
    """The keys shiftd of `host` writes: its host and NIC records, and the mappings of its agents."""
    gid = gid_of_ipv4(lab.shape.rail_address(0, lab.index(host)))
    found: dict[str, int] = {}
    for prefix in (f"hosts/{host}", f"nics/{host}/", f"qp/{gid}/", f"mr/{gid}/"):
        found |= leases(lab, f"/shift/v1/{prefix}")
    return found


def member_pid(lab: Lab, key: str) -> Pid:
    record = json.loads(lab.state_path.read_text())["pids"][key]
    return Pid(record["pid"], record["start"])


def leader(lab: Lab) -> str:
    """The key (in state.json) of the etcd member that leads the cluster now."""
    statuses = json.loads(etcdctl(lab, "endpoint", "status", "-w", "json"))
    for member, entry in zip(lab.etcd_members, statuses, strict=True):
        assert entry["Endpoint"] == member.endpoint
        if entry["Status"]["leader"] == entry["Status"]["header"]["member_id"]:
            return member.key
    raise AssertionError(f"no leader in {statuses}")


# ---- processes on the lab hosts ------------------------------------------------------------------


class Holder(LabProcess):
    """An agent process that publishes `count` synthetic QP mappings under the host's rail-0 GID."""

    def __init__(self, lab: Lab, host: str, base: int, count: int) -> None:
        i = lab.index(host)
        gid, backup = (gid_of_ipv4(lab.shape.rail_address(r, i)) for r in (0, 1))
        argv = [sys.executable, "-c", HOLDER, gid, backup, str(base), str(count)]
        super().__init__(lab, host, argv, timeout=40.0)
        self.keys = {f"/shift/v1/qp/{gid}/{qpn}" for qpn in range(base, base + count)}
        self.read("ready", timeout=60)

    def publish(self) -> None:
        self.send(go=True)
        self.published()

    def published(self) -> None:
        self.read("published", timeout=120)

    def reconnects(self) -> int:
        self.send(ask=True)
        return self.read("reconnects", timeout=10)["reconnects"]


class Stream:
    """A SEND stream h0 -> h1 over one ShiftQP pair (tests/failover/peer.py), in full flow once started."""

    def __init__(self, lab: Lab, rate: int = 1000) -> None:
        argv = [sys.executable, PEER]
        self.sender = LabProcess(lab, "h0", [*argv, "sender", "--rate", str(rate)], timeout=40.0)
        self.receiver = LabProcess(lab, "h1", [*argv, "receiver"], timeout=40.0)
        ends = self.sender.read("endpoints"), self.receiver.read("endpoints")
        self.sender.send(**ends[1])
        self.receiver.send(**ends[0])
        for peer in (self.sender, self.receiver):
            connected = peer.read("connected")
            assert connected == {"connected": True, "resilient": True, "state": "default"}, connected
        self.receiver.send(go=True)
        self.sender.send(go=True)
        self.sender.read("progress")

    def finish(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Stop the stream: every message the sender completed reached the receiver once, in order."""
        self.sender.send(stop=True)
        sent = self.sender.read("done")
        self.receiver.send(stop=True, expect=sent["completed"])
        received = self.receiver.read("done")
        assert self.sender.end() == 0, self.sender.stderr()
        assert self.receiver.end() == 0, self.receiver.stderr()
        assert sent["errors"] == [] and received["errors"] == [], (sent, received)
        assert not sent.get("failed") and not received.get("failed"), (sent, received)  # error completions
        assert received["received"] == sent["completed"] > 0
        return sent, received

    def kill(self) -> None:
        for peer in (self.sender, self.receiver):
            peer.end(grace=0)


class Wire:
    """Packets arriving on a host's data NICs, sampled every 10 ms from inside its namespace.

    /proc/thread-self/net/dev counts for the namespace of the reading thread, which `netns.entered` moves.
    """

    def __init__(self, lab: Lab, host: str) -> None:
        self.ns = lab.namespace(host)
        self.netdevs = set(lab.shape.devices().values())
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        with netns.entered(self.ns):
            while not self._stop.wait(0.01):
                with open("/proc/thread-self/net/dev") as f:
                    rows = [line.split(":", 1) for line in f if ":" in line]
                packets = sum(int(row[1].split()[1]) for row in rows if row[0].strip() in self.netdevs)
                self.samples.append((time.monotonic(), packets))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def longest_gap(self, start: float, end: float) -> float:
        """The longest time within [start, end] in which no packet arrived."""
        samples = list(self.samples)
        changes = [start]
        for (_, before), (t, after) in itertools.pairwise(samples):
            if start <= t <= end and after > before:
                changes.append(t)
        changes.append(end)
        return max(b - a for a, b in itertools.pairwise(changes))

    def arrived(self, start: float, end: float) -> int:
        inside = [p for t, p in self.samples if start <= t <= end]
        return inside[-1] - inside[0] if inside else 0


def wait_for_restart(lab: Lab, host: str, old: Pid, timeout: float = 30.0) -> Pid:
    """The host's next shiftd, once it serves (its supervisor heard READY)."""

    def ready() -> Pid | None:
        daemon = lab.daemon(host)
        state = json.loads(lab.supervisor_state_path(host).read_text())
        return daemon if daemon not in (None, old) and state["ready"] else None

    new = wait_until(ready, timeout=timeout)
    assert new, f"shiftd on {host} did not come back within {timeout}s"
    return new


def check_stream_in_flow(wire: Wire, start: float, end: float) -> None:
    """Packets kept arriving while the daemon was away (start to end), with no pause as long as half of it.

    A stream that waited for the daemon would pause for the whole absence; half of it bounds the stalls
    a loaded machine causes by itself, with a margin on the side of failing.
    """
    assert wire.arrived(start, end) > 0, "no packet arrived while the daemon was away"
    gap, away = wire.longest_gap(start, end), end - start
    assert gap < away / 2, f"the stream stalled for {gap:.2f}s of the daemon's {away:.2f}s away"


# ---- the tests -----------------------------------------------------------------------------------


def test_an_etcd_member_dies_and_returns_while_daemons_serve(lab: Lab) -> None:
    holder = Holder(lab, "h1", HOLDER_QPN + 0x100000, 200)
    stream = Stream(lab)
    try:
        victim = leader(lab)  # the hardest member to lose: the cluster must elect another
        member = next(m for m in lab.etcd_members if m.key == victim)
        os.kill(member_pid(lab, victim).pid, signal.SIGKILL)
        try:
            # the daemons move to the other members: they still publish, and serve their agents
            holder.publish()
            assert wait_until(lambda: holder.keys <= set(leases(lab, "/shift/v1/qp/")), timeout=20)
            for host in lab.host_names:
                assert wait_until(lambda h=host: status(lab, h).get("etcd_connected", False), timeout=20)
            stream.finish()
        finally:
            lab.up()  # restarts the member, on its own data
        # it catches up: its own store has what was written while it was dead
        assert wait_until(
            lambda: holder.keys <= set(leases(lab, "/shift/v1/qp/", member.endpoint)), timeout=20
        )
        assert set(host_keys(lab, "h0")) <= set(leases(lab, "/shift/v1/", member.endpoint))
    finally:
        stream.kill()
        holder.end()


def test_etcd_fully_down_a_nic_still_fails_over_and_the_keys_return(lab: Lab) -> None:
    stream = Stream(lab)
    try:
        for member in lab.etcd_members:
            os.kill(member_pid(lab, member.key).pid, signal.SIGKILL)
        try:
            assert wait_until(lambda: not status(lab, "h0").get("etcd_connected", False), timeout=20)
            # without etcd the daemons still tell their agents: the stream moves to the backup NIC
            result = shiftctl(lab, "h0", "fail-nic", "mlx5_0")
            assert result.returncode == 0, result.stderr
            assert stream.sender.read("state")["state"] == "fallback"
            assert int(status(lab, "h0").get("pending_writes", 0)) >= 1  # the NIC's new state waits for etcd
            sent, _ = stream.finish()
            assert [state for state, _ in sent["states"]] == ["fallback"]
        finally:
            lab.up()  # restarts the members, on their own data
        nic = "/shift/v1/nics/h0/mlx5_0"

        def nic_state() -> str:
            return json.loads(etcdctl(lab, "get", nic, "--print-value-only") or "{}").get("state", "")

        assert wait_until(lambda: nic_state() == "NIC_STATE_DOWN", timeout=30)
        for host in lab.host_names:
            assert wait_until(lambda h=host: status(lab, h).get("etcd_connected", False), timeout=20)
        expected = {f"/shift/v1/hosts/{h}" for h in lab.host_names}
        assert expected <= set(leases(lab, "/shift/v1/hosts/"))
    finally:
        stream.kill()
        shiftctl(lab, "h0", "recover-nic", "mlx5_0")


def on_lease(lab: Lab, host: str, lease: int, holders: list[Holder]) -> bool:
    """Every key of `host`'s daemon, the holders' mappings among them, is under `lease`."""
    keys = host_keys(lab, host)
    return all(h.keys <= set(keys) for h in holders) and set(keys.values()) == {lease}


def test_a_sigkilled_shiftd_comes_back_and_the_stream_never_stops(lab: Lab) -> None:
    holder = Holder(lab, "h0", HOLDER_QPN, 100)
    holder.publish()
    stream, wire = Stream(lab), Wire(lab, "h1")
    try:
        old, old_lease = lab.daemon("h0"), int(status(lab, "h0").get("lease_id", 0))
        assert old is not None
        killed = time.monotonic()
        os.kill(old.pid, signal.SIGKILL)  # the daemon this test's lab started
        wait_for_restart(lab, "h0", old)
        check_stream_in_flow(wire, killed, time.monotonic())
        assert lab.restarts("h0") == 1
        # the stream's agent registers again, and the restarted daemon's NIC events reach it: it fails over
        assert wait_until(lambda: stream.sender.pid in agent_pids(lab, "h0"), timeout=20)
        result = shiftctl(lab, "h0", "fail-nic", "mlx5_0")
        assert result.returncode == 0, result.stderr
        assert stream.sender.read("state")["state"] == "fallback"
        sent, _ = stream.finish()
        assert [state for state, _ in sent["states"]] == ["fallback"]
        # all of h0's keys, the mappings published again among them, live under the new daemon's lease
        new_lease = int(status(lab, "h0").get("lease_id", 0))
        assert new_lease != old_lease
        assert wait_until(lambda: on_lease(lab, "h0", new_lease, [holder]), timeout=30)
        assert holder.reconnects() == 1
    finally:
        wire.stop()
        stream.kill()
        holder.end()
        shiftctl(lab, "h0", "recover-nic", "mlx5_0")


@pytest.mark.slow
def test_ten_thousand_mappings_across_hosts_outlive_a_daemon_restart(lab: Lab) -> None:
    holders = [Holder(lab, h, HOLDER_QPN + 0x300000 + n * 2500, 2500) for h in lab.host_names for n in (0, 1)]
    try:
        for holder in holders:  # all at once
            holder.send(go=True)
        for holder in holders:
            holder.published()
        mappings = set().union(*(h.keys for h in holders))
        assert len(mappings) == 10_000
        assert wait_until(lambda: mappings <= set(leases(lab, "/shift/v1/qp/")), timeout=60)
        old, old_lease = lab.daemon("h1"), int(status(lab, "h1").get("lease_id", 0))
        assert old is not None
        os.kill(old.pid, signal.SIGKILL)  # the daemon this test's lab started
        wait_for_restart(lab, "h1", old)
        # h1's holders publish their 5,000 again, under the new lease; h0's are untouched
        assert wait_until(lambda: {h.pid for h in holders[2:]} <= agent_pids(lab, "h1"), timeout=30)
        new_lease = int(status(lab, "h1").get("lease_id", 0))
        assert new_lease != old_lease
        assert wait_until(lambda: on_lease(lab, "h1", new_lease, holders[2:]), timeout=60)
        assert mappings <= set(leases(lab, "/shift/v1/qp/"))
        assert [holder.reconnects() for holder in holders] == [0, 0, 1, 1]
    finally:
        for holder in holders:
            holder.end()


def test_a_sigtermed_shiftd_stops_cleanly_and_up_brings_it_back(lab: Lab) -> None:
    stream, wire = Stream(lab), Wire(lab, "h1")
    try:
        daemon = lab.daemon("h0")
        assert daemon is not None and "/shift/v1/hosts/h0" in leases(lab, "/shift/v1/hosts/")
        stopped = time.monotonic()
        os.kill(daemon.pid, signal.SIGTERM)
        # a clean stop revokes the lease (the keys go at once, not after its TTL) and is not restarted,
        # as systemd's Restart=on-failure leaves a clean exit alone
        assert wait_until(lambda: not host_keys(lab, "h0"), timeout=5)
        assert wait_until(lambda: not lab.status()["hosts"]["h0"]["supervisor"]["alive"], timeout=10)
        assert lab.daemon("h0") is None
        lab.up()
        check_stream_in_flow(wire, stopped, time.monotonic())
        assert lab.status()["healthy"]
        assert wait_until(lambda: stream.sender.pid in agent_pids(lab, "h0"), timeout=20)
        qp_keys = f"/shift/v1/qp/{gid_of_ipv4(lab.shape.rail_address(0, 0))}/"
        assert wait_until(lambda: leases(lab, qp_keys), timeout=20), "the stream's mappings are back"
        stream.finish()
    finally:
        wire.stop()
        stream.kill()


def test_a_killed_agent_takes_its_mappings_with_it(lab: Lab) -> None:
    holder = Holder(lab, "h1", HOLDER_QPN + 0x200000, 500)
    try:
        holder.publish()
        assert wait_until(lambda: holder.keys <= set(leases(lab, "/shift/v1/qp/")), timeout=20)
        assert holder.pid in agent_pids(lab, "h1")
        lease = int(status(lab, "h1").get("lease_id", 0))
        os.kill(holder.pid, signal.SIGKILL)  # the process this test started
        # the daemon sees the connection close and withdraws them, while its lease lives on
        assert wait_until(lambda: not holder.keys & set(leases(lab, "/shift/v1/qp/")), timeout=10)
        assert holder.pid not in agent_pids(lab, "h1")
        assert int(status(lab, "h1").get("lease_id", 0)) == lease
        assert "/shift/v1/hosts/h1" in host_keys(lab, "h1")
    finally:
        holder.end()
