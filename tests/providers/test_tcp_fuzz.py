"""Fuzz the tcp provider's responder with malformed frames and wrong keys, from a raw socket on the peer host.

Whatever arrives, the core must survive (no failed pass of its progress, other QPs still served), and no byte
may change outside the one MR that grants remote write.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from veth_contexts import veth_contexts

from libshift.core import wire
from libshift.netns import in_netns
from libshift.verbs import CQ, MR, PD, QP, SGE, Context, Endpoint, QPAttr, QPInitAttr, RecvWR, SendWR
from libshift.verbs import enums as e
from shiftlab.veth import VethPair

pytestmark = pytest.mark.lab

ALL = e.ALL_ACCESS
MR_SIZE = 4096
PSN = 1000


@dataclass
class Target:
    """The responder under fuzz: one writable MR, one MR without remote write, one MR of another PD."""

    fabric: VethPair
    ctx: Context
    peer_ctx: Context
    pd: PD
    cq: CQ
    rw: MR
    ro: MR
    other: MR


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    with veth_contexts("vxf", "198.18.93") as (fabric, peer_ctx, ctx):
        pd = PD(ctx)
        made = Target(
            fabric,
            ctx,
            peer_ctx,
            pd,
            CQ(ctx, 100000),
            MR(pd, MR_SIZE, ALL),
            MR(pd, MR_SIZE, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ),
            MR(PD(ctx), MR_SIZE, ALL),
        )
        made.ro.write(b"\xa5" * MR_SIZE)
        made.other.write(b"\x5a" * MR_SIZE)
        yield made


USUALLY = st.sampled_from((True,) * 5 + (False,))  # five times in six, so most frames reach the checks


@st.composite
def stream_of_frames(draw: st.DrawFn, t: Target) -> list[bytes]:
    """Frames in sequence with hostile fields (ops, keys, addresses, lengths), some cut short or garbage."""
    bases = [t.rw, t.rw, t.ro, t.other]
    requests = [wire.Op.WRITE, wire.Op.WRITE, *sorted(wire.REQUESTS)]

    def mostly(usual: st.SearchStrategy, odd: st.SearchStrategy) -> object:
        return draw(usual) if draw(USUALLY) else draw(odd)

    out = []
    for index in range(draw(st.integers(0, 10))):
        if not draw(USUALLY):
            out.append(draw(st.binary(max_size=100)))
            continue
        mr = draw(st.sampled_from(bases))
        length = mostly(st.integers(0, 200), st.integers(0, 2**32 - 1))
        magic = mostly(st.just(wire.MAGIC), st.integers(0, 255))
        packed = wire.pack_header(
            mostly(st.sampled_from(requests), st.integers(0, 255)),
            mostly(st.just(PSN + index), st.integers(0, 2**32 - 1)),
            length,
            flags=draw(st.integers(0, 0xFFFF)),
            rkey=mostly(st.just(mr.rkey), st.integers(0, 2**32 - 1)),
            imm=draw(st.integers(0, 2**32 - 1)),
            addr=mostly(
                st.integers(-64, MR_SIZE + 64).map(lambda off, mr=mr: mr.buf + off), st.integers(0, 2**64 - 1)
            ),
            arg1=draw(st.integers(0, 2**64 - 1)),
            arg2=draw(st.integers(0, 2**64 - 1)),
            ack=draw(st.integers(0, 2**32 - 1)),
        )
        header = bytes([magic]) + packed[1:]  # the core packs its own magic: a hostile one replaces it
        sent = min(length, 300)
        frame = header + draw(st.binary(min_size=sent, max_size=sent))
        out.append(frame[: mostly(st.just(len(frame)), st.integers(0, len(frame)))])
    return out


def fuzz_once(t: Target, stream: list[bytes], hello_ok: bool) -> str:
    """Connect like a peer QP, send the stream, close, and wait for the responder to close too."""
    host = t.fabric.hosts[0]
    with in_netns(host.netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host.address, 0))
    peer_qpn = 7  # below any QPN the core gives (a port << 8): the peer is the side that connects
    qp = QP(t.pd, QPInitAttr(scq=t.cq, rcq=t.cq))
    try:
        qp.to_init(QPAttr(qp_access_flags=ALL))
        qp.to_rtr(QPAttr(dest=Endpoint(f"::ffff:{host.address}", peer_qpn, PSN)))
        qp.to_rts(QPAttr())
        for i in range(3):
            qp.post_recv(RecvWR(wr_id=i, sg=[SGE(t.rw.buf + 64 * i, 64, t.rw.lkey)]))
        sock.settimeout(5)
        sock.connect((t.fabric.hosts[1].address, qp.qp_num >> 8))
        hello = wire.pack_header(wire.Op.HELLO, peer_qpn if hello_ok else peer_qpn + 1, imm=qp.qp_num)
        try:
            sock.sendall(hello + b"".join(stream))
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass  # acks and NAKs; the responder closes when it has read everything
        except TimeoutError:
            raise
        except OSError:
            pass  # the responder dropped the stream (reset): a fine answer to garbage
        return qp.qp_state.name
    finally:
        sock.close()
        qp.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), hello_ok=USUALLY)
def test_responder_survives_malformed_frames_and_wrong_keys(
    target: Target, data: st.DataObject, hello_ok: bool
):
    stream = data.draw(stream_of_frames(target), label="frames")
    ro, other, rw = target.ro.read(MR_SIZE), target.other.read(MR_SIZE), target.rw.read(MR_SIZE)
    state = fuzz_once(target, stream, hello_ok)
    event(f"QP ends in {state}")  # --hypothesis-show-statistics: what the examples reached
    event("writable MR changed" if target.rw.read(MR_SIZE) != rw else "writable MR unchanged")
    assert state in {"IBV_QPS_RTS", "IBV_QPS_ERR"}
    assert target.ro.read(MR_SIZE) == ro == b"\xa5" * MR_SIZE
    assert target.other.read(MR_SIZE) == other == b"\x5a" * MR_SIZE
    assert target.ctx.impl.core.failures == 0  # no pass of the core's progress failed


def test_engine_still_serves_after_fuzzing(target: Target) -> None:
    """A real QP pair on the same (fuzzed) context still moves data."""
    sides = []
    for ctx in (target.peer_ctx, target.ctx):
        pd = PD(ctx)
        cq = CQ(ctx, 16)
        sides.append((cq, QP(pd, QPInitAttr(scq=cq, rcq=cq)), MR(pd, 64, ALL)))
    (_, qa, ma), (cqb, qb, mb) = sides
    for qp, peer in ((qa, qb), (qb, qa)):
        qp.connect(peer.endpoint(), QPAttr(qp_access_flags=ALL))
    ma.write(b"still alive")
    qb.post_recv(RecvWR(wr_id=1, sg=[SGE(mb.buf, 64, mb.lkey)]))
    qa.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND, sg=[SGE(ma.buf, 11, ma.lkey)]))
    deadline = time.monotonic() + 5
    got: list = []
    while not got and time.monotonic() < deadline:
        got = cqb.poll(1)[1]
        time.sleep(0.005)
    assert [w.status for w in got] == [e.IBV_WC_SUCCESS]
    assert mb.read(11) == b"still alive"
    for _cq, qp, mr in sides:
        qp.close()
        mr.close()
