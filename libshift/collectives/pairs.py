"""Point to point (torch's send and recv): one ShiftQP per peer, connected when it is first used.

Each side of a pair has a staging area of SLOTS slots of CHUNK bytes, registered once with the QP (as the
ring's are: a key that lives as long as the QP is one the failover layer looks up once). A send is cut into
chunks; each goes, behind a header (the message's size and tag), from a slot of the sender's outbox into
the same slot of the receiver's staging by RDMA_WRITE_WITH_IMM (the immediate: the chunk's number, as a
check). The receiver copies the chunks of a message into the array of its oldest receive from that peer,
and hands the slots back with a zero-byte SEND_WITH_IMM (the immediate: slots freed). So a send goes as soon
as there is room (SLOTS chunks ahead of the receives: small sends do not wait for their receive, as with
gloo), and a sender has at most SLOTS chunks not handed back, so no slot is overwritten before it is read.
Sends and receives between two ranks pair up in the order they were made, as MPI's do; a receive whose
message has another size or tag fails, naming what came, and the message is dropped.

A message of at least DIRECT_MIN bytes goes straight from the sender's array into the receiver's once
the receiver has announced where that is (direct.py).

The caller's thread posts its transfer (a hand-off to a thread and back cost more than a small message
does); a thread of its own carries every transfer on from its completions (connecting, copying, writing
the next chunks), so a send and a receive that are both posted before either is waited for
(batch_isend_irecv, a pipeline's exchange) make progress. The peers' state is the thread's, under a lock
that a posting caller takes too; the caller is told of the end of each transfer through the callback it
gave, on the thread that saw it end. A peer is connected through the store when
both ranks have used it: each publishes its QP's endpoint and staging at its first transfer with the other,
and the thread looks for the peer's between its waits. While transfers wait, the thread also looks at the
ring's alarm: a rank that found a host with no path left fails them all with its word.
"""

from __future__ import annotations

import json
import logging
import threading

import numpy as np

from libshift.collectives import direct
from libshift.collectives.buffers import Buffers
from libshift.collectives.errors import CHECK_EVERY, Alarm, CollectiveError, NoPathLeft
from libshift.collectives.peer import (
    ACCESS,
    ANNOUNCE_WR,
    ANNOUNCED,
    CHUNK,
    DIRECT,
    DIRECT_WR,
    HEADER,
    MAIL_SLOT,
    MAILBOX,
    NUMBER,
    PAYLOAD,
    RECEIVES,
    SLOTS,
    Done,
    Peer,
    Transfer,
)
from libshift.collectives.store import Store
from libshift.shift import ShiftCompChannel, ShiftContext, ShiftCQ, ShiftMR, ShiftPD, ShiftQP
from libshift.verbs import SGE, WC, Endpoint, QPAttr, QPCap, QPInitAttr, RecvWR, SendWR
from libshift.verbs import enums as e

log = logging.getLogger("libshift.collectives")
QP_TIMEOUT = 16  # as the ring's: a loaded machine is not a dead link
# while a peer has not published its endpoint, the store is looked at after this, doubling up to CHECK_EVERY
# (a peer that never comes costs a few looks a second)
CONNECT_POLL = 0.002
SUCCESS = e.ibv_wc_status.IBV_WC_SUCCESS


class Pairs:
    """`send(array, peer, tag, done)` and `recv(...)`: posted at once, carried on by the thread."""

    def __init__(
        self, ctx: ShiftContext, pd: ShiftPD, alarm: Alarm, store: Store, prefix: str, timeout: float
    ) -> None:
        self.ctx, self.pd, self.alarm, self.store, self.prefix = ctx, pd, alarm, store, prefix
        self.rank, self.timeout = alarm.rank, timeout
        self.channel = ShiftCompChannel(ctx)
        self.cq = ShiftCQ(ctx, 4 * RECEIVES, channel=self.channel)
        self.buffers = Buffers(pd)  # the arrays of direct messages, registered (used under the lock)
        self.peers: dict[int, Peer] = {}
        # the peers' state is the thread's, but for the caller that posts its own transfer (no hand-off)
        self._lock = threading.RLock()
        self._closing = False
        self._fault: Exception | None = None  # met by a caller posting: the thread stops on it
        self._broken: CollectiveError | None = None  # set when the thread stopped
        self._thread = threading.Thread(target=self._run, name=f"shift-p2p-r{self.rank}", daemon=True)
        self._thread.start()

    def send(self, array: np.ndarray, peer: int, tag: int, done: Done) -> None:
        self._order("send", Transfer(peer, tag, array.reshape(-1).view(np.uint8), done))

    def recv(self, array: np.ndarray, peer: int, tag: int, done: Done) -> None:
        self._order("recv", Transfer(peer, tag, array.reshape(-1).view(np.uint8), done))

    def _order(self, kind: str, transfer: Transfer) -> None:
        """Post the transfer on the caller's thread (a hand-off to the thread and back cost more than a small
        message); the thread carries it on from its completions."""
        with self._lock:
            if self._broken is not None:
                raise self._broken
            try:
                self._take(kind, transfer)
            except Exception as exc:
                self._fault = exc
            peer = self.peers.get(transfer.peer)
            if self._fault is not None or (peer is not None and not peer.connected):
                self.channel.notify(self.cq)  # the thread stops on the fault, or connects the peer

    def close(self) -> None:
        """Stop the thread; a transfer not ended by then ends with an error (nobody waits for it for good)."""
        with self._lock:
            self._closing = True
        self.channel.notify(self.cq)
        self._thread.join(timeout=self.timeout)
        for peer in self.peers.values():
            for obj in (peer.qp, peer.staging, peer.outbox, peer.mailbox):
                obj.close()
        self.buffers.close()
        self.cq.close()
        self.channel.close()  # its eventfd, and the context's fast path, which waits for it

    # -- the thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
            broken = CollectiveError(f"rank {self.rank}: closed before the transfer ended")
        except Exception as exc:  # a fault here must not leave the callers waiting for good
            log.exception("rank %d: point to point stopped", self.rank)
            broken = CollectiveError(f"rank {self.rank}: point to point stopped: {exc!r}")
        with self._lock:
            self._broken = broken
            for peer in self.peers.values():
                self._fail_all(peer, broken)

    def _serve(self) -> None:
        poll = CONNECT_POLL
        while True:
            with self._lock:
                if self._fault is not None:
                    raise self._fault
                if self._closing:
                    return
                waiting = [q for q, peer in self.peers.items() if not peer.connected]
                for q in waiting:
                    self._try_connect(q)
            poll = min(2 * poll, CHECK_EVERY) if waiting else CONNECT_POLL
            wcs = self._completions(poll if waiting else CHECK_EVERY)
            with self._lock:
                for wc in wcs:
                    self._on_completion(wc)
                if not wcs:
                    self._look_at_alarm()

    def _take(self, kind: str, transfer: Transfer) -> None:
        try:
            peer = self._peer(transfer.peer)
        except Exception as exc:  # the QP could not be made: this transfer fails, the others go on
            why = f"rank {self.rank}: {transfer.what(kind)} with rank {transfer.peer}: {exc}"
            transfer.done(CollectiveError(why))
            return
        if peer.lost_while_idle():  # the job needs the link after all: it cannot go on
            transfer.done(self.alarm.raise_for(f"the link to rank {transfer.peer} is gone: {peer.lost}"))
            return
        if kind == "send":
            transfer.number, peer.sends_made = peer.sends_made, peer.sends_made + 1
            peer.sends.append(transfer)
        else:
            transfer.number, peer.recvs_made = peer.recvs_made, peer.recvs_made + 1
            peer.recvs.append(transfer)
        self._advance(transfer.peer)

    def _peer(self, q: int) -> Peer:
        """The peer's QP and staging, made and published at the first transfer with it (connected later)"""
        peer = self.peers.get(q)
        if peer is None:
            cap = QPCap(max_send_wr=2 * SLOTS + 2 * MAILBOX + 2, max_recv_wr=RECEIVES)
            qp = ShiftQP(self.pd, QPInitAttr(scq=self.cq, rcq=self.cq, cap=cap))
            staging = ShiftMR(self.pd, SLOTS * CHUNK, ACCESS)
            mailbox = ShiftMR(self.pd, 2 * MAILBOX * MAIL_SLOT, ACCESS)
            peer = Peer(qp, staging, ShiftMR(self.pd, SLOTS * CHUNK, ACCESS), mailbox)
            self.peers[q] = peer
            mine = {
                "qp": qp.endpoint().to_json(),
                "staging": [staging.buf, staging.rkey],
                "mailbox": [mailbox.buf, mailbox.rkey],
            }
            self.store.set(self._key(self.rank, q), json.dumps(mine).encode())
        return peer

    def _key(self, source: int, target: int) -> str:
        return f"{self.prefix}/p2p/{source}-{target}"

    def _try_connect(self, q: int) -> None:
        key = self._key(q, self.rank)
        if not self.store.check([key]):
            return
        peer = self.peers[q]
        theirs = json.loads(self.store.get(key))
        address, rkey = theirs["staging"]
        peer.target = (address, rkey)
        address, rkey = theirs["mailbox"]
        peer.mail_target = (address, rkey)
        attr = QPAttr(qp_access_flags=ACCESS, timeout=QP_TIMEOUT, min_rnr_timer=1)
        peer.qp.connect(Endpoint.from_json(theirs["qp"]), attr)
        for _ in range(RECEIVES):
            peer.qp.post_recv(RecvWR())
        peer.connected = True
        self._advance(q)

    # -- moving bytes ----------------------------------------------------------------------------------

    def _advance(self, q: int) -> None:
        """Copy what has landed into the receives, hand the slots back, write what there is room for."""
        peer = self.peers[q]
        if not peer.connected:
            return
        while peer.consumed < peer.arrived and self._consume(peer, q):
            pass
        direct.announce(peer, self.buffers)
        if peer.owed and peer.handing < SLOTS:
            peer.qp.post_send(SendWR(opcode=e.IBV_WR_SEND_WITH_IMM, imm_data=peer.owed))
            peer.owed = 0
            peer.handing += 1
        while peer.sends:
            if direct.write(peer, self.buffers):
                continue
            if not (peer.credits and peer.written - peer.completed < SLOTS):
                break
            self._write_chunk(peer)

    def _consume(self, peer: Peer, q: int) -> bool:
        """Take the oldest chunk landed: into the oldest receive, or dropped; whether it was taken."""
        at = peer.consumed % SLOTS * CHUNK
        view = np.frombuffer(peer.staging.view, np.uint8, CHUNK, at)
        size, tag = HEADER.unpack_from(peer.staging.view, at)
        if peer.message is None:  # a message begins
            if not peer.recvs:
                return False  # it waits for its receive
            recv = peer.recvs[0]
            peer.message, peer.dropping = (size, tag, 0), (size, tag) != (recv.data.nbytes, recv.tag)
            if peer.dropping:
                peer.recvs.popleft()
                came = f"from rank {q} met a send of {size} bytes with tag {tag}"
                recv.done(CollectiveError(f"rank {self.rank}: {recv.what('receive')} {came}"))
        size, tag, taken = peer.message
        piece = min(PAYLOAD, size - taken)
        if not peer.dropping:
            recv = peer.recvs[0]
            recv.data[taken : taken + piece] = view[HEADER.size : HEADER.size + piece]
        taken += piece
        peer.consumed += 1
        peer.owed += 1
        if taken < size:
            peer.message = (size, tag, taken)
            return True
        peer.message = None
        if not peer.dropping:
            peer.recvs.popleft().done(None)
        peer.dropping = False
        return True

    def _write_chunk(self, peer: Peer) -> None:
        send = peer.sends[0]
        n = peer.written
        at = n % SLOTS * CHUNK
        piece = min(PAYLOAD, send.data.nbytes - send.offset)
        HEADER.pack_into(peer.outbox.view, at, send.data.nbytes, send.tag)
        box = np.frombuffer(peer.outbox.view, np.uint8, CHUNK, at)
        box[HEADER.size : HEADER.size + piece] = send.data[send.offset : send.offset + piece]
        send.offset += piece
        address, rkey = peer.target
        peer.qp.post_send(
            SendWR(
                wr_id=n, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, imm_data=n & NUMBER,
                sg=[SGE(peer.outbox.buf + at, HEADER.size + piece, peer.outbox.lkey)],
                remote_addr=address + at, rkey=rkey,
            )
        )  # fmt: skip
        peer.written += 1
        peer.credits -= 1
        if send.offset == send.data.nbytes:  # the last chunk (an empty message has only a header)
            peer.last_chunks[n] = peer.sends.popleft()
            peer.announcements.pop(send.number, None)  # one that came too late

    def _completions(self, wait: float) -> list[WC]:
        """The completions there are, else those after a wait on the channel (the lock not held: a caller
        may post meanwhile)."""
        with self._lock:
            _, wcs = self.cq.poll(RECEIVES)
            if wcs:
                return wcs
            self.cq.req_notify()
            _, wcs = self.cq.poll(RECEIVES)
            if wcs:
                return wcs
        try:
            self.channel.get_cq_event(timeout=wait)
        except TimeoutError:
            return []
        with self._lock:
            return self.cq.poll(RECEIVES)[1]

    def _on_completion(self, wc: WC) -> None:
        q = next((q for q, p in self.peers.items() if p.qp.qp_num == wc.qp_num), None)
        if q is None:
            return
        peer = self.peers[q]
        if wc.status != SUCCESS:
            self._fail(q, wc)
            return
        if wc.opcode == e.ibv_wc_opcode.IBV_WC_RECV_RDMA_WITH_IMM:
            self._landed(peer, q, wc.imm_data)
            peer.qp.post_recv(RecvWR())
        elif wc.opcode == e.ibv_wc_opcode.IBV_WC_RECV:  # slots handed back
            peer.credits += wc.imm_data
            peer.qp.post_recv(RecvWR())
        elif wc.opcode == e.ibv_wc_opcode.IBV_WC_SEND:  # a hand-back went
            peer.handing -= 1
        elif wc.opcode == e.ibv_wc_opcode.IBV_WC_RDMA_WRITE:
            self._written(peer, wc.wr_id)
        self._advance(q)

    def _landed(self, peer: Peer, q: int, imm: int) -> None:
        """A write from the peer landed: an announcement, a direct message's end, or a chunk."""
        if imm & ANNOUNCED:
            direct.take_announcement(peer, imm & NUMBER)
        elif imm & DIRECT:
            recv = peer.recvs[0] if peer.recvs else None
            if recv is None or recv.region is None or recv.number & NUMBER != imm & NUMBER:
                expected = "none" if recv is None else recv.number
                raise CollectiveError(
                    f"message {imm & NUMBER} came direct from rank {q}, expected {expected}"
                )
            peer.message = None  # its staged beginning, if any, was taken before: completions come in order
            peer.recvs.popleft().done(None)
        else:
            if imm != peer.arrived & NUMBER:
                raise CollectiveError(f"chunk {imm} came from rank {q}, expected {peer.arrived & NUMBER}")
            peer.arrived += 1

    def _written(self, peer: Peer, wr_id: int) -> None:
        """A write of ours was acknowledged: a direct message (it ended), an announcement, or a chunk."""
        if wr_id & DIRECT_WR:
            peer.direct.pop(wr_id & ~DIRECT_WR).done(None)
        elif wr_id & ANNOUNCE_WR:
            peer.announcing.discard(wr_id & ~ANNOUNCE_WR)
        else:
            peer.completed = wr_id + 1
            send = peer.last_chunks.pop(wr_id, None)
            if send is not None:
                send.done(None)

    def _look_at_alarm(self) -> None:
        """Between waits, as the ring does: when a rank found a host with no path left, every transfer
        still waiting fails with its word (a peer that left with its host may never answer)."""
        if all(peer.idle for peer in self.peers.values()):
            return
        try:
            self.alarm.check()
        except NoPathLeft as exc:
            for peer in self.peers.values():
                self._fail_all(peer, exc)

    def _fail(self, q: int, wc: WC) -> None:
        """A work request with the peer failed: so do all transfers with it (its QP's state is unknown)."""
        peer = self.peers[q]
        if peer.lost_while_idle():
            return  # the receives it keeps posted, flushing: nothing to end, no alarm
        if peer.qp.lost_paths is not None:  # every rank hears of it, as from the ring
            why = f"the link to rank {q} is gone: {peer.qp.lost_paths}"
            error: CollectiveError = self.alarm.raise_for(why)
        else:
            try:
                self.alarm.check()  # the peer may have gone with a host another rank found lost
                status = e.ibv_wc_status(wc.status).name
                error = CollectiveError(f"rank {self.rank}: the link to rank {q} failed: {status}")
            except NoPathLeft as exc:
                error = exc
        if not self._fail_all(peer, error):
            log.debug("rank %d: the QP to rank %d failed with nothing in flight (%s)", self.rank, q, error)

    @staticmethod
    def _fail_all(peer: Peer, error: BaseException) -> bool:
        """End every transfer with `peer` with `error`; whether there was any."""
        pending = [*peer.sends, *peer.recvs, *peer.last_chunks.values(), *peer.direct.values()]
        for transfer in pending:
            transfer.done(error)
        peer.sends.clear()
        peer.recvs.clear()
        peer.last_chunks.clear()
        peer.direct.clear()
        return bool(pending)
