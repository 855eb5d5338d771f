"""Many QPs at once, and a large transfer of random data verified end to end: 1 GiB, or the MiB that
SHIFT_TEST_BULK_MIB names (make test-rxe's 128: under the VM's TCG a GiB alone takes 160-210 s)."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest

from libshift.verbs import SGE, QPCap, RecvWR, SendWR
from libshift.verbs import enums as e

CHUNK = 16 << 20
PIECE = 4 << 20
SLOTS = 2
TOTAL = int(os.environ.get("SHIFT_TEST_BULK_MIB", "1024")) << 20


def test_many_qps_carry_traffic_at_once(make_pair):
    pairs = [make_pair(mr_size=4096) for _ in range(64)]
    for n, pair in enumerate(pairs):
        pair.b.qp.post_recv(RecvWR(wr_id=n, sg=[SGE(pair.b.mr.buf, 64, pair.b.mr.lkey)]))
        pair.a.mr.write(n.to_bytes(8, "little") * 8)
    for n, pair in enumerate(pairs):
        pair.a.qp.post_send(
            SendWR(wr_id=n, opcode=e.IBV_WR_SEND, sg=[SGE(pair.a.mr.buf, 64, pair.a.mr.lkey)])
        )
        pair.a.qp.post_send(
            SendWR(
                wr_id=1000 + n,
                opcode=e.IBV_WR_RDMA_WRITE,
                sg=[SGE(pair.a.mr.buf, 64, pair.a.mr.lkey)],
                remote_addr=pair.b.mr.buf + 1024,
                rkey=pair.b.mr.rkey,
            )
        )
    for n, pair in enumerate(pairs):
        assert [(w.wr_id, w.status) for w in pair.b.wait()] == [(n, e.IBV_WC_SUCCESS)]
        assert [w.wr_id for w in pair.a.wait(2)] == [n, 1000 + n]
        assert pair.b.mr.read(64) == pair.b.mr.read(64, 1024) == n.to_bytes(8, "little") * 8


@pytest.mark.slow
def test_bulk_random_data_arrives_intact(make_pair):
    """The sender writes 16 MiB rounds into two slots; the receiver hashes each and returns a credit."""
    pair = make_pair(mr_size=CHUNK * SLOTS, cap=QPCap(max_send_wr=64, max_recv_wr=64))
    a, b = pair.a, pair.b
    rounds = TOTAL // CHUNK
    sent, received = hashlib.sha256(), hashlib.sha256()
    errors: list[str] = []

    def receiver() -> None:
        for r in range(rounds):
            got = b.wait(1, timeout=30)
            if [(w.status, w.imm_data) for w in got] != [(e.IBV_WC_SUCCESS, r)]:
                errors.append(f"round {r}: {got}")
                return
            slot = r % SLOTS
            received.update(b.mr.view[slot * CHUNK : (slot + 1) * CHUNK])
            b.qp.post_recv(RecvWR(wr_id=r + SLOTS))
            b.qp.post_send(SendWR(wr_id=r, opcode=e.IBV_WR_SEND, sg=[], send_flags=0))

    for r in range(SLOTS):
        b.qp.post_recv(RecvWR(wr_id=r))
    for r in range(rounds):
        a.qp.post_recv(RecvWR(wr_id=r))
    thread = threading.Thread(target=receiver)
    started = time.monotonic()
    thread.start()
    credits = SLOTS
    for r in range(rounds):
        if credits == 0:
            got = a.wait(1, timeout=30)
            assert [w.status for w in got] == [e.IBV_WC_SUCCESS], got
            credits += 1
        credits -= 1
        slot = r % SLOTS
        data = os.urandom(CHUNK)
        sent.update(data)
        a.mr.view[slot * CHUNK : (slot + 1) * CHUNK] = data
        for offset in range(0, CHUNK, PIECE):
            last = offset + PIECE == CHUNK
            a.qp.post_send(
                SendWR(
                    wr_id=r,
                    opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM if last else e.IBV_WR_RDMA_WRITE,
                    sg=[SGE(a.mr.buf + slot * CHUNK + offset, PIECE, a.mr.lkey)],
                    remote_addr=b.mr.buf + slot * CHUNK + offset,
                    rkey=b.mr.rkey,
                    imm_data=r,
                    send_flags=0,
                )
            )
    thread.join(timeout=60)
    elapsed = time.monotonic() - started
    assert not thread.is_alive() and not errors, errors
    assert received.hexdigest() == sent.hexdigest()
    mib = TOTAL >> 20
    print(f"{mib} MiB in {elapsed:.1f} s ({TOTAL / elapsed / 1e6:.0f} MB/s including generation and hashing)")
