"""The hand-over of a ShiftQP's ledger between the fast path (the core's, fastpath.h) and the Python
failover layer.

In its steady state (connected on the default path, with a backup or as a plain QP, or settled on a
backup path after a failover; nothing held, no doubt) a QP's ledger is the core's: a post and a completion
are one C call each. On a backup path the core posts with that path's keys: the context's lkey maps live
there (ctx.lkeys), and the peer's backup rkeys known so far are handed over with the ledger; a post naming
an rkey not handed over comes back here (FAST_NOT_FAST), is looked up and posted, and the ledger goes back
with the key. Whatever the failover
layer does to a QP starts with `take`, under the context's lock: the core's entries become the Python
Ledger's, and the QP is Python's until `give` hands them back, which it does only in the steady state.
The core gives the ledger up by itself when it meets anything unusual, and leaves that completion for
the failover layer (ShiftContext._deferred). It also fails a QP over by itself (fast_switch.c) and says so
in the QP's news, which `take` follows first (ShiftQP.sync), so the ledger comes with the states it is in.
"""

from __future__ import annotations

import errno
from functools import partial
from typing import TYPE_CHECKING, Any

from libshift.core._core import FAST_NEW_RKEY, FAST_POSTED, FAST_QUEUE_FULL
from libshift.shift.paths import depth
from libshift.shift.rewind import Entry
from libshift.shift.states import HELD, Send
from libshift.verbs import RecvWR, SendWR, VerbsRDMAError, ibv_wc_status, ibv_wr_opcode

if TYPE_CHECKING:
    from libshift.shift.qp import ShiftQP

STEADY = frozenset({Send.DEFAULT, Send.PLAIN, Send.FALLBACK})  # connected on the path in use, nothing held


def take(qp: ShiftQP) -> None:
    """Make the ledger Python's (a no-op when it is already), after following the switches the core made."""
    if not qp.fast_owned:
        return
    qp.fast_owned = False
    exported = False
    while exported is False:  # the core may switch it on the link watch's thread until it is taken
        qp.switcher.follow_core()
        exported = qp.fast.export()
    if exported is None:  # closed
        return
    next_id, sent_two_sided, received, sends, receives = exported
    ledger = qp.ledger
    ledger.next_id, ledger.sent_two_sided, ledger.received = next_id, sent_two_sided, received
    for fields in sends + receives:
        entry = _entry(qp, fields)
        (ledger.sq if entry.is_send else ledger.rq).entries.append(entry)
        ledger.by_id[entry.wr_id] = entry


def give(qp: ShiftQP) -> None:
    """Hand the ledger to the fast path if the QP is in its steady state and every entry fits there."""
    ledger = qp.ledger
    steady = qp.states.send in STEADY and qp.doubt.path is None
    if qp.fast_owned or not steady:
        return
    current = qp.current
    entries = [*ledger.sq.entries, *ledger.rq.entries]
    if any(e.slot is not None or (e.wc is None and (not e.posted or e.path != current)) for e in entries):
        return  # an inline copy in the Python pool, or a WR outstanding elsewhere: not steady yet
    path = depth(current)
    fields = [_fields(qp, e) for e in entries]
    if not qp.fast.import_ledger(path, ledger.next_id, ledger.sent_two_sided, ledger.received, fields):
        return
    qp.fast_owned = True
    ledger.sq.entries.clear()
    ledger.rq.entries.clear()
    ledger.by_id.clear()


def posted(qp: ShiftQP, got: int, wr: SendWR | RecvWR, send: bool) -> None:
    """What the fast path said of a post it took: done, or the refusal to raise."""
    if got == FAST_POSTED:
        return
    if got == FAST_NEW_RKEY:  # fetch the peer's backup keys now, so that a switch (the core's too) finds them
        if isinstance(wr, SendWR) and qp.ctx.keys is not None and qp.remote is not None:
            qp.ctx.keys.prefetch(qp.remote.gid, wr.rkey)
        return
    if got == FAST_QUEUE_FULL:
        which = "send" if send else "receive"
        raise VerbsRDMAError(f"QP {qp.qp_num}: {which} queue full", errno.ENOMEM)
    raise qp.primary.impl.refused(qp.fast.refusal, wr, send)


def follow_keys(qp: ShiftQP) -> None:
    """The peer's backup rkeys into the QP's maps in the core as they are found, those kept already
    first: for a post on a backup path, or a switch made in the core."""
    if qp.ctx.keys is not None and qp.remote is not None:
        qp.ctx.keys.follow(qp.remote.gid, partial(_chain_found, qp.fast))


def _chain_found(fast: Any, rkey: int, chain: list[int]) -> bool:
    """The peer's rkeys on its backups for its default `rkey`, into the QP's maps in the core (on the
    finding thread: each call holds the interpreter lock, which serializes the fast path); False once the
    QP is closed."""
    return all(fast.set_rkey(path, rkey, backup) for path, backup in enumerate(chain, 1))


def _entry(qp: ShiftQP, fields: tuple) -> Entry:
    (is_send, wr_id, app_id, opcode, flags, imm, rkey, remote_addr, compare_add, swap, sg, signaled, index,
     posted, wc, failed_with, kept) = fields  # fmt: skip
    if is_send:
        wr: SendWR | RecvWR = SendWR(
            app_id, ibv_wr_opcode(opcode), None, imm, sg, flags, remote_addr, rkey, compare_add, swap
        )
    else:
        wr = RecvWR(app_id, None, sg)
    # posted on the path in use: the fast path posts only there, and a switch in Python takes the ledger
    # before it moves; in the middle of the core's switch (HELD) the sends wait for the peer's count
    held = is_send and qp.states.send in HELD
    path = qp.current if posted and not held else None
    entry = Entry(wr_id, wr, signaled, None if index < 0 else index, path, posted, wc)
    entry.failed_with = ibv_wc_status(failed_with) if failed_with else None
    if kept is not None and isinstance(wr, SendWR) and qp.states.live:
        pds = {path: path_qp.pd for path, path_qp in qp.qps.items()}
        entry.slot = qp.ctx.inline.keep(wr, pds, qp.primary.cap.max_inline_data, kept)
    return entry


def _fields(qp: ShiftQP, e: Entry) -> tuple:
    wr = e.wr
    failed = 0 if e.failed_with is None else int(e.failed_with)
    index = -1 if e.index is None else e.index
    if isinstance(wr, SendWR):
        return (True, e.wr_id, wr.wr_id, int(wr.opcode), int(wr.send_flags), wr.imm_data, wr.rkey,
                wr.remote_addr, wr.compare_add, wr.swap, wr.sg, e.signaled, index, e.posted, e.wc, failed,
                None)  # fmt: skip
    return (
        False,
        e.wr_id,
        wr.wr_id,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        wr.sg,
        e.signaled,
        index,
        e.posted,
        e.wc,
        failed,
        None,
    )
