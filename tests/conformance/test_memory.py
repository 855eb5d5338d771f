"""Registering the application's own memory: RDMA reads and writes it in place, as ibv_reg_mr on a pointer."""

from __future__ import annotations

import os

import numpy as np
import pytest

from libshift.verbs import MR, SGE, SendWR, VerbsRDMAError
from libshift.verbs import enums as e

SIGNALED = e.IBV_SEND_SIGNALED
ALL_ACCESS = e.ALL_ACCESS


def test_a_remote_write_lands_in_the_callers_numpy_array(pair):
    a, b = pair.a, pair.b
    target = np.zeros(1000, dtype=np.float32)
    mr = b.reg_buffer(target, target.nbytes)
    values = np.arange(1000, dtype=np.float32) * 0.5
    a.mr.write(values.tobytes())
    a.qp.post_send(
        SendWR(
            wr_id=1,
            opcode=e.IBV_WR_RDMA_WRITE,
            sg=[SGE(a.mr.buf, values.nbytes, a.mr.lkey)],
            remote_addr=mr.buf,
            rkey=mr.rkey,
            send_flags=SIGNALED,
        )
    )
    assert [w.status for w in a.wait()] == [e.IBV_WC_SUCCESS]
    assert np.array_equal(target, values)
    assert mr.buf == target.ctypes.data  # the very memory, not a copy


def test_a_send_gathers_from_the_callers_bytearray_and_a_read_fetches_from_it(pair):
    a, b = pair.a, pair.b
    source = bytearray(os.urandom(4096))
    mine = a.reg_buffer(source, len(source))
    theirs = bytearray(4096)
    remote = b.reg_buffer(theirs, len(theirs))
    a.qp.post_send(
        SendWR(
            wr_id=2,
            opcode=e.IBV_WR_RDMA_WRITE,
            sg=[SGE(mine.buf, 4096, mine.lkey)],
            remote_addr=remote.buf,
            rkey=remote.rkey,
            send_flags=SIGNALED,
        )
    )
    assert [w.status for w in a.wait()] == [e.IBV_WC_SUCCESS]
    assert theirs == source
    theirs[:8] = b"changed!"
    a.qp.post_send(
        SendWR(
            wr_id=3,
            opcode=e.IBV_WR_RDMA_READ,
            sg=[SGE(mine.buf + 100, 8, mine.lkey)],
            remote_addr=remote.buf,
            rkey=remote.rkey,
            send_flags=SIGNALED,
        )
    )
    assert [w.status for w in a.wait()] == [e.IBV_WC_SUCCESS]
    assert source[100:108] == b"changed!"


def test_a_prefix_of_a_larger_buffer_can_be_registered(pair):
    buffer = bytearray(100)
    mr = pair.a.reg_buffer(buffer, 10)
    assert mr.length == 10
    mr.write(b"0123456789")
    assert buffer[:10] == b"0123456789" and buffer[10:] == bytes(90)
    with pytest.raises(VerbsRDMAError, match="outside the MR"):
        mr.write(b"x", offset=10)


@pytest.mark.parametrize(
    ("buffer", "length", "reason"),
    [
        (b"read only memory", 4, "read-only"),
        (bytearray(8), 9, "fewer than the length 9"),
        (np.zeros((4, 4), dtype=np.uint8)[:, ::2], 2, "C-contiguous"),
        (12345, 4, "not a buffer"),
    ],
    ids=["readonly", "too-short", "strided", "not-a-buffer"],
)
def test_memory_that_cannot_be_registered_is_refused_with_the_reason(pair, buffer, length, reason):
    with pytest.raises(VerbsRDMAError, match=reason):
        MR(pair.a.pd, length, ALL_ACCESS, buffer)
