"""libshift's verbs path speaks real RoCE: the other end of the QP is a plain pyverbs program.

The peer (pyverbs_peer.py, run by Debian's python3, no libshift) opens the second device; libshift's QP on
the first sends it a message, and the peer writes its answer into libshift's MR with an RDMA WRITE. Only
on the verbs provider (`only_on`: left out of a run on the tcp provider, whose wire is its own).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from libshift.verbs import CQ, MR, PD, QP, SGE, Endpoint, QPAttr, QPInitAttr, SendWR
from libshift.verbs import enums as e

PEER = Path(__file__).with_name("pyverbs_peer.py")
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, with its pyverbs
MESSAGE = "hello from libshift"
ALL_ACCESS = e.ALL_ACCESS

pytestmark = pytest.mark.only_on("verbs")


class Peer:
    def __init__(self, device: str) -> None:
        self.proc = subprocess.Popen(
            [SYSTEM_PYTHON, str(PEER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.send({"device": device})

    def send(self, message: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the pyverbs peer ended (exit {self.proc.wait(timeout=30)})"
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def poll(cq: CQ, timeout: float = 10.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        count, wcs = cq.poll(1)
        if count:
            return wcs
        time.sleep(0.001)
    return []


def test_a_plain_pyverbs_peer_receives_a_send_and_writes_back(fabric, contexts):
    ctx = contexts[0]
    peer = Peer(fabric.devices[1])
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    qp = QP(pd, QPInitAttr(scq=cq, rcq=cq))
    mr = MR(pd, 4096, ALL_ACCESS)
    try:
        theirs = peer.read()
        ours = qp.endpoint()
        peer.send({"qpn": ours.qpn, "gid": ours.gid, "psn": ours.psn, "addr": mr.buf, "rkey": mr.rkey})
        dest = Endpoint(
            gid=theirs["gid"],
            qpn=theirs["qpn"],
            psn=theirs["psn"],
            device=fabric.devices[1],
            provider="verbs",
            provider_data={"mtu": theirs["mtu"]},
        )
        qp.to_init(QPAttr(qp_access_flags=ALL_ACCESS))
        qp.to_rtr(QPAttr(dest=dest))
        qp.to_rts(QPAttr())
        assert peer.read() == {"ready": True}
        mr.write(MESSAGE.encode())
        qp.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND, sg=[SGE(mr.buf, len(MESSAGE), mr.lkey)]))
        assert peer.read() == {"received": MESSAGE, "wrote": True}
        assert mr.read(len(MESSAGE)) == MESSAGE[::-1].encode()
        assert [(w.wr_id, w.status) for w in poll(cq)] == [(1, e.IBV_WC_SUCCESS)]
    finally:
        peer.close()
        for obj in (qp, mr, cq, pd):
            obj.close()
