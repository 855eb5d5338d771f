"""Who drives a tcp context's progress: the core's progress thread, whatever the application does.

While the application makes no call, the peer's READs and WRITEs are still answered; two threads waiting on
channels of one context are each served, one after the other; and a completion made on another thread (a
flush) ends a channel wait at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from veth_contexts import veth_contexts

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


def test_the_progress_thread_serves_the_peer_while_the_application_is_away(make_pair) -> None:
    a, b = make_pair()
    b.qp.post_recv(RecvWR(wr_id=1, sg=b.sge(8)))
    a.qp.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND, sg=a.sge(8), send_flags=0))
    assert b.wait().status == e.IBV_WC_SUCCESS
    b.mr.write(b"read me!", offset=512)
    a.mr.write(b"written!", offset=1024)
    # From now on nothing calls into context B: its progress thread must answer the READ and the WRITE.
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


def test_two_threads_waiting_on_one_context_are_each_served(make_pair) -> None:
    (a1, b1), (a2, b2) = make_pair(), make_pair()  # b1 and b2 share context B
    for b in (b1, b2):
        b.qp.post_recv(RecvWR(wr_id=7, sg=b.sge(8)))
    results: dict[str, WC] = {}

    def waiter(name: str, side: End) -> None:
        results[name] = side.wait(timeout=5)

    threads = [threading.Thread(target=waiter, args=(n, s)) for n, s in (("b1", b1), ("b2", b2))]
    for thread in threads:
        thread.start()
    time.sleep(0.1)  # both wait now, each on its own channel of context B
    a1.qp.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND, sg=a1.sge(8), send_flags=0))
    threads[0].join(timeout=5)
    time.sleep(0.1)  # b1's thread has left; b2's thread waits on alone
    a2.qp.post_send(SendWR(wr_id=2, opcode=e.IBV_WR_SEND, sg=a2.sge(8), send_flags=0))
    threads[1].join(timeout=5)
    assert {name: (wc.wr_id, wc.status) for name, wc in results.items()} == {
        "b1": (7, e.IBV_WC_SUCCESS),
        "b2": (7, e.IBV_WC_SUCCESS),
    }


def test_a_completion_made_by_another_thread_ends_a_channel_wait(make_pair) -> None:
    a, _b = make_pair()
    a.qp.post_recv(RecvWR(wr_id=3, sg=a.sge(8)))
    a.cq.req_notify()
    to_err = threading.Timer(0.2, a.qp.to_err)  # flushes the receive from another thread
    to_err.start()
    started = time.monotonic()
    a.channel.get_cq_event(timeout=5)
    waited = time.monotonic() - started
    to_err.join()
    assert [(wc.wr_id, wc.status) for wc in a.cq.poll(4)[1]] == [(3, e.IBV_WC_WR_FLUSH_ERR)]
    assert 0.15 <= waited < 1.0
