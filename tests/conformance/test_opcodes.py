"""Every opcode does what ibverbs says, with the completions ibverbs gives."""

from __future__ import annotations

import os
import struct

import pytest

from libshift.verbs import SGE, QPCap, RecvWR, SendWR, VerbsRDMAError
from libshift.verbs import enums as e

SIGNALED = e.IBV_SEND_SIGNALED
U64 = struct.Struct("=Q")


def sge(mr, offset: int, length: int) -> SGE:
    return SGE(mr.buf + offset, length, mr.lkey)


def signaled_send(wr_id: int, *sg: SGE) -> SendWR:
    return SendWR(wr_id=wr_id, opcode=e.IBV_WR_SEND, sg=list(sg), send_flags=SIGNALED)


def test_send_places_the_message_in_the_posted_receive(pair):
    a, b = pair.a, pair.b
    a.mr.write(b"hello, responder")
    b.qp.post_recv(RecvWR(wr_id=70, sg=[sge(b.mr, 100, 64)]))
    a.qp.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND, sg=[sge(a.mr, 0, 16)], send_flags=SIGNALED))
    (recv,) = b.wait()
    (sent,) = a.wait()
    assert (recv.wr_id, recv.status, recv.opcode, recv.byte_len) == (70, e.IBV_WC_SUCCESS, e.IBV_WC_RECV, 16)
    # ibverbs defines src_qp for UD only: tcp fills it in on RC, rxe leaves it 0
    assert recv.src_qp in (a.qp.qp_num, 0) and recv.qp_num == b.qp.qp_num
    assert not recv.wc_flags & e.IBV_WC_WITH_IMM
    assert (sent.wr_id, sent.status, sent.opcode) == (1, e.IBV_WC_SUCCESS, e.IBV_WC_SEND)
    assert b.mr.read(16, 100) == b"hello, responder"


def test_send_with_imm_carries_the_immediate(pair):
    a, b = pair.a, pair.b
    b.qp.post_recv(RecvWR(wr_id=5, sg=[sge(b.mr, 0, 8)]))
    a.qp.post_send(SendWR(wr_id=2, opcode=e.IBV_WR_SEND_WITH_IMM, sg=[sge(a.mr, 0, 4)], imm_data=0xDEADBEEF))
    (recv,) = b.wait()
    assert recv.status == e.IBV_WC_SUCCESS and recv.opcode == e.IBV_WC_RECV
    assert recv.imm_data == 0xDEADBEEF and recv.wc_flags & e.IBV_WC_WITH_IMM


def test_zero_length_send_completes_both_sides(pair):
    a, b = pair.a, pair.b
    b.qp.post_recv(RecvWR(wr_id=9, sg=[]))
    a.qp.post_send(SendWR(wr_id=3, opcode=e.IBV_WR_SEND, sg=[]))
    assert [(w.wr_id, w.status, w.byte_len) for w in b.wait()] == [(9, e.IBV_WC_SUCCESS, 0)]
    assert [w.wr_id for w in a.wait()] == [3]


def test_rdma_write_places_data_without_consuming_a_receive(pair):
    a, b = pair.a, pair.b
    payload = os.urandom(5000)
    a.mr.write(payload, offset=10)
    b.qp.post_recv(RecvWR(wr_id=11, sg=[sge(b.mr, 0, 16)]))
    a.qp.post_send(
        SendWR(
            wr_id=4,
            opcode=e.IBV_WR_RDMA_WRITE,
            sg=[sge(a.mr, 10, 5000)],
            remote_addr=b.mr.buf + 777,
            rkey=b.mr.rkey,
        )
    )
    assert [(w.wr_id, w.opcode, w.status) for w in a.wait()] == [(4, e.IBV_WC_RDMA_WRITE, e.IBV_WC_SUCCESS)]
    assert b.mr.read(5000, 777) == payload
    assert b.cq.poll(1)[0] == 0  # the receive is still posted: a SEND now lands in it
    a.qp.post_send(SendWR(wr_id=5, opcode=e.IBV_WR_SEND, sg=[sge(a.mr, 0, 1)]))
    assert [w.wr_id for w in b.wait()] == [11]


def test_rdma_write_with_imm_consumes_a_receive_and_reports_the_length(pair):
    a, b = pair.a, pair.b
    a.mr.write(b"x" * 300)
    b.qp.post_recv(RecvWR(wr_id=12, sg=[]))
    a.qp.post_send(
        SendWR(
            wr_id=6,
            opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM,
            sg=[sge(a.mr, 0, 300)],
            remote_addr=b.mr.buf + 4096,
            rkey=b.mr.rkey,
            imm_data=77,
        )
    )
    (recv,) = b.wait()
    assert (recv.wr_id, recv.opcode, recv.byte_len, recv.imm_data) == (
        12,
        e.IBV_WC_RECV_RDMA_WITH_IMM,
        300,
        77,
    )
    assert recv.wc_flags & e.IBV_WC_WITH_IMM
    assert b.mr.read(300, 4096) == b"x" * 300


def test_rdma_read_fetches_remote_memory(pair):
    a, b = pair.a, pair.b
    data = os.urandom(3000)
    b.mr.write(data, offset=123)
    a.qp.post_send(
        SendWR(
            wr_id=7,
            opcode=e.IBV_WR_RDMA_READ,
            sg=[sge(a.mr, 64, 3000)],
            remote_addr=b.mr.buf + 123,
            rkey=b.mr.rkey,
        )
    )
    (wc,) = a.wait()
    assert (wc.wr_id, wc.opcode, wc.status, wc.byte_len) == (7, e.IBV_WC_RDMA_READ, e.IBV_WC_SUCCESS, 3000)
    assert a.mr.read(3000, 64) == data


def test_fetch_and_add_returns_the_old_value(pair):
    a, b = pair.a, pair.b
    b.mr.write(U64.pack(40), offset=64)
    for wr_id in (1, 2):
        a.qp.post_send(
            SendWR(
                wr_id=wr_id,
                opcode=e.IBV_WR_ATOMIC_FETCH_AND_ADD,
                sg=[sge(a.mr, 8 * wr_id, 8)],
                remote_addr=b.mr.buf + 64,
                rkey=b.mr.rkey,
                compare_add=2,
            )
        )
    assert [(w.opcode, w.status) for w in a.wait(2)] == [(e.IBV_WC_FETCH_ADD, e.IBV_WC_SUCCESS)] * 2
    assert U64.unpack(a.mr.read(8, 8))[0] == 40
    assert U64.unpack(a.mr.read(8, 16))[0] == 42
    assert U64.unpack(b.mr.read(8, 64))[0] == 44


def test_compare_and_swap_swaps_only_on_match(pair):
    a, b = pair.a, pair.b
    b.mr.write(U64.pack(7), offset=0)

    def cas(wr_id: int, compare: int, swap: int) -> int:
        wr = SendWR(wr_id=wr_id, opcode=e.IBV_WR_ATOMIC_CMP_AND_SWP, sg=[sge(a.mr, 0, 8)])
        wr.set_wr_atomic(b.mr.rkey, b.mr.buf, compare, swap)
        a.qp.post_send(wr)
        (wc,) = a.wait()
        assert (wc.opcode, wc.status) == (e.IBV_WC_COMP_SWAP, e.IBV_WC_SUCCESS)
        return U64.unpack(a.mr.read(8))[0]

    assert cas(1, compare=5, swap=99) == 7
    assert U64.unpack(b.mr.read(8))[0] == 7
    assert cas(2, compare=7, swap=99) == 7
    assert U64.unpack(b.mr.read(8))[0] == 99


def test_unsignaled_requests_complete_silently_and_in_order(pair):
    a, b = pair.a, pair.b
    for i in range(10):
        a.mr.write(bytes([i]), offset=i)
        flags = SIGNALED if i == 9 else 0
        wr = SendWR(wr_id=i, opcode=e.IBV_WR_RDMA_WRITE, sg=[sge(a.mr, i, 1)], send_flags=flags)
        wr.set_wr_rdma(b.mr.rkey, b.mr.buf + i)
        a.qp.post_send(wr)
    assert [w.wr_id for w in a.wait(10, timeout=2)] == [9]
    assert b.mr.read(10) == bytes(range(10))


def test_sq_sig_all_signals_every_request(make_pair):
    pair = make_pair(sq_sig_all=True)
    for i in range(3):
        pair.a.qp.post_send(
            SendWR(
                wr_id=i,
                opcode=e.IBV_WR_RDMA_WRITE,
                sg=[],
                send_flags=0,
                remote_addr=pair.b.mr.buf,
                rkey=pair.b.mr.rkey,
            )
        )
    assert [w.wr_id for w in pair.a.wait(3)] == [0, 1, 2]


def test_inline_data_is_copied_at_post_time(pair):
    a, b = pair.a, pair.b
    a.mr.write(b"original")
    b.qp.post_recv(RecvWR(wr_id=1, sg=[sge(b.mr, 0, 8)]))
    flags = SIGNALED | e.IBV_SEND_INLINE
    a.qp.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND, sg=[sge(a.mr, 0, 8)], send_flags=flags))
    a.mr.write(b"changed!")
    assert [w.status for w in b.wait()] == [e.IBV_WC_SUCCESS]
    assert b.mr.read(8) == b"original"


def test_large_gather_and_scatter_lists(make_pair, max_sge):
    n = min(64, max_sge)
    pair = make_pair(cap=QPCap(max_send_sge=n, max_recv_sge=n), mr_size=1 << 20)
    a, b = pair.a, pair.b
    pieces = [os.urandom(100 + 37 * i) for i in range(n)]
    offsets, at = [], 0
    for piece in pieces:
        offsets.append(at)
        a.mr.write(piece, offset=at)
        at += len(piece) + 11  # gaps between the pieces
    total = sum(map(len, pieces))
    scatter = [sge(b.mr, 8192 * i, total // n + 64) for i in range(n)]
    b.qp.post_recv(RecvWR(wr_id=1, sg=scatter))
    gather = [sge(a.mr, off, len(p)) for off, p in zip(offsets, pieces, strict=True)]
    a.qp.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND, sg=gather))
    (recv,) = b.wait()
    assert recv.status == e.IBV_WC_SUCCESS and recv.byte_len == total
    landed, left = b"", total
    for s in scatter:
        take = min(left, s.length)
        landed += b.mr.read(take, s.addr - b.mr.buf)
        left -= take
    assert landed == b"".join(pieces)


def test_many_messages_arrive_in_order(pair):
    a, b = pair.a, pair.b
    count = 100
    for i in range(count):
        b.qp.post_recv(RecvWR(wr_id=i, sg=[sge(b.mr, 8 * i, 8)]))
    for i in range(count):
        a.mr.write(U64.pack(i), offset=8 * i)
        a.qp.post_send(SendWR(wr_id=i, opcode=e.IBV_WR_SEND, sg=[sge(a.mr, 8 * i, 8)]))
    got = b.wait(count)
    assert [w.wr_id for w in got] == list(range(count))
    assert [U64.unpack(b.mr.read(8, 8 * i))[0] for i in range(count)] == list(range(count))
    assert len(a.wait(count)) == count


def test_a_list_of_sends_posted_at_once_arrives_in_order(pair):
    a, b = pair.a, pair.b
    count = 40  # small sends: the tcp provider writes them together
    for i in range(count):
        b.qp.post_recv(RecvWR(wr_id=i, sg=[sge(b.mr, 8 * i, 8)]))
    for i in range(count):
        a.mr.write(U64.pack(1000 + i), offset=8 * i)
    a.qp.post_send_list(
        [
            SendWR(wr_id=i, opcode=e.IBV_WR_SEND, sg=[sge(a.mr, 8 * i, 8)], send_flags=SIGNALED)
            for i in range(count)
        ]
    )
    assert [w.wr_id for w in b.wait(count)] == list(range(count))
    assert [U64.unpack(b.mr.read(8, 8 * i))[0] for i in range(count)] == [1000 + i for i in range(count)]
    assert [(w.wr_id, w.status) for w in a.wait(count)] == [(i, e.IBV_WC_SUCCESS) for i in range(count)]


def test_a_refused_wr_ends_a_posted_list_after_the_ones_before_it(pair):
    a, b = pair.a, pair.b
    for i in range(3):
        b.qp.post_recv(RecvWR(wr_id=i, sg=[sge(b.mr, 8 * i, 8)]))
    good = [
        SendWR(wr_id=i, opcode=e.IBV_WR_SEND, sg=[sge(a.mr, 0, 8)], send_flags=SIGNALED) for i in range(2)
    ]
    too_many_sges = SendWR(wr_id=99, opcode=e.IBV_WR_SEND, sg=[sge(a.mr, 0, 1)] * 1000, send_flags=SIGNALED)
    after = SendWR(wr_id=7, opcode=e.IBV_WR_SEND, sg=[sge(a.mr, 0, 8)], send_flags=SIGNALED)
    with pytest.raises(VerbsRDMAError, match="SGEs"):
        a.qp.post_send_list([*good, too_many_sges, after])
    assert [w.wr_id for w in a.wait(2)] == [0, 1]
    assert [w.wr_id for w in b.wait(2)] == [0, 1]
    assert a.wait(1, timeout=0.3) == []  # the WR after the refused one was never posted


def test_a_list_of_receives_posted_at_once_takes_messages_in_order(pair):
    a, b = pair.a, pair.b
    count = 12
    b.qp.post_recv_list([RecvWR(wr_id=i, sg=[sge(b.mr, 8 * i, 8)]) for i in range(count)])
    for i in range(count):
        a.mr.write(U64.pack(2000 + i), offset=8 * i)
        a.qp.post_send(SendWR(wr_id=i, opcode=e.IBV_WR_SEND, sg=[sge(a.mr, 8 * i, 8)], send_flags=SIGNALED))
    assert [w.wr_id for w in b.wait(count)] == list(range(count))
    assert [U64.unpack(b.mr.read(8, 8 * i))[0] for i in range(count)] == [2000 + i for i in range(count)]
    assert len(a.wait(count)) == count


def test_a_refused_receive_ends_a_posted_list_after_the_ones_before_it(make_pair):
    pair = make_pair(cap=QPCap(max_send_wr=8, max_recv_wr=2))
    a, b = pair.a, pair.b
    depth = b.qp.cap.max_recv_wr  # as granted: rxe rounds the queue up
    assert 2 <= depth < 8 <= a.qp.cap.max_send_wr
    with pytest.raises(VerbsRDMAError, match="receive queue full"):
        b.qp.post_recv_list([RecvWR(wr_id=i, sg=[sge(b.mr, 8 * i, 8)]) for i in range(depth + 1)])
    for i in range(depth + 1):
        a.qp.post_send(SendWR(wr_id=i, opcode=e.IBV_WR_SEND, sg=[sge(a.mr, 0, 8)], send_flags=SIGNALED))
    assert [w.wr_id for w in b.wait(depth)] == list(range(depth))
    b.qp.post_recv(RecvWR(wr_id=99, sg=[sge(b.mr, 64, 8)]))  # the last message takes this one, so the
    assert [w.wr_id for w in b.wait(1)] == [99]  # last of the list was never posted
    assert [(w.wr_id, w.status) for w in a.wait(depth + 1)] == [
        (i, e.IBV_WC_SUCCESS) for i in range(depth + 1)
    ]


def test_both_directions_at_once(pair):
    a, b = pair.a, pair.b
    for side in (a, b):
        for i in range(20):
            side.qp.post_recv(RecvWR(wr_id=i, sg=[sge(side.mr, 1024 + 64 * i, 64)]))
    for side in (a, b):
        for i in range(20):
            side.qp.post_send(SendWR(wr_id=100 + i, opcode=e.IBV_WR_SEND, sg=[sge(side.mr, 0, 64)]))
    for side in (a, b):
        done = side.wait(40)
        assert sorted(w.wr_id for w in done) == list(range(20)) + list(range(100, 120))
        assert {w.status for w in done} == {e.IBV_WC_SUCCESS}
