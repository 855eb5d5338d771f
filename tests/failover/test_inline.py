"""Inline sends survive a replay: a send posted with IBV_SEND_INLINE carries the bytes its buffer held when it
was posted, even when a switch of path posts it again after the application has reused the buffer (ibverbs
allows that as soon as post_send returns).

One lab host with two NICs and its shiftd. This process opens the host's devices itself (their sockets in the
host's namespace: SHIFT_TCP_DEVICES `name=netdev@netns`) and one ShiftContext, with two of its QPs connected
to each other. The receiving QP has no receive posted, so the inline sends wait for one (RNR, rnr_retry 7:
for ever) while `shiftctl fail-nic mlx5_0` moves both QPs to the backup; only then do the receives come.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from labs import on_lab_host, running_lab
from stream_harness import fail_nic, recover_nic, wait_all_up
from waiting import wait_until

from libshift.shift import ShiftContext, ShiftCQ, ShiftMR, ShiftPD, ShiftQP, State
from libshift.verbs import SGE, WC, QPAttr, QPCap, QPInitAttr, RecvWR, SendWR, VerbsRDMAError
from libshift.verbs import enums as e
from shiftlab.lab import Lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120)]

ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
SIZE = 64  # each message, and the QPs' max_inline_data
COUNT = 40  # messages in flight across the switch: more than one chunk of the inline pool
INLINE = e.IBV_SEND_SIGNALED | e.IBV_SEND_INLINE
OK = e.IBV_WC_SUCCESS


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with running_lab("il", hosts=1, nics=2) as lab:
        yield lab


def message(n: int) -> bytes:
    return n.to_bytes(4, "little") * (SIZE // 4)


class Pair:
    """QP `a` sends inline from the one buffer `src`; QP `b` (same context) receives message n at dst + n."""

    def __init__(self) -> None:
        self.ctx = ShiftContext(name="mlx5_0")
        pd = ShiftPD(self.ctx)
        self.src, self.dst = ShiftMR(pd, 2 * SIZE, ACCESS), ShiftMR(pd, (COUNT + 1) * SIZE, ACCESS)
        self.cq_a, self.cq_b = ShiftCQ(self.ctx, 2 * COUNT), ShiftCQ(self.ctx, 2 * COUNT)
        cap = QPCap(max_send_wr=COUNT, max_recv_wr=COUNT + 1, max_inline_data=SIZE)
        self.a = ShiftQP(pd, QPInitAttr(scq=self.cq_a, rcq=self.cq_a, cap=cap))
        self.b = ShiftQP(pd, QPInitAttr(scq=self.cq_b, rcq=self.cq_b, cap=cap))
        attr = {"qp_access_flags": ACCESS, "min_rnr_timer": 24}  # RNR waits of 41 ms: few retries while held
        self.a.connect(self.b.endpoint(), QPAttr(**attr))
        self.b.connect(self.a.endpoint(), QPAttr(**attr))

    def send(self, n: int, length: int = SIZE) -> None:
        """Post message n inline (odd ones gathered from two SGEs), then reuse the buffer at once."""
        self.src.write(message(n))
        cut = 24 if n % 2 else length
        sg = [SGE(self.src.buf, cut, self.src.lkey), SGE(self.src.buf + cut, length - cut, self.src.lkey)]
        self.a.post_send(SendWR(wr_id=n, sg=sg[: 1 + n % 2], send_flags=INLINE))
        self.src.write(b"\xee" * SIZE)

    def receive(self, n: int) -> None:
        self.b.post_recv(RecvWR(wr_id=n, sg=[SGE(self.dst.buf + n * SIZE, SIZE, self.dst.lkey)]))


def completions(cq: ShiftCQ, count: int, timeout: float = 20.0) -> list[WC]:
    got: list[WC] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += cq.poll(count - len(got))[1]
    return got


@pytest.fixture
def nic(lab: Lab) -> Iterator[Callable[[], None]]:
    """Calling it fails mlx5_0 of h0 (`shiftctl fail-nic`); recovered after the test's context is closed."""
    wait_all_up(lab)
    yield lambda: fail_nic(lab, ["h0"], "mlx5_0")
    recover_nic(lab, ["h0"], ["mlx5_0"])


@pytest.fixture
def pair(lab: Lab, nic: Callable[[], None]) -> Iterator[Pair]:
    with on_lab_host(lab):
        pair = Pair()
        try:
            assert pair.ctx.resilient and pair.a.state == pair.b.state == State.DEFAULT
            yield pair
        finally:
            pair.ctx.close()


def test_inline_sends_replayed_after_a_switch_carry_their_bytes_of_post_time(
    pair: Pair, nic: Callable[[], None]
) -> None:
    for n in range(COUNT):
        pair.send(n)
    assert pair.cq_a.poll(1)[0] == 0  # b has no receive yet: every send is still outstanding
    assert pair.ctx.inline.taken + pair.a.fast.inline_kept == COUNT  # each holds a copy of its bytes
    nic()
    assert wait_until(lambda: pair.a.state == pair.b.state == State.FALLBACK)
    for n in range(COUNT + 1):  # one more than was sent: a message delivered twice would take it
        pair.receive(n)
    sent = completions(pair.cq_a, COUNT)
    received = completions(pair.cq_b, COUNT)
    assert [(wc.wr_id, wc.status) for wc in sent] == [(n, OK) for n in range(COUNT)]
    assert [(wc.wr_id, wc.status, wc.byte_len) for wc in received] == [(n, OK, SIZE) for n in range(COUNT)]
    wrong = [n for n in range(COUNT) if pair.dst.read(SIZE, n * SIZE) != message(n)]
    assert wrong == [], f"{len(wrong)} messages arrived with other bytes than they were posted with"
    assert completions(pair.cq_b, 1, timeout=0.2) == []  # (every send has completed: RC placed all before)
    assert pair.ctx.inline.taken == 0  # each copy went with its completion


def test_a_too_long_inline_send_is_refused_as_the_provider_refuses_it(pair: Pair) -> None:
    pair.receive(0)
    with pytest.raises(VerbsRDMAError, match=f"{SIZE + 1} B inline, max_inline_data is {SIZE}$"):
        pair.send(7, length=SIZE + 1)
    pair.send(0)  # the refused one left nothing behind
    assert [(wc.wr_id, wc.status) for wc in completions(pair.cq_a, 1)] == [(0, OK)]
    assert [wc.wr_id for wc in completions(pair.cq_b, 1)] == [0]
    assert pair.dst.read(SIZE) == message(0)
    assert pair.ctx.inline.taken == 0


def test_after_a_failover_the_backup_path_runs_in_the_core(pair: Pair, nic: Callable[[], None]) -> None:
    """Settled on the backup path, a QP's ledger is the fast path's again: SENDs go out with the backup
    lkeys, a WRITE with the application's (default) rkey goes out with the peer's backup rkey (the first
    one looked up through the agent, the rest in C), and every completion comes back in order."""
    pair.receive(0)
    pair.send(0)
    assert [wc.wr_id for wc in completions(pair.cq_a, 1) + completions(pair.cq_b, 1)] == [0, 0]
    nic()
    assert wait_until(lambda: pair.a.state == pair.b.state == State.FALLBACK)
    for n in range(1, 9):
        pair.receive(n)
        pair.src.write(message(n))
        sg = [SGE(pair.src.buf, SIZE, pair.src.lkey)]
        pair.a.post_send(SendWR(wr_id=n, sg=sg, send_flags=e.IBV_SEND_SIGNALED))
        assert [(wc.wr_id, wc.status) for wc in completions(pair.cq_a, 1)] == [(n, OK)]
        assert [(wc.wr_id, wc.byte_len) for wc in completions(pair.cq_b, 1)] == [(n, SIZE)]
        assert pair.dst.read(SIZE, n * SIZE) == message(n)
    assert pair.a.fast.fast and pair.b.fast.fast  # both ledgers in C on the backup path
    for n in range(9, 13):
        pair.src.write(message(n))
        write = SendWR(wr_id=n, opcode=e.IBV_WR_RDMA_WRITE, send_flags=e.IBV_SEND_SIGNALED,
                       sg=[SGE(pair.src.buf, SIZE, pair.src.lkey)])  # fmt: skip
        write.set_wr_rdma(pair.dst.rkey, pair.dst.buf + n * SIZE)
        pair.a.post_send(write)
        assert [(wc.wr_id, wc.status) for wc in completions(pair.cq_a, 1)] == [(n, OK)]
        assert pair.dst.read(SIZE, n * SIZE) == message(n)
        assert pair.a.fast.fast  # the first WRITE's key lookup handed the ledger back with the key
    assert pair.a.state == State.FALLBACK
