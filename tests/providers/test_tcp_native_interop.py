"""The native engine (the C core) and the interpreted one speak the same wire: a QP of each, connected.

Both Contexts are on the loopback device, one opened with SHIFT_TCP_ENGINE=native and one without, so every
frame the C core sends is parsed by wire.py and the other way round.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from libshift.providers.tcp.native import NativeContext
from libshift.verbs import CQ, MR, PD, QP, SGE, WC, Context, QPAttr, QPInitAttr, RecvWR, SendWR
from libshift.verbs import enums as e


@dataclass
class End:
    ctx: Context
    cq: CQ
    qp: QP
    mr: MR

    def sge(self, offset: int, length: int) -> SGE:
        return SGE(self.mr.buf + offset, length, self.mr.lkey)

    def wait(self, timeout: float = 5.0) -> WC:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _, wcs = self.cq.poll(1)
            if wcs:
                return wcs[0]
            time.sleep(0.0005)
        raise AssertionError("no completion")


def _end(name: str) -> End:
    ctx = Context(name=name)
    pd = PD(ctx)
    cq = CQ(ctx, 64)
    return End(ctx, cq, QP(pd, QPInitAttr(scq=cq, rcq=cq)), MR(pd, 4096, e.ALL_ACCESS))


@pytest.fixture
def ends(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[End, End]]:
    monkeypatch.setenv("SHIFT_TCP_DEVICES", "native_lo=lo,python_lo=lo")
    monkeypatch.setenv("SHIFT_TCP_ENGINE", "native")
    native = _end("native_lo")
    monkeypatch.delenv("SHIFT_TCP_ENGINE")
    python = _end("python_lo")
    assert isinstance(native.ctx.impl, NativeContext) and not isinstance(python.ctx.impl, NativeContext)
    for end, peer in ((native, python), (python, native)):
        end.qp.to_init(QPAttr(qp_access_flags=e.ALL_ACCESS))
        end.qp.to_rtr(QPAttr(dest=peer.qp.endpoint()))
    for end in (native, python):
        end.qp.to_rts(QPAttr())
    yield native, python
    for end in (native, python):
        end.qp.close()
        end.mr.close()
        end.ctx.close()


@pytest.mark.parametrize("direction", ["native to python", "python to native"])
def test_send_write_read_and_atomic_cross_the_engines(ends: tuple[End, End], direction: str) -> None:
    a, b = ends if direction == "native to python" else ends[::-1]
    a.mr.write(b"across the engines")
    b.qp.post_recv(RecvWR(wr_id=9, sg=[b.sge(0, 64)]))
    a.qp.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND_WITH_IMM, sg=[a.sge(0, 18)], imm_data=77))
    assert a.wait().wr_id == 1
    got = b.wait()
    assert (got.wr_id, got.status, got.byte_len, got.imm_data) == (9, e.IBV_WC_SUCCESS, 18, 77)
    assert b.mr.read(18) == b"across the engines"

    target = b.mr.buf + 1024
    a.qp.post_send(
        SendWR(wr_id=2, opcode=e.IBV_WR_RDMA_WRITE, sg=[a.sge(0, 18)], remote_addr=target, rkey=b.mr.rkey)
    )
    assert a.wait().status == e.IBV_WC_SUCCESS
    assert b.mr.read(18, 1024) == b"across the engines"

    a.qp.post_send(
        SendWR(wr_id=3, opcode=e.IBV_WR_RDMA_READ, sg=[a.sge(2048, 18)], remote_addr=target, rkey=b.mr.rkey)
    )
    assert a.wait().status == e.IBV_WC_SUCCESS
    assert a.mr.read(18, 2048) == b"across the engines"

    b.mr.write((40).to_bytes(8, "little"), offset=3072)
    a.qp.post_send(
        SendWR(
            wr_id=4,
            opcode=e.IBV_WR_ATOMIC_FETCH_AND_ADD,
            sg=[a.sge(3072, 8)],
            remote_addr=b.mr.buf + 3072,
            rkey=b.mr.rkey,
            compare_add=2,
        )
    )
    assert a.wait().status == e.IBV_WC_SUCCESS
    assert int.from_bytes(a.mr.read(8, 3072), "little") == 40
    assert int.from_bytes(b.mr.read(8, 3072), "little") == 42


@pytest.mark.parametrize("direction", ["native to python", "python to native"])
def test_a_bad_rkey_is_rem_access_err_across_the_engines(ends: tuple[End, End], direction: str) -> None:
    a, b = ends if direction == "native to python" else ends[::-1]
    before = b.mr.read(4096)
    a.qp.post_send(
        SendWR(
            wr_id=5, opcode=e.IBV_WR_RDMA_WRITE, sg=[a.sge(0, 16)], remote_addr=b.mr.buf, rkey=b.mr.rkey ^ 1
        )
    )
    got = a.wait()
    assert (got.wr_id, got.status) == (5, e.IBV_WC_REM_ACCESS_ERR)
    assert a.qp.qp_state == e.IBV_QPS_ERR
    assert b.mr.read(4096) == before
