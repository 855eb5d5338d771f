"""What one rank sends and receives in a collective: ring schedules cut into pipelined chunks.

A schedule is a list of ring steps, for the rank at one position of the ring (order.py: positions are not
rank numbers); in each step a rank sends one byte range of its work buffer to its right
neighbour and receives one from its left neighbour. `build` cuts every range into chunks of at most the
staging slot size and lists the chunks in order, once for sending and once for receiving: both neighbours
compute the same lists, so the sender's n-th chunk is the receiver's n-th chunk. A chunk to send that was
received in an earlier step waits for exactly that chunk to be applied, so a segment flows on through the
ring chunk by chunk instead of step by step. In a plan of large segments (`direct`), a chunk the receiver only
copies is written straight into its place in the receiver's memory instead of a staging slot.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

Range = tuple[int, int]  # (offset, bytes) in the work buffer
PIECES = 4  # a segment is cut into about this many chunks, so that it flows on before it is whole
MIN_CHUNK = 256 << 10  # smaller chunks cost more in messages and wake-ups than they gain in overlap
ALIGN = 4096  # chunk sizes are multiples of this, hence of every element size
DIRECT_MIN = 256 << 10  # segments at least this large are placed directly: the copy saved outweighs a message


class Apply(enum.Enum):
    """What a received chunk does to the work buffer."""

    COPY = "copy"
    COMBINE = "combine"  # work <- op(received, work)
    FINAL = "final"  # COMBINE, and it was the last value of the segment: finish it (AVG divides)


@dataclass(frozen=True)
class Recv:
    offset: int
    nbytes: int
    apply: Apply


@dataclass(frozen=True)
class Send:
    offset: int
    nbytes: int
    after: int  # the index of the received chunk that must be applied before this one is sent; -1: none
    apply: Apply = Apply.COPY  # what the receiver does with it (its step is the same step of the schedule)


@dataclass(frozen=True)
class Step:
    send: Range | None
    recv: Range | None
    apply: Apply = Apply.COPY


@dataclass(frozen=True)
class Plan:
    sends: list[Send]
    recvs: list[Recv]
    direct: bool = False  # COPY chunks go straight into the receiver's memory (ring.py), not a staging slot


def chunk_size(segment: int, limit: int) -> int:
    """The chunk size for segments of `segment` bytes: about PIECES chunks a segment, at least MIN_CHUNK,
    at most `limit` (a staging slot); a function of sizes every rank knows, so all ranks agree."""
    wanted = -(-segment // PIECES // ALIGN) * ALIGN
    return max(MIN_CHUNK, min(limit, wanted))


def chunks(span: Range, chunk: int) -> list[Range]:
    offset, nbytes = span
    return [(offset + at, min(chunk, nbytes - at)) for at in range(0, nbytes, chunk)]


def build(steps: list[Step], chunk: int, direct: bool = False) -> Plan:
    """The chunk lists of a schedule; `chunk` (bytes) must be a multiple of the element size. `direct`
    must be the same on every rank (a function of sizes all ranks know, as the chunk size is)."""
    sends: list[Send] = []
    recvs: list[Recv] = []
    latest: dict[Range, int] = {}  # chunk -> the index of its latest receive in an earlier step
    for step in steps:
        received: dict[Range, int] = {}
        if step.send is not None:
            sends += [Send(*piece, latest.get(piece, -1), step.apply) for piece in chunks(step.send, chunk)]
        if step.recv is not None:
            for piece in chunks(step.recv, chunk):
                received[piece] = len(recvs)
                recvs.append(Recv(*piece, step.apply))
        latest.update(received)
    return Plan(sends, recvs, direct)


def reduce_scatter(segments: list[Range], position: int) -> list[Step]:
    """Segment j ends complete at position j; it starts at j+1 and gathers every rank in ring order."""
    n = len(segments)
    return [
        Step(
            segments[(position - s - 1) % n],
            segments[(position - s - 2) % n],
            Apply.FINAL if s == n - 2 else Apply.COMBINE,
        )
        for s in range(n - 1)
    ]


def all_gather(segments: list[Range], position: int) -> list[Step]:
    """Segment j starts at position j and is copied around the ring to every other rank."""
    n = len(segments)
    return [Step(segments[(position - s) % n], segments[(position - s - 1) % n]) for s in range(n - 1)]


def all_reduce(segments: list[Range], position: int) -> list[Step]:
    """Reduce-scatter, then all-gather of the reduced segments: 2(n-1)/n of the bytes on every link."""
    return reduce_scatter(segments, position) + all_gather(segments, position)


def broadcast(span: Range, position: int, root: int, world_size: int) -> list[Step]:
    """A chain from the root (a position) along the ring; each rank forwards a chunk as soon as it has it."""
    after_root = (position - root) % world_size
    steps = []
    if after_root > 0:
        steps.append(Step(None, span))
    if after_root < world_size - 1:
        steps.append(Step(span, None))
    return steps
