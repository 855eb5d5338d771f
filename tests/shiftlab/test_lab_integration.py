"""shiftd on the lab fabric, end to end: real namespaces, veth links, etcd and daemons.

One 2x2 lab for the module. Each test leaves the lab as it found it (faults recovered,
processes running), so the order of the tests does not matter.
"""

import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
import urllib.request

import grpc
import pytest
from labs import running_lab
from waiting import wait_until

from libshift.agent import Agent
from libshift.api.shift.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, agent_pb2_grpc, common_pb2
from libshift.verbs import Endpoint
from shiftlab import fabric, netns

pytestmark = [pytest.mark.lab, pytest.mark.timeout(180)]

UP, DOWN = common_pb2.NIC_STATE_UP, common_pb2.NIC_STATE_DOWN


@pytest.fixture(scope="module")
def lab():
    with running_lab("it", hosts=2, nics=2) as lab:
        yield lab


def nic_reason(lab, host, device):
    """The NIC's reason as shiftd has it now (ListNics; etcd and events follow state changes only)."""
    with grpc.insecure_channel(f"unix:{lab.socket(host)}") as channel:
        nics = admin_pb2_grpc.AdminStub(channel).ListNics(admin_pb2.ListNicsRequest(), timeout=5).nics
    return next(nic.reason for nic in nics if nic.device == device)


def shiftctl(lab, host, *args):
    argv, env = lab.exec_command(host, ["shiftctl", *args])
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def link(ns, ifname):
    out = subprocess.run(
        ["ip", "-n", ns, "-j", "link", "show", "dev", ifname], capture_output=True, text=True
    )
    return json.loads(out.stdout)[0]


def carrier(ns, ifname):
    return "NO-CARRIER" not in link(ns, ifname)["flags"] and "LOWER_UP" in link(ns, ifname)["flags"]


def etcdctl(lab, *args):
    argv = netns.command(lab.shape.mgmt_ns, ["etcdctl", "--endpoints", lab.etcd_endpoint, *args])
    return subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"}).stdout


def etcd_nic(lab, host, device):
    out = etcdctl(lab, "get", f"/shift/v1/nics/{host}/{device}", "--print-value-only")
    return json.loads(out) if out.strip() else None


def etcd_keys(lab, prefix="/shift/v1/"):
    return {line for line in etcdctl(lab, "get", "--prefix", prefix, "--keys-only").splitlines() if line}


def metric(lab, host, name, **labels):
    address = f"{lab.shape.mgmt_address(lab.index(host))}:9477"

    def fetch():
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
            return response.read().decode()

    text = netns.run(lab.namespace(host), fetch)
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
        if not labels and line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name}{{{want}}} in metrics of {host}")


class Stream:
    """A subscriber in a thread: admin events (`kind="admin"`) or an agent's NIC events."""

    def __init__(self, lab, host, kind="admin"):
        self.events: queue.Queue = queue.Queue()
        self.seen: list = []
        self._channel = grpc.insecure_channel(f"unix:{lab.socket(host)}")
        if kind == "admin":
            stub = admin_pb2_grpc.AdminStub(self._channel)
            self._call = stub.StreamEvents(admin_pb2.StreamEventsRequest(follow=True))
        else:
            stub = agent_pb2_grpc.AgentStub(self._channel)
            agent_id = stub.Register(agent_pb2.RegisterRequest(name="it"), timeout=10).agent_id
            self._call = stub.WatchNicEvents(agent_pb2.WatchNicEventsRequest(agent_id=agent_id))
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self):
        try:
            for event in self._call:
                self.events.put(event)
        except grpc.RpcError:
            pass

    def wait_nic(self, device, state, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                event = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.seen.append(event)
            nic = event.nic if isinstance(event, admin_pb2.Event) and event.HasField("nic") else event
            if isinstance(nic, common_pb2.NicEvent) and nic.device == device and nic.state == state:
                return nic
        raise AssertionError(f"no {common_pb2.NicState.Name(state)} event for {device} within {timeout}s")

    def close(self):
        self._call.cancel()
        self._channel.close()


def recover(lab, host, device):
    shiftctl(lab, host, "recover-nic", device)
    assert wait_until(lambda: etcd_nic(lab, host, device)["state"] == "NIC_STATE_UP", timeout=10)


def test_fail_nic_down_and_recover(lab):
    admin_stream, agent_stream = Stream(lab, "h0"), Stream(lab, "h0", kind="agent")
    try:
        agent_stream.wait_nic("mlx5_0", UP)  # the snapshot comes first
        # the other NIC is UP before the fault too: in a lab just up it can still be in its hold-down (seen
        # once under load), and below it must be untouched by the fault
        assert wait_until(lambda: metric(lab, "h0", "shift_nic_up", device="mlx5_1") == 1)
        result = shiftctl(lab, "h0", "fail-nic", "mlx5_0")
        assert result.returncode == 0, result.stderr
        assert "state DOWN (operator_down)" in result.stdout
        for stream in (admin_stream, agent_stream):
            assert stream.wait_nic("mlx5_0", DOWN).reason == "operator_down"
        # the link really is down: the switch port (the veth peer) has no carrier
        assert wait_until(lambda: not carrier(lab.shape.rail_ns(0), "h0"))
        assert carrier(lab.shape.rail_ns(0), "h1")  # h1's port on the same rail is untouched
        # metrics and etcd follow the event a few milliseconds later (the agents come first)
        assert wait_until(lambda: metric(lab, "h0", "shift_nic_up", device="mlx5_0") == 0)
        assert metric(lab, "h0", "shift_nic_up", device="mlx5_1") == 1
        assert wait_until(lambda: etcd_nic(lab, "h0", "mlx5_0")["state"] == "NIC_STATE_DOWN")
        assert etcd_nic(lab, "h0", "mlx5_0")["fault"] == "FAULT_MODE_DOWN"
        assert etcd_nic(lab, "h1", "mlx5_0")["state"] == "NIC_STATE_UP"

        result = shiftctl(lab, "h0", "recover-nic", "mlx5_0")
        assert result.returncode == 0, result.stderr
        assert wait_until(lambda: carrier(lab.shape.rail_ns(0), "h0"))
        for stream in (admin_stream, agent_stream):
            assert stream.wait_nic("mlx5_0", UP).reason == "recovered"
        assert wait_until(lambda: metric(lab, "h0", "shift_nic_up", device="mlx5_0") == 1)
        assert metric(lab, "h0", "shift_link_events_total", device="mlx5_0") >= 2
        assert wait_until(lambda: etcd_nic(lab, "h0", "mlx5_0")["state"] == "NIC_STATE_UP")
    finally:
        admin_stream.close()
        agent_stream.close()
        recover(lab, "h0", "mlx5_0")


def test_events_command_shows_the_fault(lab):
    try:
        assert shiftctl(lab, "h1", "fail-nic", "mlx5_1").returncode == 0
        events = shiftctl(lab, "h1", "events", "--backlog", "5")
        assert events.returncode == 0
        assert "nic mlx5_1 (ens2f0np0) UP -> DOWN operator_down" in events.stdout
        assert "fault mlx5_1 injected down" in events.stdout
        as_json = [json.loads(line) for line in shiftctl(lab, "h1", "events", "--json").stdout.splitlines()]
        assert any(e.get("fault", {}).get("device") == "mlx5_1" for e in as_json)
    finally:
        recover(lab, "h1", "mlx5_1")


def test_blackhole_keeps_link_up_and_drops_traffic(lab):
    peer = lab.shape.rail_address(1, 0)
    assert wait_until(lambda: fabric.ping(lab.namespace("h1"), peer), timeout=5)
    try:
        result = shiftctl(lab, "h0", "fail-nic", "mlx5_1", "--mode", "blackhole")
        assert result.returncode == 0, result.stderr
        assert carrier(lab.namespace("h0"), "ens2f0np0")
        assert carrier(lab.shape.rail_ns(1), "h0")
        assert not fabric.ping(lab.namespace("h1"), peer)
        nic = json.loads(shiftctl(lab, "h0", "nics", "--json").stdout)[1]
        assert (nic["device"], nic["state"], nic["reason"]) == (
            "mlx5_1",
            "NIC_STATE_DOWN",
            "operator_blackhole",
        )
        assert nic["carrier"] is True
    finally:
        recover(lab, "h0", "mlx5_1")
    assert wait_until(lambda: fabric.ping(lab.namespace("h1"), peer), timeout=5)


def test_flapping_link_stays_down_until_stable(lab):
    stream = Stream(lab, "h0")
    try:
        result = shiftctl(lab, "h0", "fail-nic", "mlx5_0", "--mode", "flap", "--period", "0.2")
        assert result.returncode == 0, result.stderr
        stream.wait_nic("mlx5_0", DOWN)
        flips = set()
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            flips.add(carrier(lab.shape.rail_ns(0), "h0"))
            time.sleep(0.02)
        assert flips == {True, False}  # the link really bounces
        assert etcd_nic(lab, "h0", "mlx5_0")["state"] == "NIC_STATE_DOWN"  # but stays DOWN
        shiftctl(lab, "h0", "recover-nic", "mlx5_0")
        up = stream.wait_nic("mlx5_0", UP)
        assert up.reason == "recovered"
        cleared = [e for e in stream.seen if e.WhichOneof("kind") == "fault" and e.fault.device == "mlx5_0"]
        assert cleared and cleared[-1].fault.mode == 0
        held = (up.time_unix_nanos - cleared[-1].time_unix_nanos) / 1e9
        assert 0.95 <= held < 3  # the lab's 1 s hold-down, counted from the recovery
    finally:
        stream.close()
        recover(lab, "h0", "mlx5_0")


def test_a_relapse_during_the_hold_down_is_news_for_the_agents(lab):
    """The switch port goes down, up, and down again within the hold-down: shiftd never said UP in
    between, but a job may have connected its QPs on the working link meanwhile, so the agents hear
    DOWN again (previous state DOWN, the new reason)."""
    stream = Stream(lab, "h0", kind="agent")
    port = ["ip", "-n", lab.shape.rail_ns(0), "link", "set", "h0"]
    try:
        stream.wait_nic("mlx5_0", UP)  # the snapshot
        subprocess.run([*port, "down"], check=True)
        assert stream.wait_nic("mlx5_0", DOWN).reason == "carrier_lost"
        subprocess.run([*port, "up"], check=True)
        assert wait_until(lambda: nic_reason(lab, "h0", "mlx5_0") == "hold_down", timeout=0.9)
        subprocess.run([*port, "down"], check=True)
        relapse = stream.wait_nic("mlx5_0", DOWN)
        assert (relapse.previous_state, relapse.reason) == (DOWN, "carrier_lost")
        assert not [e for e in stream.seen if e.state == UP and e.reason == "recovered"]
        subprocess.run([*port, "up"], check=True)
        assert stream.wait_nic("mlx5_0", UP).reason == "recovered"
    finally:
        subprocess.run([*port, "up"], check=False)
        stream.close()
        recover(lab, "h0", "mlx5_0")


def test_etcd_restart_daemon_keeps_serving_and_restores_keys(lab):
    state = json.loads(lab.state_path.read_text())
    os.kill(state["pids"]["etcd"]["pid"], signal.SIGKILL)
    assert wait_until(lambda: not etcd_keys(lab), timeout=5) is not None
    shutil.rmtree(lab.state_dir / "etcd")  # a fresh, empty etcd: everything must be written again
    try:
        status = shiftctl(lab, "h0", "status", "--json")
        assert status.returncode == 0, status.stderr
        assert wait_until(lambda: not json.loads(shiftctl(lab, "h0", "status", "--json").stdout).get(
            "etcd_connected"), timeout=10)  # fmt: skip
        # a change while etcd is away is queued, then caught up
        assert shiftctl(lab, "h0", "fail-nic", "mlx5_1").returncode == 0
        assert json.loads(shiftctl(lab, "h0", "status", "--json").stdout)["pending_writes"] >= 1
    finally:
        lab.up()  # restarts the dead etcd
    expected = {f"/shift/v1/hosts/{h}" for h in ("h0", "h1")} | {
        f"/shift/v1/nics/{h}/{d}" for h in ("h0", "h1") for d in ("mlx5_0", "mlx5_1")
    }
    assert wait_until(lambda: expected <= etcd_keys(lab), timeout=20)
    assert wait_until(lambda: etcd_nic(lab, "h0", "mlx5_1")["state"] == "NIC_STATE_DOWN")
    recover(lab, "h0", "mlx5_1")
    assert json.loads(shiftctl(lab, "h0", "status", "--json").stdout)["etcd_connected"]


def test_killed_daemon_keys_expire_with_its_lease(lab):
    state = json.loads(lab.state_path.read_text())
    assert wait_until(lambda: "/shift/v1/hosts/h1" in etcd_keys(lab), timeout=10)
    killed = time.monotonic()
    os.kill(state["pids"]["h1"]["pid"], signal.SIGKILL)
    try:
        assert "/shift/v1/hosts/h1" in etcd_keys(lab)  # not revoked: a SIGKILL cannot
        assert wait_until(lambda: not any("/h1" in k for k in etcd_keys(lab)), timeout=20)
        assert time.monotonic() - killed > 2  # it went with the lease, not at once
        assert "/shift/v1/hosts/h0" in etcd_keys(lab)
    finally:
        lab.up()  # restarts the daemon
    assert wait_until(lambda: "/shift/v1/hosts/h1" in etcd_keys(lab), timeout=15)


def test_a_nic_given_another_address_has_its_record_gid_and_mappings_published_again(lab):
    """h0's mlx5_1 changes its address (a NIC back from repair, re-addressed) without changing state: its
    record in etcd, where peers read its GID, follows at once, and back again. An agent's mappings follow
    too: a QP's under the new GID as well as the old (a peer connected before names the old one, one that
    connects now the new), an MR's backup pointing at the new GID; withdrawn, both keys go."""
    ns, netdev = lab.namespace("h0"), lab.shape.devices()["mlx5_1"]
    old, new = lab.shape.rail_address(1, 0), "198.18.1.99"
    default, old_gid, new_gid = f"::ffff:{lab.shape.rail_address(0, 0)}", f"::ffff:{old}", f"::ffff:{new}"
    agent = Agent.connect(str(lab.socket("h0")), "readdress")
    assert agent is not None
    agent.publish_qp(Endpoint(old_gid, 7 << 8, 1, "mlx5_1"), Endpoint(default, 9 << 8, 2, "mlx5_0"))
    agent.publish_mr(default, 0x51, old_gid, 0x52)

    def readdress(add: str, drop: str) -> None:  # the old one first: deleting a primary takes its secondaries
        subprocess.run(["ip", "-n", ns, "addr", "del", f"{drop}/24", "dev", netdev], check=True)
        subprocess.run(["ip", "-n", ns, "addr", "add", f"{add}/24", "dev", netdev], check=True)

    assert wait_until(
        lambda: etcd_nic(lab, "h0", "mlx5_1")["state"] == "NIC_STATE_UP", timeout=10
    )  # a lab just up
    assert etcd_nic(lab, "h0", "mlx5_1")["gid"] == f"::ffff:{old}"
    readdress(new, old)
    try:
        assert wait_until(lambda: etcd_nic(lab, "h0", "mlx5_1")["gid"] == f"::ffff:{new}", timeout=10)
        assert etcd_nic(lab, "h0", "mlx5_1")["addresses"] == [new]
        record = etcd_nic(lab, "h0", "mlx5_1")
        assert record["state"] == "NIC_STATE_UP", record  # no state change needed for it
        qp_keys = {f"/shift/v1/qp/{gid}/{7 << 8}" for gid in (old_gid, new_gid)}
        assert wait_until(lambda: qp_keys <= etcd_keys(lab), timeout=10)
        mr = json.loads(etcdctl(lab, "get", f"/shift/v1/mr/{default}/{0x51}", "--print-value-only"))
        assert (mr["gid"], mr["backupGid"]) == (default, new_gid)
        agent.withdraw_qp(Endpoint(new_gid, 7 << 8, 1, "mlx5_1"))
        assert wait_until(lambda: not qp_keys & etcd_keys(lab), timeout=10)
    finally:
        agent.close()
        readdress(old, new)
    assert wait_until(lambda: etcd_nic(lab, "h0", "mlx5_1")["gid"] == f"::ffff:{old}", timeout=10)


def test_bad_input_gives_one_line(lab):
    unknown = shiftctl(lab, "h0", "fail-nic", "mlx5_7")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "shiftctl: unknown device 'mlx5_7' (known: mlx5_0, mlx5_1)"
    assert shiftctl(lab, "h0", "nics").returncode == 0
