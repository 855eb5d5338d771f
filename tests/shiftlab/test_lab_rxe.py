"""`shift-lab up --provider rxe` where rdma_rxe loads (`make test-rxe`'s VM, run with --no-setup so that the
lab owns every rxe device): two hosts x two NICs on Soft-RoCE, each host's shiftd watching its own rxe
devices, a SEND stream from h0 to h1 failing over on `shiftctl fail-nic`, and `down` leaving the machine's
links, rules and routes as they were.

Both hosts live in this one kernel (shiftlab/softroce.py), so libshift lists all four rxe devices: its
"next NICs of the host" would take the other host's device as the second backup, so each side keeps one
(SHIFT_BACKUPS=1), its own host's other NIC.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Iterator

import grpc
import pytest
from pyroute2 import IPRoute
from stream_end import StreamEnd, stream
from waiting import wait_until

from libshift.agent import Agent
from libshift.api.shift.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from libshift.shift import State
from libshift.verbs import QPAttr, RecvWR
from libshift.verbs import enums as e
from shiftlab import fabric, softroce
from shiftlab.lab import Lab
from shiftlab.rxe.network import SYSFS_IB

pytestmark = [pytest.mark.lab, pytest.mark.soft_roce, pytest.mark.timeout(600)]

SENDER, RECEIVER = ("h0", "h0_rxe0"), ("h1", "h1_rxe0")
COUNT, SIZE, WINDOW = 16, 1024, 8
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
DEADLINE = 180.0  # seconds for each half of the stream under TCG
SLOW = 120.0  # seconds a process may take to be ready under TCG
POLL = 0.5  # seconds between looks: under TCG a tighter loop takes the CPU from the daemons it waits for


def machine_routing() -> dict[str, str]:
    """The initial namespace's rules, routes (every table) and links, and all.rp_filter, as text."""

    def ip(*args: str) -> str:
        return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout

    return {
        "rules": ip("-4", "rule") + ip("-6", "rule"),
        "routes": ip("-4", "route", "show", "table", "all") + ip("-6", "route", "show", "table", "all"),
        "links": re.sub(r"^\d+: ", "", ip("-o", "link"), flags=re.M),
        "rdma": subprocess.run(["rdma", "link"], capture_output=True, text=True, check=True).stdout,
        "rp_filter": softroce.RP_FILTER_ALL.read_text(),
    }


@pytest.fixture(scope="module")
def before() -> dict[str, str]:
    return machine_routing()


@pytest.fixture(scope="module")
def lab(before: dict[str, str]) -> Iterator[Lab]:
    lab = Lab(f"rxe{os.getpid() % 100000}", hosts=2, nics=2, provider="rxe", ready_timeout=SLOW)
    lab.up()
    try:
        yield lab
    finally:
        lab.down()


def list_nics(lab: Lab, host: str) -> list[common_pb2.Nic]:
    with grpc.insecure_channel(f"unix:{lab.socket(host)}") as channel:
        return list(admin_pb2_grpc.AdminStub(channel).ListNics(admin_pb2.ListNicsRequest(), timeout=30).nics)


def routed(table: int) -> bool:
    """Whether the routing table has its route (h0_rxe0's goes with its link, and the route keeper puts it
    back)."""
    with IPRoute() as ipr:
        return any(route.get("table") == table for route in ipr.route("dump", family=socket.AF_INET))


def shiftctl(lab: Lab, host: str, *args: str) -> None:
    argv, env = lab.exec_command(host, ["shiftctl", "--timeout", "30", *args])
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=SLOW)
    assert result.returncode == 0, result.stderr


def test_each_shiftd_watches_its_own_rxe_devices(lab: Lab) -> None:
    assert lab.status()["healthy"]
    for i, host in enumerate(lab.host_names):
        own = lab.shape.host_devices(i)
        assert {(n.device, n.netdev, n.provider) for n in list_nics(lab, host)} == {
            (device, netdev, "verbs") for device, netdev in own.items()
        }
        assert wait_until(
            lambda h=host: all(
                n.state == common_pb2.NIC_STATE_UP and n.port_state == "ACTIVE" for n in list_nics(lab, h)
            ),
            timeout=30,
            interval=POLL,
        )


def stream_end(lab: Lab, host: str, device: str) -> StreamEnd:
    agent = Agent.connect(socket=str(lab.socket(host)))
    assert agent is not None
    return StreamEnd(device, agent, COUNT, SIZE, WINDOW, ACCESS)


def test_a_send_across_two_hosts_fails_over_on_fail_nic(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHIFT_BACKUPS", "1")
    ends: list[StreamEnd] = []
    try:
        ends += [sender := stream_end(lab, *SENDER), receiver := stream_end(lab, *RECEIVER)]
        sender.qp.connect(receiver.qp.endpoint(), QPAttr(qp_access_flags=ACCESS))
        receiver.qp.connect(sender.qp.endpoint(), QPAttr(qp_access_flags=ACCESS))
        for seq in range(COUNT):
            sender.mr.write(os.urandom(SIZE), offset=seq * SIZE)
            receiver.qp.post_recv(RecvWR(wr_id=seq, sg=[receiver.sge(seq)]))
        half = COUNT // 2
        assert stream(sender, receiver, 0, half, DEADLINE) == list(range(half))
        assert sender.qp.state is State.DEFAULT
        shiftctl(lab, "h0", "fail-nic", "h0_rxe0")  # h0-ens1f0np0 down: rxe's port goes DOWN with it
        assert stream(sender, receiver, half, COUNT, DEADLINE) == list(range(half, COUNT))
        for seq in range(COUNT):
            assert receiver.mr.read(SIZE, seq * SIZE) == sender.mr.read(SIZE, seq * SIZE), f"message {seq}"
        assert sender.qp.state is State.FALLBACK
    finally:
        for end in reversed(ends):
            end.close()
            end.agent.close()
    with grpc.insecure_channel(f"unix:{lab.socket('h0')}") as channel:
        admin_pb2_grpc.AdminStub(channel).RecoverNic(
            admin_pb2.RecoverNicRequest(device="h0_rxe0"), timeout=30
        )
    assert wait_until(lambda: routed(softroce.table(0, 0)), timeout=30, interval=POLL)  # by the route keeper
    assert wait_until(
        lambda: (
            next(n for n in list_nics(lab, "h0") if n.device == "h0_rxe0").state == common_pb2.NIC_STATE_UP
        ),
        timeout=60,
        interval=POLL,
    )


def test_down_leaves_the_machine_as_it_was(lab: Lab, before: dict[str, str]) -> None:
    lab.down()
    assert fabric.present(lab.name) == []
    assert not any(SYSFS_IB.glob("h*_rxe*"))
    after = machine_routing()
    assert after == before
