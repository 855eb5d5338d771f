"""The outstanding work requests of one resilient QP, and what to do with them after a switch.

Every WR the application posts is kept here until its completion has been handed to the application, so a
switch of path knows exactly what is outstanding. Two-sided sends (SEND, SEND_WITH_IMM, WRITE_WITH_IMM) are
numbered; the peer's count of completed receives says which of them it already has: those complete without a
second execution, the rest go again on the new path, in order. An inline send's entry gathers from a copy of
its bytes (a slot of the context's InlinePool, inline.py), given back when the entry goes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from libshift.verbs import WC, RecvWR, SendWR, ibv_send_flags, ibv_wc_opcode, ibv_wc_status, ibv_wr_opcode

if TYPE_CHECKING:
    from libshift.shift.inline import Slot

OP = ibv_wr_opcode
TWO_SIDED = frozenset({OP.IBV_WR_SEND, OP.IBV_WR_SEND_WITH_IMM, OP.IBV_WR_RDMA_WRITE_WITH_IMM})
ATOMICS = frozenset({OP.IBV_WR_ATOMIC_CMP_AND_SWP, OP.IBV_WR_ATOMIC_FETCH_AND_ADD})
REMOTE_KEYED = frozenset({OP.IBV_WR_RDMA_WRITE, OP.IBV_WR_RDMA_WRITE_WITH_IMM, OP.IBV_WR_RDMA_READ} | ATOMICS)
WC_OPCODE = {
    OP.IBV_WR_SEND: ibv_wc_opcode.IBV_WC_SEND,
    OP.IBV_WR_SEND_WITH_IMM: ibv_wc_opcode.IBV_WC_SEND,
    OP.IBV_WR_RDMA_WRITE: ibv_wc_opcode.IBV_WC_RDMA_WRITE,
    OP.IBV_WR_RDMA_WRITE_WITH_IMM: ibv_wc_opcode.IBV_WC_RDMA_WRITE,
    OP.IBV_WR_RDMA_READ: ibv_wc_opcode.IBV_WC_RDMA_READ,
    OP.IBV_WR_ATOMIC_CMP_AND_SWP: ibv_wc_opcode.IBV_WC_COMP_SWAP,
    OP.IBV_WR_ATOMIC_FETCH_AND_ADD: ibv_wc_opcode.IBV_WC_FETCH_ADD,
}
COUNT_MASK = 0xFFFFFFFF  # the count travels as a 32-bit immediate
SIGNALED = int(ibv_send_flags.IBV_SEND_SIGNALED)  # a plain int: IntFlag arithmetic costs 1.5 us per post


@dataclass(eq=False)
class Entry:
    """One application WR: where it is posted (None: held back), and its result once known."""

    wr_id: int  # ours, unique per QP: what the provider QP sees
    wr: SendWR | RecvWR  # the application's WR, with the keys of the default path
    signaled: bool = True
    index: int | None = None  # position among two-sided sends
    path: str | None = None
    posted: bool = False  # ever posted on a path (else held since the application posted it)
    wc: WC | None = None  # the completion to hand over, once the WR is done
    failed_with: ibv_wc_status | None = None  # the error it got on a path that is gone
    slot: Slot | None = None  # an inline send's copy of its bytes, which `wr` gathers from

    @property
    def is_send(self) -> bool:
        return isinstance(self.wr, SendWR)


@dataclass
class WorkQueue:
    """One queue (send or receive) of a resilient QP, in posting order."""

    entries: deque[Entry] = field(default_factory=deque)

    def pending(self) -> list[Entry]:
        return [e for e in self.entries if e.wc is None]

    def finished(self) -> list[Entry]:
        """Pop the completed entries at the head: completions go to the application in posting order."""
        out = []
        while self.entries and self.entries[0].wc is not None:
            out.append(self.entries.popleft())
        return out


class Ledger:
    """Both queues of a QP, the id map, and the counts the notification exchanges."""

    def __init__(self) -> None:
        self.sq = WorkQueue()
        self.rq = WorkQueue()
        self.by_id: dict[int, Entry] = {}
        self.next_id = 1  # shared with the fast path's ledger (handover.py)
        self.sent_two_sided = 0  # two-sided sends posted by the application so far
        self.received = 0  # two-sided messages received (receives completed successfully)

    def add_send(self, wr: SendWR, sig_all: bool) -> Entry:
        signaled = sig_all or bool(int(wr.send_flags) & SIGNALED)
        own = wr.copy_with(wr.wr_id, list(wr.sges()), wr.send_flags, wr.rkey)  # the application may reuse wr
        entry = Entry(self.new_id(), own, signaled)
        if wr.opcode in TWO_SIDED:
            entry.index = self.sent_two_sided
            self.sent_two_sided += 1
        self.sq.entries.append(entry)
        self.by_id[entry.wr_id] = entry
        return entry

    def add_recv(self, wr: RecvWR) -> Entry:
        entry = Entry(self.new_id(), RecvWR(wr.wr_id, None, list(wr.sges())))
        self.rq.entries.append(entry)
        self.by_id[entry.wr_id] = entry
        return entry

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def drop(self, entry: Entry) -> None:
        """Forget an entry the provider refused at post time."""
        queue = self.sq if entry.is_send else self.rq
        queue.entries.remove(entry)
        self._forget(entry)
        if entry.index is not None:
            self.sent_two_sided -= 1

    def finished(self) -> list[Entry]:
        done = self.sq.finished() + self.rq.finished()
        for entry in done:
            self._forget(entry)
        return done

    def _forget(self, entry: Entry) -> None:
        del self.by_id[entry.wr_id]
        if entry.slot is not None:
            entry.slot.release()

    def unwrap(self, count32: int) -> int:
        """The peer's full receive count from its low 32 bits: it lies within our two-sided sends."""
        return self.sent_two_sided - ((self.sent_two_sided - count32) & COUNT_MASK)

    def settle(self, peer_received: int, qp_num: int) -> list[Entry]:
        """Decide every pending send after a switch; return those to post again, in order.

        Two-sided sends the peer has received complete now, and so does every plain WRITE before the last of
        them (RC executes in order). READs go again (idempotent). An atomic in flight is never replayed:
        it completes with the error it got, fail-closed.
        """
        pending = self.sq.pending()
        received = [i for i, e in enumerate(pending) if e.index is not None and e.index < peer_received]
        last = received[-1] if received else -1
        replay = []
        for i, entry in enumerate(pending):
            op = entry.wr.opcode
            if op in ATOMICS:
                status = entry.failed_with or ibv_wc_status.IBV_WC_WR_FLUSH_ERR
                entry.wc = synthetic_wc(entry, status, qp_num)
            elif i <= last and op != OP.IBV_WR_RDMA_READ:
                entry.wc = synthetic_wc(entry, ibv_wc_status.IBV_WC_SUCCESS, qp_num)
            else:
                entry.path = None
                replay.append(entry)
        return replay


def synthetic_wc(entry: Entry, status: ibv_wc_status, qp_num: int) -> WC:
    """The completion of a send that finished without a completion of its own on the current path."""
    wr = entry.wr
    assert isinstance(wr, SendWR)
    return WC(
        wr_id=wr.wr_id,
        status=status,
        opcode=WC_OPCODE[wr.opcode],
        qp_num=qp_num,
        byte_len=sum(sge.length for sge in wr.sg),
    )
