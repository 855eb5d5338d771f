"""The ledger: posting order, release in order, and what a peer's receive count settles after a switch."""

from libshift.shift.rewind import Ledger
from libshift.verbs import SGE, WC, RecvWR, SendWR
from libshift.verbs import enums as e

OK = e.IBV_WC_SUCCESS


def send(wr_id: int, opcode: e.ibv_wr_opcode = e.IBV_WR_SEND, signaled: bool = True) -> SendWR:
    flags = e.IBV_SEND_SIGNALED if signaled else 0
    return SendWR(wr_id=wr_id, opcode=opcode, sg=[SGE(0x1000, 64, 7)], send_flags=flags)


def ledger_with(*wrs: SendWR) -> Ledger:
    ledger = Ledger()
    for wr in wrs:
        ledger.add_send(wr, sig_all=False)
    return ledger


def test_two_sided_sends_are_numbered_and_others_are_not() -> None:
    ledger = ledger_with(
        send(1),
        send(2, e.IBV_WR_RDMA_WRITE),
        send(3, e.IBV_WR_RDMA_WRITE_WITH_IMM),
        send(4, e.IBV_WR_SEND_WITH_IMM),
    )
    assert [entry.index for entry in ledger.sq.entries] == [0, None, 1, 2]
    assert ledger.sent_two_sided == 3


def test_completions_are_released_in_posting_order_only() -> None:
    ledger = ledger_with(send(1), send(2))
    first, second = ledger.sq.entries
    second.wc = WC(wr_id=2, status=OK, opcode=e.IBV_WC_SEND, qp_num=1)
    assert ledger.finished() == []  # the first is still outstanding
    first.wc = WC(wr_id=1, status=OK, opcode=e.IBV_WC_SEND, qp_num=1)
    assert [entry.wr.wr_id for entry in ledger.finished()] == [1, 2]
    assert ledger.by_id == {}


def test_settle_completes_what_the_peer_has_and_replays_the_rest() -> None:
    ledger = ledger_with(
        send(1, e.IBV_WR_RDMA_WRITE),  # before a received SEND: done by RC order
        send(2),  # index 0: received
        send(3, e.IBV_WR_RDMA_READ),  # a READ goes again even before a received SEND
        send(4),  # index 1: received
        send(5, e.IBV_WR_RDMA_WRITE),  # after the last received: may have run, replayed (idempotent)
        send(6, e.IBV_WR_ATOMIC_FETCH_AND_ADD),  # never replayed
        send(7),  # index 2: not received
    )
    ledger.sq.entries[5].failed_with = e.IBV_WC_RETRY_EXC_ERR
    replay = ledger.settle(peer_received=2, qp_num=9)
    assert [entry.wr.wr_id for entry in replay] == [3, 5, 7]
    done = {entry.wr.wr_id: entry.wc for entry in ledger.sq.entries if entry.wc is not None}
    assert {k: wc.status for k, wc in done.items()} == {1: OK, 2: OK, 4: OK, 6: e.IBV_WC_RETRY_EXC_ERR}
    assert done[2].qp_num == 9 and done[2].byte_len == 64 and done[2].opcode == e.IBV_WC_SEND


def test_settle_with_nothing_received_replays_every_two_sided_send() -> None:
    ledger = ledger_with(send(1), send(2, e.IBV_WR_RDMA_WRITE), send(3))
    assert [entry.wr.wr_id for entry in ledger.settle(0, 1)] == [1, 2, 3]


def test_the_32_bit_count_unwraps_against_our_sends() -> None:
    ledger = Ledger()
    ledger.sent_two_sided = (1 << 32) + 10  # this QP has sent more than 2**32 two-sided messages
    assert ledger.unwrap(5) == (1 << 32) + 5
    assert ledger.unwrap(10) == (1 << 32) + 10
    assert ledger.unwrap(0xFFFFFFFF) == (1 << 32) - 1


def test_a_refused_post_is_forgotten() -> None:
    ledger = ledger_with(send(1))
    ledger.drop(ledger.sq.entries[0])
    assert (ledger.sent_two_sided, len(ledger.sq.entries), ledger.by_id) == (0, 0, {})
    entry = ledger.add_recv(RecvWR(wr_id=5))
    assert entry.index is None and not entry.is_send
