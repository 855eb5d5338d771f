"""Without shiftd a ShiftContext is a plain context: it says why once, and its QPs behave as plain QPs
(signaling, errors and queue limits as the verbs API has them)."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Iterator

import pytest

from libshift.shift import ShiftCompChannel, ShiftContext, ShiftCQ, ShiftMR, ShiftPD, ShiftQP, State
from libshift.verbs import SGE, QPAttr, QPInitAttr, RecvWR, SendWR, VerbsRDMAError
from libshift.verbs import enums as e
from shiftlab.veth import VethPair

pytestmark = [pytest.mark.lab, pytest.mark.timeout(60)]
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE


@pytest.fixture
def devices(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[None]:
    with VethPair(f"fo{os.getpid() % 100000}", subnet="198.18.92") as pair:
        monkeypatch.setenv("SHIFT_TCP_DEVICES", pair.tcp_devices("fo_a", "fo_b"))
        monkeypatch.setenv("SHIFT_SOCKET", str(tmp_path / "no-shiftd.sock"))
        yield


class End:
    def __init__(self, device: str, block: bool = False) -> None:
        self.ctx = ShiftContext(name=device)
        self.pd = ShiftPD(self.ctx)
        self.channel = ShiftCompChannel(self.ctx) if block else None
        self.cq = ShiftCQ(self.ctx, 16, channel=self.channel)
        self.mr = ShiftMR(self.pd, 4096, ACCESS)
        self.qp = ShiftQP(self.pd, QPInitAttr(scq=self.cq, rcq=self.cq))

    def wait(self, timeout: float = 5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            count, wcs = self.cq.poll(1)
            if count:
                return wcs[0]
        raise AssertionError("no completion")


def test_without_shiftd_it_is_a_plain_context_and_says_so_once(
    devices: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="libshift.shift")
    a, b, again = End("fo_a"), End("fo_b"), ShiftContext(name="fo_a")
    try:
        assert not a.ctx.resilient and not again.resilient
        said = [r.getMessage() for r in caplog.records if r.name == "libshift.shift"]
        assert said.count("fo_a: no failover (no shiftd to tell it about NIC failures and peers' backups); "
                          "running as a plain context") == 1  # fmt: skip
        for one, other in ((a, b), (b, a)):
            one.qp.connect(other.qp.endpoint(), QPAttr(qp_access_flags=ACCESS))
            assert one.qp.state == State.PLAIN

        b.qp.post_recv(RecvWR(wr_id=7, sg=[SGE(b.mr.buf, 64, b.mr.lkey)]))
        a.mr.write(b"hello, plain world")
        a.qp.post_send(SendWR(wr_id=1, sg=[SGE(a.mr.buf, 18, a.mr.lkey)]))
        sent = a.wait()
        assert (sent.wr_id, sent.status) == (1, e.IBV_WC_SUCCESS), sent
        got = b.wait()
        assert (got.wr_id, got.status, got.byte_len) == (7, e.IBV_WC_SUCCESS, 18)
        assert b.mr.read(18) == b"hello, plain world"

        # an unsignaled SEND completes silently; the signaled one after it is the only completion
        for wr_id in (10, 11):
            b.qp.post_recv(RecvWR(wr_id=wr_id, sg=[SGE(b.mr.buf, 64, b.mr.lkey)]))
        a.qp.post_send(SendWR(wr_id=3, sg=[SGE(a.mr.buf, 8, a.mr.lkey)], send_flags=0))
        a.qp.post_send(SendWR(wr_id=4, sg=[SGE(a.mr.buf, 8, a.mr.lkey)]))
        assert a.wait().wr_id == 4
        assert [b.wait().wr_id, b.wait().wr_id] == [10, 11]

        bad = SendWR(wr_id=2, opcode=e.IBV_WR_RDMA_WRITE, sg=[SGE(a.mr.buf, 8, a.mr.lkey)])
        bad.set_wr_rdma(b.mr.rkey ^ 1, b.mr.buf)  # the application's mistake reaches the application
        a.qp.post_send(bad)
        wc = a.wait()
        assert (wc.wr_id, wc.status) == (2, e.IBV_WC_REM_ACCESS_ERR)
        assert a.qp.state == State.BROKEN
    finally:
        for ctx in (a.ctx, b.ctx, again):
            ctx.close()


def test_a_full_receive_queue_is_refused_as_ibverbs_does(devices: None) -> None:
    a = End("fo_a")
    try:
        a.qp.to_init(QPAttr(qp_access_flags=ACCESS))
        for wr_id in range(a.qp.cap.max_recv_wr):
            a.qp.post_recv(RecvWR(wr_id=wr_id))
        with pytest.raises(VerbsRDMAError, match="receive queue full") as refused:
            a.qp.post_recv(RecvWR(wr_id=999))
        assert refused.value.error_code == errno.ENOMEM
    finally:
        a.ctx.close()


def test_a_completion_channel_wakes_a_blocked_waiter(devices: None) -> None:
    a, b = End("fo_a"), End("fo_b", block=True)
    try:
        for one, other in ((a, b), (b, a)):
            one.qp.connect(other.qp.endpoint(), QPAttr(qp_access_flags=ACCESS))
        b.qp.post_recv(RecvWR(wr_id=5, sg=[SGE(b.mr.buf, 64, b.mr.lkey)]))
        assert b.channel is not None
        b.cq.req_notify()
        with pytest.raises(TimeoutError):
            b.channel.get_cq_event(timeout=0.2)  # nothing has come yet
        threading.Timer(
            0.2, lambda: a.qp.post_send(SendWR(wr_id=1, sg=[SGE(a.mr.buf, 8, a.mr.lkey)]))
        ).start()
        started = time.monotonic()
        assert b.channel.get_cq_event(timeout=5) is b.cq  # no poll by anyone on b's side: the watcher did it
        assert 0.15 < time.monotonic() - started < 2
        count, wcs = b.cq.poll(4)
        assert (count, wcs[0].wr_id, wcs[0].status) == (1, 5, e.IBV_WC_SUCCESS)
        assert a.wait().wr_id == 1
        with pytest.raises(VerbsRDMAError, match="needs a CQ created with a completion channel"):
            a.cq.req_notify()
    finally:
        for ctx in (a.ctx, b.ctx):
            ctx.close()


def test_a_closed_channel_leaves_no_descriptor_and_wakes_no_one(devices: None) -> None:
    """A ShiftCompChannel owns an eventfd in the core (fast_chan.c): close() gives it back, and a wait on the
    closed channel returns at once (TimeoutError) instead of waiting."""
    ctx = ShiftContext(name="fo_a")
    try:
        before = len(os.listdir("/proc/self/fd"))
        channel = ShiftCompChannel(ctx)
        assert len(os.listdir("/proc/self/fd")) == before + 1
        channel.close()
        assert len(os.listdir("/proc/self/fd")) == before
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            channel.get_cq_event(timeout=5)
        assert time.monotonic() - started < 1
    finally:
        ctx.close()
