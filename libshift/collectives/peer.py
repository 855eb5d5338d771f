"""One peer of point to point (pairs.py): the wire format between two ranks, and what one rank keeps of a
peer: its QP and buffers, the transfers queued with it, and the counters of the staged and the direct
paths."""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from libshift.collectives.buffers import Region
from libshift.shift import ShiftMR, ShiftQP
from libshift.verbs import enums as e

CHUNK = 1 << 20  # a slot: one chunk's header and bytes
SLOTS = 4  # chunks in flight to one peer at most
HEADER = struct.Struct("<Qq")  # the message's size in bytes, its tag
PAYLOAD = CHUNK - HEADER.size
DIRECT_MIN = 256 << 10  # a message at least this large goes straight into its receive once announced
MAILBOX = 4  # receives announced to one peer at most, ahead of the first not yet ended
ANNOUNCEMENT = struct.Struct("<QQQqI")  # a receive's number, address, length, tag, rkey
MAIL_SLOT = 64  # bytes a mailbox slot takes: the peer's announcements land in MAILBOX of them, ours go
# from MAILBOX more
RECEIVES = 2 * SLOTS + 2 * MAILBOX + 2  # posted per QP: the peer's chunks, hand-backs, announcements and
# direct messages' ends
ANNOUNCED = 1 << 31  # in a write's immediate: an announcement landed (its number's low bits below)
DIRECT = 1 << 30  # in a write's immediate: a message ended, written straight into its receive
NUMBER = DIRECT - 1  # in a write's immediate: the chunk's or the message's number, modulo this + 1
DIRECT_WR = 1 << 63  # in a work request's id: a direct message's write (the message's number below)
ANNOUNCE_WR = 1 << 62  # in a work request's id: an announcement's write
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
Done = Callable[[BaseException | None], None]


@dataclass
class Transfer:
    """One send or receive: its peer, tag and bytes (a flat uint8 view), how far it has come, and whom to
    tell when it ends."""

    peer: int
    tag: int
    data: np.ndarray
    done: Done
    offset: int = 0
    number: int = 0  # its place among the sends (or receives) with its peer
    region: Region | None = None  # a receive's array, registered and announced
    decided: bool = False  # whether it was looked at for direct placement (direct.py)

    def what(self, kind: str) -> str:
        return f"{kind} of {self.data.nbytes} bytes with tag {self.tag}"


@dataclass
class Peer:
    """One peer's QP, staging (its chunks land here) and outbox (ours go from here), and the transfers."""

    qp: ShiftQP
    staging: ShiftMR
    outbox: ShiftMR
    mailbox: ShiftMR  # the peer's announcements land here; ours go from after them
    target: tuple[int, int] = (0, 0)  # the peer's staging: address, rkey
    mail_target: tuple[int, int] = (0, 0)  # the peer's mailbox: address, rkey
    connected: bool = False
    sends: deque[Transfer] = field(default_factory=deque)
    recvs: deque[Transfer] = field(default_factory=deque)
    written: int = 0  # chunks written to the peer
    completed: int = 0  # of them, acknowledged (their outbox slots free again)
    credits: int = SLOTS  # slots of the peer's staging free for us
    last_chunks: dict[int, Transfer] = field(default_factory=dict)  # a send's last chunk -> the send
    arrived: int = 0  # chunks landed in our staging
    consumed: int = 0  # of them, copied out (or dropped) and handed back
    message: tuple[int, int, int] | None = None  # the message coming in: size, tag, bytes taken
    dropping: bool = False  # the message coming in had no receive of its size and tag
    owed: int = 0  # slots consumed, not yet handed back
    handing: int = 0  # hand-backs posted, not yet complete (at most SLOTS: the send queue's room)
    sends_made: int = 0  # sends ordered with the peer: the next one's number
    recvs_made: int = 0  # receives ordered with the peer: the next one's number
    announcements: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)  # the peer's receives
    # by number: address, length, rkey, tag
    announcing: set[int] = field(default_factory=set)  # our announcements' writes not yet complete
    direct: dict[int, Transfer] = field(default_factory=dict)  # sends written direct, by number, until acked
    registered: int = 0  # arrays registered for direct messages with the peer (direct.py) ...
    reused: int = 0  # ... and messages whose array was registered already
    lost: str | None = None  # why the QP lost every path while idle (lost_while_idle)

    @property
    def idle(self) -> bool:
        """Whether no transfer with the peer is under way."""
        return not (self.sends or self.recvs or self.last_chunks or self.direct)

    def lost_while_idle(self) -> bool:
        """Whether the QP lost every path while no transfer was under way (two ranks of one host whose NICs
        are each other's backup, one of them failed). That raises no alarm: the job's collectives, on the
        ring's own QPs, go on; the next transfer with the peer raises it, as a loss under way does."""
        if self.lost is None and self.qp.lost_paths is not None and self.idle:
            self.lost = self.qp.lost_paths
        return self.lost is not None

    @property
    def recvs_ended(self) -> int:
        return self.recvs_made - len(self.recvs)
