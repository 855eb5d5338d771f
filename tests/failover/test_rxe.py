"""Failover on Soft-RoCE, in `make test-rxe`'s VM: a SEND stream survives its link going down.

The VM is one kernel holding both "hosts'" NICs (shiftlab/rxe/network.py): rxe0-rxe1 and rxe2-rxe3 are the
two links, the even devices one host's, the odd ones the other's. A ShiftContext on rxe0 (backup rxe2) sends
to one on rxe1 (backup rxe3); `ip link set veth0 down` takes rxe0's link down, and with it rxe1's carrier:
both sides' default paths fail at once, and every message must still arrive once, in order, intact.

The shift layer exchanges backup endpoints through shiftd and etcd (keys.py, the agent), so the test starts
both inside the VM; shiftd watches the four rxe devices as RDMA devices (its inventory from
/sys/class/infiniband). The policy's "the next NICs of the host" cannot tell the hosts apart on one kernel
(rxe0's next NIC is its own peer), so the test names each side's backup.
"""

from __future__ import annotations

import os
import struct
import subprocess
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess

from libshift.agent import Agent
from libshift.shift import ShiftContext, ShiftCQ, ShiftMR, ShiftPD, ShiftQP, State
from libshift.verbs import SGE, QPAttr, QPCap, QPInitAttr, RecvWR, SendWR, get_device_list
from libshift.verbs import enums as e
from shiftlab.etcdproc import EtcdProcess

pytestmark = [pytest.mark.lab, pytest.mark.soft_roce, pytest.mark.timeout(600)]

SENDER, RECEIVER = "rxe0", "rxe1"
BACKUP_OF = {SENDER: ["rxe2"], RECEIVER: ["rxe3"]}
NETDEV = "veth0"  # rxe0's (shiftlab/rxe/network.py)
COUNT, SIZE, WINDOW = 64, 1024, 8
FAIL_AT = COUNT // 4  # messages received before the link goes down
HEADER = struct.Struct("<II")  # sequence number, crc32 of the rest
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
DEADLINE = 240.0  # seconds for the whole stream under TCG


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    """etcd and shiftd inside the VM, and an agent of this process registered with that shiftd."""
    present = {d.name for d in get_device_list() if d.provider == "verbs"}
    if not {SENDER, RECEIVER, *BACKUP_OF[SENDER], *BACKUP_OF[RECEIVER]} <= present:
        pytest.skip(
            f"needs the rxe devices of make test-rxe's VM (shiftlab.rxe); verbs has {sorted(present)}"
        )
    etcd = EtcdProcess(data_dir=tmp_path / "etcd", log_path=tmp_path / "etcd.log")
    daemon = DaemonProcess(tmp_path / "shiftd", sections={"etcd": {"endpoints": [etcd.endpoint]}})
    try:
        etcd.start(wait=120)  # under TCG a start takes seconds
        daemon.start(timeout=120)
        found = Agent.connect(socket=daemon.socket)
        assert found is not None
        yield found
        found.close()
    finally:
        daemon.stop()
        etcd.kill()
        print(daemon.log()[-4000:])  # shown by pytest when the test failed


@pytest.fixture
def link_down() -> Iterator[None]:
    """Brings veth0 back up after the test whatever it did (the VM's RouteKeeper restores its routes)."""
    yield
    subprocess.run(["ip", "link", "set", NETDEV, "up"], check=True)


class Side:
    def __init__(self, device: str, agent: Agent) -> None:
        self.ctx = ShiftContext(device, agent=agent)
        assert self.ctx.resilient, f"{device}: no failover"
        self.pd = ShiftPD(self.ctx)
        self.mr = ShiftMR(self.pd, COUNT * SIZE, ACCESS)
        self.cq = ShiftCQ(self.ctx, 2 * COUNT)
        cap = QPCap(max_send_wr=WINDOW, max_recv_wr=COUNT)
        self.qp = ShiftQP(self.pd, QPInitAttr(scq=self.cq, rcq=self.cq, cap=cap))

    def sge(self, seq: int) -> SGE:
        return SGE(self.mr.buf + seq * SIZE, SIZE, self.mr.lkey)

    def close(self) -> None:
        for obj in (self.qp, self.mr, self.cq, self.pd, self.ctx):
            obj.close()


def message(seq: int) -> bytes:
    body = os.urandom(SIZE - HEADER.size)
    return HEADER.pack(seq, zlib.crc32(body)) + body


def test_a_send_stream_survives_the_link_going_down(
    agent: Agent, link_down: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("libshift.shift.context.backup_devices", lambda default, *_: BACKUP_OF[default])
    sender, receiver = Side(SENDER, agent), Side(RECEIVER, agent)
    try:
        sender.qp.connect(receiver.qp.endpoint(), QPAttr(qp_access_flags=ACCESS))
        receiver.qp.connect(sender.qp.endpoint(), QPAttr(qp_access_flags=ACCESS))
        for seq in range(COUNT):
            sender.mr.write(message(seq), offset=seq * SIZE)
            receiver.qp.post_recv(RecvWR(wr_id=seq, sg=[receiver.sge(seq)]))
        sent = done = 0
        received: list[int] = []
        failed: list[str] = []
        down_at: float | None = None
        deadline = time.monotonic() + DEADLINE
        while len(received) < COUNT and time.monotonic() < deadline:
            while sent < COUNT and sent - done < WINDOW:
                wr = SendWR(
                    wr_id=sent, opcode=e.IBV_WR_SEND, sg=[sender.sge(sent)], send_flags=e.IBV_SEND_SIGNALED
                )
                sender.qp.post_send(wr)
                sent += 1
            for side, seen in ((sender, None), (receiver, received)):
                for wc in side.cq.poll(WINDOW)[1]:
                    if wc.status != e.IBV_WC_SUCCESS:
                        failed.append(f"{side.ctx.name} wr {wc.wr_id}: {e.ibv_wc_status(wc.status).name}")
                    elif seen is None:
                        done += 1
                    else:
                        seen.append(wc.wr_id)
            if down_at is None and len(received) >= FAIL_AT:
                subprocess.run(["ip", "link", "set", NETDEV, "down"], check=True)
                down_at = time.monotonic()
            time.sleep(0.001)
        assert failed == []
        assert received == list(range(COUNT)), f"{len(received)} of {COUNT} received"
        for seq in range(COUNT):
            assert receiver.mr.read(SIZE, seq * SIZE) == sender.mr.read(SIZE, seq * SIZE), f"message {seq}"
        assert sender.qp.state is State.FALLBACK and receiver.qp.state is State.FALLBACK
    finally:
        receiver.close()
        sender.close()
