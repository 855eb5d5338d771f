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
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from pyroute2 import IPRoute
from waiting import wait_until

from libshift.agent import Agent
from libshift.api.shift.v1 import admin_pb2, admin_pb2_grpc, common_pb2
from libshift.shift import ShiftContext, ShiftCQ, ShiftMR, ShiftPD, ShiftQP, State
from libshift.verbs import SGE, QPAttr, QPCap, QPInitAttr, RecvWR, SendWR
from libshift.verbs import enums as e
from shiftlab import fabric, routekeeper, softroce
from shiftlab.lab import Lab

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


class Side:
    def __init__(self, lab: Lab, host: str, device: str) -> None:
        self.agent = Agent.connect(socket=str(lab.socket(host)))
        assert self.agent is not None
        self.ctx = ShiftContext(device, agent=self.agent)
        assert self.ctx.resilient, f"{device}: no failover"
        self.pd = ShiftPD(self.ctx)
        self.mr = ShiftMR(self.pd, COUNT * SIZE, ACCESS)
        self.cq = ShiftCQ(self.ctx, 2 * COUNT)
        cap = QPCap(max_send_wr=WINDOW, max_recv_wr=COUNT)
        self.qp = ShiftQP(self.pd, QPInitAttr(scq=self.cq, rcq=self.cq, cap=cap))

    def sge(self, seq: int) -> SGE:
        return SGE(self.mr.buf + seq * SIZE, SIZE, self.mr.lkey)

    def close(self) -> None:
        for obj in (self.qp, self.mr, self.cq, self.pd, self.ctx, self.agent):
            obj.close()


def stream(sender: Side, receiver: Side, first: int, end: int) -> list[int]:
    """SENDs first..end-1 from sender to receiver; the wr_ids received, in order, and no failed completion."""
    sent, done, received, failed = first, first, [], []
    deadline = time.monotonic() + DEADLINE
    while len(received) < end - first and time.monotonic() < deadline:
        while sent < end and sent - done < WINDOW:
            sge = sender.sge(sent)
            sender.qp.post_send(
                SendWR(wr_id=sent, opcode=e.IBV_WR_SEND, sg=[sge], send_flags=e.IBV_SEND_SIGNALED)
            )
            sent += 1
        for side, seen in ((sender, None), (receiver, received)):
            for wc in side.cq.poll(WINDOW)[1]:
                if wc.status != e.IBV_WC_SUCCESS:
                    failed.append(f"{side.ctx.name} wr {wc.wr_id}: {e.ibv_wc_status(wc.status).name}")
                elif seen is None:
                    done += 1
                else:
                    seen.append(wc.wr_id)
        time.sleep(0.001)
    assert failed == []
    return received


def test_a_send_across_two_hosts_fails_over_on_fail_nic(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHIFT_BACKUPS", "1")
    sender, receiver = Side(lab, *SENDER), Side(lab, *RECEIVER)
    try:
        sender.qp.connect(receiver.qp.endpoint(), QPAttr(qp_access_flags=ACCESS))
        receiver.qp.connect(sender.qp.endpoint(), QPAttr(qp_access_flags=ACCESS))
        for seq in range(COUNT):
            sender.mr.write(os.urandom(SIZE), offset=seq * SIZE)
            receiver.qp.post_recv(RecvWR(wr_id=seq, sg=[receiver.sge(seq)]))
        half = COUNT // 2
        assert stream(sender, receiver, 0, half) == list(range(half))
        assert sender.qp.state is State.DEFAULT
        shiftctl(lab, "h0", "fail-nic", "h0_rxe0")  # h0-ens1f0np0 down: rxe's port goes DOWN with it
        assert stream(sender, receiver, half, COUNT) == list(range(half, COUNT))
        for seq in range(COUNT):
            assert receiver.mr.read(SIZE, seq * SIZE) == sender.mr.read(SIZE, seq * SIZE), f"message {seq}"
        assert sender.qp.state is State.FALLBACK
    finally:
        receiver.close()
        sender.close()
    with grpc.insecure_channel(f"unix:{lab.socket('h0')}") as channel:
        admin_pb2_grpc.AdminStub(channel).RecoverNic(
            admin_pb2.RecoverNicRequest(device="h0_rxe0"), timeout=30
        )
    with IPRoute() as ipr:  # the route keeper puts back what the link going down flushed
        assert wait_until(lambda: routekeeper.missing(lab.shape, ipr) == [], timeout=30, interval=POLL)
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
    assert not any(Path("/sys/class/infiniband").glob("h*_rxe*"))
    after = machine_routing()
    assert after == before
