"""Who drives the tcp provider's progress: the thread that waits for a completion, else the engine's thread.

A thread blocked in get_cq_event leads its context's engine (waits in epoll and dispatches), so its
completion is made on its own thread; another thread waiting meanwhile is served too and takes over the lead
when the first leaves; and when the application stops calling into the library, the engine's own thread
resumes, so a peer's requests are still answered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from veth_contexts import veth_contexts

from libshift.providers.tcp.engine import GRACE
from libshift.verbs import (
    CQ,
    MR,
    PD,
    QP,
    SGE,
    WC,
    CompChannel,
    Context,
    QPAttr,
    QPInitAttr,
    RecvWR,
    SendWR,
)
from libshift.verbs import enums as e

pytestmark = pytest.mark.lab

ALL = e.ALL_ACCESS


@pytest.fixture(scope="module")
def contexts() -> Iterator[tuple[Context, Context]]:
    with veth_contexts("lt3", "198.18.99") as (_, a, b):
        yield a, b


@dataclass
class End:
    channel: CompChannel
    cq: CQ
    qp: QP
    mr: MR

    def sge(self, length: int, offset: int = 0) -> list[SGE]:
        return [SGE(self.mr.buf + offset, length, self.mr.lkey)]

    def wait(self, timeout: float = 5.0) -> WC:
        """One completion, blocking on the channel (get_cq_event) between polls."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.cq.poll(1)[1]
            if got:
                return got[0]
            self.cq.req_notify()
            got = self.cq.poll(1)[1]
            if got:
                return got[0]
            self.channel.get_cq_event(timeout=max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        for obj in (self.qp, self.mr, self.cq, self.channel):
            obj.close()


def end(ctx: Context, pd: PD) -> End:
    channel = CompChannel(ctx)
    cq = CQ(ctx, 64, channel=channel)
    return End(channel, cq, QP(pd, QPInitAttr(scq=cq, rcq=cq)), MR(pd, 4096, ALL))


@pytest.fixture
def make_pair(contexts: tuple[Context, Context]) -> Iterator:
    """make_pair() -> (a, b): two connected QPs, a on context A and b on context B, each with a channel."""
    made: list[End] = []
    pds = [PD(ctx) for ctx in contexts]

    def make() -> tuple[End, End]:
        a, b = end(contexts[0], pds[0]), end(contexts[1], pds[1])
        for one, other in ((a, b), (b, a)):
            one.qp.connect(other.qp.endpoint(), QPAttr(qp_access_flags=ALL))
        made.extend((a, b))
        return a, b

    yield make
    for one in made:
        one.close()
    for pd in pds:
        pd.close()


def pushed_on(side: End) -> list[int]:
    """The threads that pushed completions to side's CQ, recorded as they are pushed."""
    threads: list[int] = []
    push = side.cq.impl.push

    def recording(wc: WC, solicited: bool = False) -> bool:
        threads.append(threading.get_ident())
        return push(wc, solicited)

    side.cq.impl.push = recording  # type: ignore[method-assign]
    return threads


@contextmanager
def stretched_grace(end: End, seconds: float) -> Iterator[None]:
    """Keep end's engine thread off epoll for `seconds` after the application's last call, so that a loaded
    machine, which may not run the application's thread for milliseconds, cannot hand the engine thread the
    work a test expects of the application's thread; afterwards the engine thread takes the usual GRACE."""
    engine = end.qp.impl.engine
    engine.grace = seconds
    try:
        yield
    finally:
        engine.grace = GRACE
        engine.wake()  # it may be parked for the stretched time: let it look again


def test_the_waiting_thread_makes_its_own_completion(make_pair) -> None:
    a, b = make_pair()
    threads = pushed_on(b)
    with stretched_grace(b, 1.0):
        for n in range(5):
            b.qp.post_recv(RecvWR(wr_id=n, sg=b.sge(8)))
            a.mr.write(b"msg %4d" % n)

            def send_later(n: int = n) -> None:
                time.sleep(0.05)  # after b's thread is blocked in get_cq_event
                a.qp.post_send(SendWR(wr_id=n, opcode=e.IBV_WR_SEND, sg=a.sge(8), send_flags=0))

            sender = threading.Thread(target=send_later)
            sender.start()
            wc = b.wait()
            sender.join()
            assert (wc.wr_id, wc.status, wc.opcode) == (n, e.IBV_WC_SUCCESS, e.IBV_WC_RECV)
            assert b.mr.read(8) == b"msg %4d" % n
    assert threads == [threading.get_ident()] * 5


def test_a_polling_thread_makes_its_own_completions() -> None:
    """A poll counts as the application being there: the engine thread, which led while nobody called in,
    leaves epoll for GRACE (stretched here, so that a loaded machine cannot make the poller look away), and
    the poller's own passes read, place and complete. The wake-up that makes the engine thread leave must
    survive the poller's pass over the same epoll set, which sees the wake-up's eventfd too."""
    with veth_contexts("lt4", "198.18.98") as (_, ctx_a, ctx_b):
        pd_a, pd_b = PD(ctx_a), PD(ctx_b)
        a, b = end(ctx_a, pd_a), end(ctx_b, pd_b)
        for one, other in ((a, b), (b, a)):
            one.qp.connect(other.qp.endpoint(), QPAttr(qp_access_flags=ALL))
        engine = b.qp.impl.engine
        with stretched_grace(b, 2.0):
            time.sleep(2.1)  # nobody called into B for GRACE: its engine thread leads, waiting in epoll
            threads = pushed_on(b)
            b.qp.post_recv(RecvWR(wr_id=1, sg=b.sge(8)))
            assert engine._leader == engine._ident  # (private state: what this test is about)
            assert b.cq.poll(1)[1] == []  # one poll: the engine thread is told to step aside for GRACE
            deadline = time.monotonic() + 1
            while engine._leader and time.monotonic() < deadline:
                time.sleep(1e-3)
            assert not engine._leader
            a.mr.write(b"by poll!")
            a.qp.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND, sg=a.sge(8), send_flags=0))
            time.sleep(0.1)  # the message is in B's socket; an engine thread still in epoll would take it now
            deadline = time.monotonic() + 5
            while not (got := b.cq.poll(1)[1]) and time.monotonic() < deadline:
                time.sleep(1e-4)
            assert [(wc.wr_id, wc.status) for wc in got] == [(1, e.IBV_WC_SUCCESS)]
            assert b.mr.read(8) == b"by poll!"
            assert threads == [threading.get_ident()]
        for one in (a, b):
            one.close()
        for pd in (pd_a, pd_b):
            pd.close()


def test_the_engine_thread_serves_the_peer_while_the_application_is_away(make_pair) -> None:
    a, b = make_pair()
    b.qp.post_recv(RecvWR(wr_id=1, sg=b.sge(8)))
    a.qp.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND, sg=a.sge(8), send_flags=0))
    assert b.wait().status == e.IBV_WC_SUCCESS  # b's thread led its engine a moment ago
    b.mr.write(b"read me!", offset=512)
    a.mr.write(b"written!", offset=1024)
    # From now on nothing calls into context B: its engine thread must answer the READ and the WRITE.
    for opcode, offset, expect in ((e.IBV_WR_RDMA_READ, 512, 512), (e.IBV_WR_RDMA_WRITE, 1024, 1024)):
        a.qp.post_send(
            SendWR(
                wr_id=opcode,
                opcode=opcode,
                sg=a.sge(8, offset),
                remote_addr=b.mr.buf + expect,
                rkey=b.mr.rkey,
            )
        )
        wc = a.wait(timeout=5)
        assert (wc.wr_id, wc.status) == (opcode, e.IBV_WC_SUCCESS)
    assert a.mr.read(8, 512) == b"read me!"
    assert b.mr.read(8, 1024) == b"written!"


def test_a_second_waiting_thread_is_served_and_takes_over_the_lead(make_pair) -> None:
    (a1, b1), (a2, b2) = make_pair(), make_pair()  # b1 and b2 share context B
    for b in (b1, b2):
        b.qp.post_recv(RecvWR(wr_id=7, sg=b.sge(8)))
    results: dict[str, WC] = {}

    def waiter(name: str, side: End) -> None:
        results[name] = side.wait(timeout=5)

    threads = [threading.Thread(target=waiter, args=(n, s)) for n, s in (("b1", b1), ("b2", b2))]
    for thread in threads:
        thread.start()
    time.sleep(0.1)  # both wait now: one leads B's engine, the other follows
    a1.qp.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND, sg=a1.sge(8), send_flags=0))
    threads[0].join(timeout=5)
    time.sleep(0.1)  # b1's thread has left; b2's thread waits on alone
    a2.qp.post_send(SendWR(wr_id=2, opcode=e.IBV_WR_SEND, sg=a2.sge(8), send_flags=0))
    threads[1].join(timeout=5)
    assert {name: (wc.wr_id, wc.status) for name, wc in results.items()} == {
        "b1": (7, e.IBV_WC_SUCCESS),
        "b2": (7, e.IBV_WC_SUCCESS),
    }


def test_a_completion_made_by_another_thread_wakes_the_leader(make_pair) -> None:
    a, _b = make_pair()
    a.qp.post_recv(RecvWR(wr_id=3, sg=a.sge(8)))
    a.cq.req_notify()
    to_err = threading.Timer(0.2, a.qp.to_err)  # flushes the receive from another thread
    to_err.start()
    started = time.monotonic()
    a.channel.get_cq_event(timeout=5)  # leads A's engine: epoll, not the condition
    waited = time.monotonic() - started
    to_err.join()
    assert [(wc.wr_id, wc.status) for wc in a.cq.poll(4)[1]] == [(3, e.IBV_WC_WR_FLUSH_ERR)]
    assert 0.15 <= waited < 1.0
