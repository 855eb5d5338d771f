"""QP state rules, queue limits, CQ overflow, devices and endpoints."""

from __future__ import annotations

import errno
import time

import pytest

from libshift.device import get_device_list
from libshift.verbs import (
    SGE,
    Context,
    CQOverflowError,
    Endpoint,
    QPAttr,
    QPCap,
    RecvWR,
    SendWR,
    VerbsError,
    VerbsRDMAError,
)
from libshift.verbs import enums as e

ALL_ACCESS = e.ALL_ACCESS


def send(side, wr_id: int = 1, length: int = 8) -> SendWR:
    return SendWR(wr_id=wr_id, opcode=e.IBV_WR_SEND, sg=[SGE(side.mr.buf, length, side.mr.lkey)])


def recv(side, wr_id: int = 1) -> RecvWR:
    return RecvWR(wr_id=wr_id, sg=[SGE(side.mr.buf, 64, side.mr.lkey)])


def test_state_walk_and_posting_rules(make_pair):
    pair = make_pair(connected=False)
    a, b = pair.a, pair.b
    assert a.qp.qp_state == e.IBV_QPS_RESET
    with pytest.raises(VerbsRDMAError, match="post_recv needs INIT, RTR or RTS, the QP is IBV_QPS_RESET"):
        a.qp.post_recv(recv(a))
    with pytest.raises(VerbsRDMAError, match="post_send needs state RTS, the QP is IBV_QPS_RESET"):
        a.qp.post_send(send(a))
    a.qp.to_init(QPAttr(qp_access_flags=ALL_ACCESS))
    assert a.qp.qp_state == e.IBV_QPS_INIT
    a.qp.post_recv(recv(a, wr_id=77))  # allowed from INIT on, as in IB
    with pytest.raises(VerbsRDMAError, match="the QP is IBV_QPS_INIT"):
        a.qp.post_send(send(a))
    b.qp.to_init(QPAttr(qp_access_flags=ALL_ACCESS))
    a.qp.to_rtr(QPAttr(dest=b.qp.endpoint()))
    b.qp.to_rtr(QPAttr(dest=a.qp.endpoint()))
    assert a.qp.qp_state == e.IBV_QPS_RTR
    with pytest.raises(VerbsRDMAError, match="the QP is IBV_QPS_RTR"):
        a.qp.post_send(send(a))
    b.qp.to_rts(QPAttr())
    b.qp.post_send(send(b, wr_id=5))  # lands in the receive posted while `a` was in INIT
    assert [(w.wr_id, w.status) for w in a.wait()] == [(77, e.IBV_WC_SUCCESS)]
    a.qp.to_rts(QPAttr())
    assert a.qp.qp_state == e.IBV_QPS_RTS


@pytest.mark.parametrize(
    ("steps", "target"),
    [((), e.IBV_QPS_RTR), ((), e.IBV_QPS_RTS), ((e.IBV_QPS_INIT,), e.IBV_QPS_RTS)],
)
def test_invalid_transitions_are_refused(make_pair, steps, target):
    qp = make_pair(connected=False).a.qp
    for step in steps:
        qp.modify(QPAttr(qp_state=step))
    with pytest.raises(VerbsRDMAError, match=f"cannot go from .* to {target.name}"):
        qp.modify(QPAttr(qp_state=target))


def test_rtr_needs_the_peer_endpoint_and_sane_attributes(make_pair):
    qp = make_pair(connected=False).a.qp
    qp.to_init()
    with pytest.raises(VerbsError, match=r"needs attr\.dest"):
        qp.to_rtr(QPAttr())
    with pytest.raises(VerbsRDMAError, match=r"retry_cnt=9 is outside 0\.\.7"):
        qp.modify(QPAttr(qp_state=e.IBV_QPS_INIT, retry_cnt=9))


def test_to_err_flushes_posted_receives(pair):
    a = pair.a
    for i in range(3):
        a.qp.post_recv(recv(a, wr_id=i))
    a.qp.to_err()
    assert a.qp.qp_state == e.IBV_QPS_ERR
    assert [(w.wr_id, w.status) for w in a.wait(3)] == [(i, e.IBV_WC_WR_FLUSH_ERR) for i in range(3)]


def test_full_queues_refuse_with_enomem(make_pair):
    """The queues hold what the device granted (qp.cap: tcp grants what was asked, rxe rounds up)."""
    pair = make_pair(cap=QPCap(max_send_wr=4, max_recv_wr=2), connected=False)
    a, b = pair.a, pair.b
    granted = a.qp.cap
    assert granted.max_send_wr >= 4 and granted.max_recv_wr >= 2
    a.qp.to_init(QPAttr(qp_access_flags=ALL_ACCESS))
    for _ in range(granted.max_recv_wr):
        a.qp.post_recv(recv(a))
    with pytest.raises(VerbsRDMAError, match="receive queue full") as info:
        a.qp.post_recv(recv(a))
    assert info.value.error_code == errno.ENOMEM
    b.qp.to_init(QPAttr(qp_access_flags=ALL_ACCESS))  # the peer never gets to RTR: nothing is answered
    a.qp.to_rtr(QPAttr(dest=b.qp.endpoint()))
    a.qp.to_rts(QPAttr(timeout=18))
    for i in range(granted.max_send_wr):
        a.qp.post_send(send(a, wr_id=i))
    with pytest.raises(VerbsRDMAError, match="send queue full") as info:
        a.qp.post_send(send(a, wr_id=granted.max_send_wr))
    assert info.value.error_code == errno.ENOMEM


def test_too_many_sges_or_too_much_inline_is_refused(make_pair):
    """Past what the device granted (qp.cap: rxe grants more SGEs and inline space than asked)."""
    pair = make_pair(cap=QPCap(max_send_sge=2, max_inline_data=16))
    a = pair.a
    sges, inline = a.qp.cap.max_send_sge, a.qp.cap.max_inline_data
    assert sges >= 2 and inline >= 16
    sg = [SGE(a.mr.buf, 1, a.mr.lkey)] * (sges + 1)
    with pytest.raises(VerbsRDMAError, match=f"{sges + 1} SGEs, max_send_sge is {sges}"):
        a.qp.post_send(SendWR(opcode=e.IBV_WR_SEND, sg=sg))
    with pytest.raises(VerbsRDMAError, match=f"max_inline_data is {inline}"):
        a.qp.post_send(
            SendWR(
                opcode=e.IBV_WR_SEND, sg=[SGE(a.mr.buf, inline + 1, a.mr.lkey)], send_flags=e.IBV_SEND_INLINE
            )
        )


def test_cq_overflow_is_reported_and_the_qp_goes_to_err(make_pair):
    pair = make_pair(cqe=4)
    a, b = pair.a, pair.b
    for i in range(8):
        a.qp.post_send(
            SendWR(wr_id=i, opcode=e.IBV_WR_RDMA_WRITE, sg=[], remote_addr=b.mr.buf, rkey=b.mr.rkey)
        )
    deadline = time.monotonic() + 5
    while a.qp.qp_state != e.IBV_QPS_ERR and time.monotonic() < deadline:
        time.sleep(0.01)
    assert a.qp.qp_state == e.IBV_QPS_ERR
    with pytest.raises(CQOverflowError, match="CQ overflow"):
        a.cq.poll(1)


def test_device_list_and_unknown_device(fabric):
    names = [device.name for device in get_device_list()]
    assert set(fabric.devices) <= set(names)
    with pytest.raises(VerbsError, match="no RDMA device 'no_such_dev'") as info:
        Context(name="no_such_dev")
    assert "\n" not in str(info.value)


def test_the_device_states_its_limits(contexts, max_sge):
    for ctx in contexts:
        attr = ctx.query_device()
        assert attr.max_cqe >= 1024 and attr.max_qp_wr >= 1024 and attr.max_sge >= max_sge >= 1


def wait_port(ctx: Context, state: e.ibv_port_state, timeout: float) -> e.ibv_port_state:
    deadline = time.monotonic() + timeout
    while ctx.query_port().state != state and time.monotonic() < deadline:
        time.sleep(0.05)
    return ctx.query_port().state


def test_the_port_goes_down_with_its_link_and_comes_back(contexts, link):
    """What the failover layer asks when a status may be the application's or the link's (LOC_QP_OP_ERR)."""
    ctx = contexts[0]
    assert ctx.query_port().state == e.IBV_PORT_ACTIVE
    link.down()
    assert wait_port(ctx, e.IBV_PORT_DOWN, 10) == e.IBV_PORT_DOWN
    link.restore()
    assert wait_port(ctx, e.IBV_PORT_ACTIVE, 30) == e.IBV_PORT_ACTIVE


def test_endpoint_round_trips_through_json(pair):
    ep = pair.a.qp.endpoint()
    assert Endpoint.from_json(ep.to_json()) == ep
    assert ep.qpn == pair.a.qp.qp_num
    assert ep.gid == pair.a.ctx.query_gid()
    assert ep.gid.startswith("::ffff:")


def test_a_qp_can_be_reset_and_connected_again(pair):
    a, b = pair.a, pair.b
    for side in (a, b):
        side.qp.modify(QPAttr(qp_state=e.IBV_QPS_RESET))
        assert side.qp.qp_state == e.IBV_QPS_RESET
    pair.connect()
    b.qp.post_recv(recv(b, wr_id=3))
    a.qp.post_send(send(a, wr_id=4))
    assert [(w.wr_id, w.status) for w in b.wait()] == [(3, e.IBV_WC_SUCCESS)]
