"""The tcp provider's framing: one fixed header per frame, then `length` bytes of payload.

Both directions of a QP's connection carry requests (this side as requester) and responses (this side as
responder). `seq` is the request's sequence number (PSN, one per work request). Responses are cumulative:
ACK(n) acknowledges every request up to n; a request frame may carry the same ack (FLAG_ACK), so that
traffic in both directions needs no separate ACK frames. NAK carries the requester's completion status in
`imm` (or RNR), and for RNR the responder's encoded min_rnr_timer in `arg1`.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

MAGIC = 0x5F
SEQ_MASK = 0xFFFFFFFF
MAX_PAYLOAD = 1 << 31
FLAG_SOLICITED = 1
FLAG_ACK = 2  # a request that also carries a cumulative ack of the other direction's requests in `ack`
NAK_RNR = 0xFFFF

# magic, op, flags, seq, length, rkey, imm, addr, arg1 (compare/add, atomic result), arg2 (swap), ack
HEADER = struct.Struct("!BBHIIIIQQQI")


class Op(IntEnum):
    HELLO = 1  # active side's first frame: seq = its QPN, imm = the QPN it means to reach
    SEND = 2
    SEND_IMM = 3
    WRITE = 4
    WRITE_IMM = 5
    READ_REQ = 6
    CMP_SWP = 7
    FETCH_ADD = 8
    ACK = 16
    NAK = 17
    READ_RESP = 18
    ATOMIC_RESP = 19


REQUESTS = frozenset({Op.SEND, Op.SEND_IMM, Op.WRITE, Op.WRITE_IMM, Op.READ_REQ, Op.CMP_SWP, Op.FETCH_ADD})
CARRIES_PAYLOAD = frozenset({Op.SEND, Op.SEND_IMM, Op.WRITE, Op.WRITE_IMM, Op.READ_RESP})


class Header(NamedTuple):
    magic: int
    op: int
    flags: int
    seq: int
    length: int
    rkey: int
    imm: int
    addr: int
    arg1: int
    arg2: int
    ack: int


def pack(
    op: Op,
    seq: int,
    length: int = 0,
    *,
    flags: int = 0,
    rkey: int = 0,
    imm: int = 0,
    addr: int = 0,
    arg1: int = 0,
    arg2: int = 0,
    ack: int = 0,
) -> bytes:
    return HEADER.pack(MAGIC, op, flags, seq & SEQ_MASK, length, rkey, imm, addr, arg1, arg2, ack & SEQ_MASK)


def pack_request(
    op: int, flags: int, seq: int, length: int, fields: tuple[int, int, int, int, int], ack: int
) -> bytes:
    """A request's header; `fields` are rkey, imm, addr, arg1, arg2 (the hot path's spelling of pack)."""
    return HEADER.pack(MAGIC, op, flags, seq & SEQ_MASK, length, *fields, ack & SEQ_MASK)


def unpack(buf: bytes | bytearray | memoryview) -> Header:
    return Header(*HEADER.unpack(buf))


def unpack_from(buf: bytes | bytearray | memoryview, offset: int) -> Header:
    return Header(*HEADER.unpack_from(buf, offset))


def problem(hdr: Header) -> str | None:
    """Why a header cannot be framed at all (the stream is then unusable), or None."""
    if hdr.magic != MAGIC:
        return f"bad magic {hdr.magic:#x}"
    if hdr.op not in Op._value2member_map_:
        return f"unknown opcode {hdr.op}"
    if hdr.length > MAX_PAYLOAD:
        return f"bad length {hdr.length}"
    return None


def payload_length(hdr: Header) -> int:
    """Bytes that follow the header on the stream (READ_REQ's length is the amount asked for, not sent)."""
    return hdr.length if hdr.op in CARRIES_PAYLOAD else 0
