"""libshift.core.wire, the core's frame format handed to Python: the bytes are docs/wire.md's header."""

from __future__ import annotations

import struct

import pytest

from libshift.core import wire

DOCUMENTED = struct.Struct("!BBHIIIIQQQI")  # docs/wire.md's table: magic, op, flags, seq, ... ack


def test_a_header_is_packed_as_the_wire_document_lays_it_out() -> None:
    packed = wire.pack_header(
        wire.Op.WRITE_IMM,
        0x01020304,
        5,
        flags=2,
        rkey=0xAABBCCDD,
        imm=7,
        addr=0x1122334455667788,
        arg1=9,
        arg2=1 << 63,
        ack=0xFFFFFFFF,
    )
    assert len(packed) == DOCUMENTED.size == 48
    assert DOCUMENTED.unpack(packed) == (
        0x5F, 5, 2, 0x01020304, 5, 0xAABBCCDD, 7, 0x1122334455667788, 9, 1 << 63, 0xFFFFFFFF
    )  # fmt: skip


def test_the_requests_are_the_ops_a_requester_sends() -> None:
    sent = {"SEND", "SEND_IMM", "WRITE", "WRITE_IMM", "READ_REQ", "CMP_SWP", "FETCH_ADD"}
    assert {op.name for op in wire.REQUESTS} == sent


def test_an_op_is_one_byte() -> None:
    assert wire.pack_header(255, 0)[1] == 255  # any byte: a fuzzer sends unknown ops
    with pytest.raises(ValueError, match="one byte"):
        wire.pack_header(256, 0)
