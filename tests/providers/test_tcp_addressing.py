"""The tcp provider's addressing: a QP is reached by GID, QPN and PSN alone (docs/wire.md, Connection
set-up). Each context listens on ports of its own, and a QPN is its listener's port << 8 | an index."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest
from veth_contexts import veth_contexts

from libshift.verbs import CQ, MR, PD, QP, SGE, WC, Context, Endpoint, QPAttr, QPInitAttr, RecvWR, SendWR
from libshift.verbs import enums as e

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def ends() -> Iterator[tuple[str, str]]:
    with veth_contexts("vxq", "198.18.94") as (_fabric, a, b):
        a.close()  # each test opens its own contexts: the devices stay configured
        b.close()
        yield "vxq_a", "vxq_b"


class Side:
    def __init__(self, ctx: Context) -> None:
        self.ctx, self.pd, self.cq = ctx, PD(ctx), CQ(ctx, 64)
        self.mr = MR(self.pd, 4096, e.ALL_ACCESS)

    def qp(self) -> QP:
        return QP(self.pd, QPInitAttr(scq=self.cq, rcq=self.cq))

    def wait(self, timeout: float = 10.0) -> WC:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            count, wcs = self.cq.poll()
            if count:
                return wcs[0]
            time.sleep(0.002)
        raise AssertionError(f"no completion within {timeout} s")


def bare(endpoint: Endpoint) -> Endpoint:
    """What a peer that knows GID, QPN and PSN only would build."""
    return Endpoint(gid=endpoint.gid, qpn=endpoint.qpn, psn=endpoint.psn)


def send_over(a: Side, qa: QP, b: Side, qb: QP, text: bytes) -> None:
    qb.post_recv(RecvWR(wr_id=7, sg=[SGE(b.mr.buf, 4096, b.mr.lkey)]))
    a.mr.write(text)
    qa.post_send(SendWR(wr_id=8, opcode=e.IBV_WR_SEND, sg=[SGE(a.mr.buf, len(text), a.mr.lkey)]))
    assert (a.wait().status, b.wait().status) == (e.IBV_WC_SUCCESS, e.IBV_WC_SUCCESS)
    assert b.mr.read(len(text)) == text


def test_an_endpoint_is_gid_qpn_and_psn(ends: tuple[str, str]) -> None:
    with Context(name=ends[0]) as ca, Context(name=ends[1]) as cb:
        a, b = Side(ca), Side(cb)
        qa, qb = a.qp(), b.qp()
        assert qa.endpoint().provider_data == {} and qa.endpoint().gid == ca.query_gid()
        qb.to_init(QPAttr(qp_access_flags=e.ALL_ACCESS))
        qb.to_rtr(QPAttr(dest=bare(qa.endpoint())))  # before its peer exists at RTR: its HELLO waits
        qa.connect(bare(qb.endpoint()), QPAttr(qp_access_flags=e.ALL_ACCESS))
        qb.to_rts(QPAttr())
        send_over(a, qa, b, qb, b"by GID and QPN")


def test_contexts_on_one_device_have_listeners_of_their_own(ends: tuple[str, str]) -> None:
    """As two processes on one NIC: two contexts of one device, each QP reached by its own QPN."""
    with Context(name=ends[0]) as ca, Context(name=ends[1]) as c1, Context(name=ends[1]) as c2:
        a, b1, b2 = Side(ca), Side(c1), Side(c2)
        pairs = [(a.qp(), b.qp(), b) for b in (b1, b2)]
        assert pairs[0][1].qp_num >> 8 != pairs[1][1].qp_num >> 8  # two listeners, two ports
        for qa, qb, _b in pairs:
            qa.connect(bare(qb.endpoint()), QPAttr(qp_access_flags=e.ALL_ACCESS))
            qb.connect(bare(qa.endpoint()), QPAttr(qp_access_flags=e.ALL_ACCESS))
        for i, (qa, qb, b) in enumerate(pairs):
            send_over(a, qa, b, qb, f"to context {i}".encode())


def test_a_context_opens_another_listener_past_256_qps(ends: tuple[str, str]) -> None:
    with Context(name=ends[0]) as ca, Context(name=ends[1]) as cb:
        a, b = Side(ca), Side(cb)
        many = [b.qp() for _ in range(257)]
        assert len({qp.qp_num >> 8 for qp in many}) == 2
        assert len({qp.qp_num for qp in many}) == 257
        last, qa = many[-1], a.qp()
        qa.connect(bare(last.endpoint()), QPAttr(qp_access_flags=e.ALL_ACCESS))
        last.connect(bare(qa.endpoint()), QPAttr(qp_access_flags=e.ALL_ACCESS))
        send_over(a, qa, b, last, b"on the second listener")


@pytest.mark.parametrize("gone", ["an unknown index", "a closed QP", "a port nobody listens on"])
def test_a_qpn_nobody_has_fails_the_first_send_at_once(ends: tuple[str, str], gone: str) -> None:
    """A refusal, not a hang: timeout 0 has no ack deadline, so only the refusal can end the send."""
    with Context(name=ends[0]) as ca, Context(name=ends[1]) as cb:
        a, b = Side(ca), Side(cb)
        target = b.qp()
        qpn = target.qp_num
        if gone == "an unknown index":
            qpn ^= 0xFF
        elif gone == "a closed QP":
            target.close()
        else:
            qpn = 1 << 8  # port 1: privileged, never one of a context's listeners
        qa = a.qp()
        qa.connect(
            Endpoint(gid=cb.query_gid(), qpn=qpn, psn=0), QPAttr(qp_access_flags=e.ALL_ACCESS, timeout=0)
        )
        started = time.monotonic()
        qa.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND, sg=[SGE(a.mr.buf, 8, a.mr.lkey)]))
        wc = a.wait(timeout=5)
        assert (wc.wr_id, wc.status) == (1, e.IBV_WC_RETRY_EXC_ERR)
        assert time.monotonic() - started < 5
        assert qa.qp_state == e.IBV_QPS_ERR


def test_a_device_readdressed_keeps_its_qpns_and_connects_from_its_new_gid() -> None:
    """A NIC back from repair with another address: its context's GID and its QPs' endpoints follow, a QP
    made before the change is reached at the new GID by the QPN it had (its listener takes any address of
    the netdev), and one connecting from there connects from the new address, as its peer checks."""
    with veth_contexts("vxr", "198.18.95") as (fabric, ca, cb):
        a, b = Side(ca), Side(cb)
        (qa, qb), host = (a.qp(), b.qp()), fabric.hosts[1]
        old, new = host.address, "198.18.95.99"
        for argv in (["del", f"{old}/24"], ["add", f"{new}/24"]):
            subprocess.run(["ip", "-n", host.netns, "addr", *argv, "dev", host.netdev], check=True)
        assert cb.query_gid() == f"::ffff:{new}"
        assert (qb.endpoint().gid, qb.endpoint().qpn) == (f"::ffff:{new}", qb.qp_num)
        qa.connect(bare(qb.endpoint()), QPAttr(qp_access_flags=e.ALL_ACCESS))
        qb.connect(bare(qa.endpoint()), QPAttr(qp_access_flags=e.ALL_ACCESS))
        send_over(a, qa, b, qb, b"to the new address")
        send_over(b, qb, a, qa, b"from the new address")
