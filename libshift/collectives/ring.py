"""The ring transport: a ShiftQP to the right neighbour, one from the left, staging slots, and credits.

Data goes right as RDMA_WRITE_WITH_IMM (the immediate is the chunk's number, as a check, and whether it
went to a staging slot). A chunk to be combined goes into one of the right neighbour's staging slots (chunk
n into slot n mod SLOTS); the receiver combines it into the collective's memory, straight from the slot. In
a plan of large chunks, a chunk the receiver only copies is written straight into its place in the
receiver's memory (direct placement): at the start of such a collective the receiver announces where that
memory is (a small write into its left neighbour's mailbox, naming the collective), and the sender writes
there once it has the announcement; until then it stages those chunks too, rather than wait.
The receiver hands chunks back with a zero-byte SEND_WITH_IMM (immediate: chunks freed), batched; a sender
has at most SLOTS chunks not yet handed back, so no slot is overwritten before it is used and no receive
queue runs dry. Counts run over the Communicator's whole life: a neighbour already in the next collective
may fill free slots, which stay put until this rank gets there (it cannot place anything directly before
this rank has announced). The QPs are ShiftQPs, so a NIC failure moves them to the backup NIC beneath this
code; two-sided messages arrive exactly once and in order either way. Closing, a rank first sends each
neighbour a farewell (a SEND_WITH_IMM of 0) and waits for theirs, so that no neighbour still waits for an
acknowledgement from a QP that is going away.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections import deque
from typing import TypeVar

import numpy as np

from libshift.collectives import ops
from libshift.collectives.buffers import Buffers, Region
from libshift.collectives.errors import CHECK_EVERY, Alarm, CollectiveError
from libshift.collectives.order import ring_ranks
from libshift.collectives.plan import Apply, Plan, Recv, Send
from libshift.collectives.store import Store
from libshift.shift import ShiftCompChannel, ShiftContext, ShiftCQ, ShiftMR, ShiftPD, ShiftQP
from libshift.verbs import SGE, WC, Endpoint, QPAttr, QPCap, QPInitAttr, RecvWR, SendWR, VerbsError
from libshift.verbs import enums as e

T = TypeVar("T")
log = logging.getLogger("libshift.collectives")
CHUNK = 4 << 20  # bytes a message carries at most: one staging slot
SLOTS = 4  # chunks in flight on one link at most (staging slots per rank)
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
ROOM = 8  # spare work requests per queue beyond the slots
RECEIVES = 2 * SLOTS + 2  # receives posted per QP, topped up SLOTS at a time (at least SLOTS + 3 stay posted:
# SLOTS chunks or credits, an announcement, a farewell)
QP_TIMEOUT = 16  # ack deadline 4.096 us * 2**16 = 0.27 s a try: a loaded machine is not a dead link
SUCCESS = e.ibv_wc_status.IBV_WC_SUCCESS
WRITE_ARRIVED = e.ibv_wc_opcode.IBV_WC_RECV_RDMA_WITH_IMM  # data from the left, announcements from the right
MESSAGE_ARRIVED = e.ibv_wc_opcode.IBV_WC_RECV  # a credit from the right, or a farewell from either side
FAREWELL = 0  # the immediate of a farewell (a credit always frees at least one slot)
FAREWELL_PATIENCE = 10.0
ANNOUNCEMENT = struct.Struct("<QQI")  # where COPY chunks go: address, length, rkey (the immediate: the run)
MASK32 = 0xFFFFFFFF
STAGED = 1 << 31  # in a chunk's immediate: it is in a staging slot (else placed directly)
CHUNK_MASK = STAGED - 1  # in a chunk's immediate: its number
SIGNALED = e.IBV_SEND_SIGNALED
INLINE_FLAG = e.IBV_SEND_INLINE
INLINE = 256  # a chunk this small goes inline: copied into the work request, so the call need not wait for
# its acknowledgement before the caller has its memory back (errors surface at the next call, as gloo's do)


class Ring:
    """This rank's place in the ring; `run(plan, ...)` moves a plan's chunks through it."""

    def __init__(
        self, store: Store, rank: int, world_size: int, device: str, prefix: str, timeout: float
    ) -> None:
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.alarm = Alarm(store, prefix, rank)  # every rank hears when one finds no path left
        self.ctx = ShiftContext(name=device)
        self.pd = ShiftPD(self.ctx)
        self.channel = ShiftCompChannel(self.ctx)
        self.cq = ShiftCQ(self.ctx, 4 * (SLOTS + ROOM), channel=self.channel)
        cap = QPCap(max_send_wr=SLOTS + ROOM, max_recv_wr=SLOTS + ROOM, max_inline_data=INLINE)
        self.right = ShiftQP(self.pd, QPInitAttr(scq=self.cq, rcq=self.cq, cap=cap))
        self.left = ShiftQP(self.pd, QPInitAttr(scq=self.cq, rcq=self.cq, cap=cap))
        self.staging = ShiftMR(self.pd, SLOTS * CHUNK, ACCESS)
        self._staged = np.frombuffer(self.staging.view, np.uint8)
        # [0]: the right neighbour's announcement lands here; [1]: ours is written from here
        self.mailbox = ShiftMR(self.pd, 2 * ANNOUNCEMENT.size, ACCESS)
        self.buffers = Buffers(self.pd)
        self.runs = 0  # collectives started
        self.sent = self.credits = self.completed = 0  # chunks written; handed back; acknowledged
        self.arrived = self.consumed = 0  # chunks landed here; applied and handed back
        self._landed: deque[tuple[int, bool]] = deque()  # the chunks landed, not yet applied: size, staged
        self.announced: deque[tuple[int, int, int, int]] = deque()  # the right's: run, address, length, rkey
        self._unclaimed: set[int] = set()  # runs whose announcement is still to come, not to be used
        self.owed = self.crediting = 0  # chunks applied but not yet handed back; credit messages in flight
        self.farewells: set[int] = set()  # the QPs on which the neighbour said it is done
        self._recv = RecvWR()  # every receive is the same zero-byte one (the QP keeps its own copy)
        self._used: dict[int, int] = {}  # per QP: receives used since it was last topped up
        try:
            self.order = self._find_order(store, prefix)  # position -> rank (order.py)
            self.position = self.order.index(rank)
            self._staging_at, self._mailbox_at = self._connect(store, prefix)
        except BaseException:
            self.close(farewell=False)
            raise

    def _find_order(self, store: Store, prefix: str) -> list[int]:
        """Swap the GIDs of the NICs this rank's context opened with every rank: the ring's order."""
        gids = sorted({str(device.query_gid()) for device in self.ctx.devices.values()})
        store.set(f"{prefix}/nics/{self.rank}", json.dumps(gids).encode())
        return ring_ranks([json.loads(store.get(f"{prefix}/nics/{q}")) for q in range(self.world_size)])

    def in_order(self, per_rank: list[T]) -> list[T]:
        """`per_rank` (one item per rank) in ring order: what the plans take."""
        return [per_rank[rank] for rank in self.order]

    def _connect(self, store: Store, prefix: str) -> tuple[tuple[int, int], tuple[int, int]]:
        """Swap endpoints, staging and mailbox keys with both neighbours, connect, and wait until both are
        ready; the right neighbour's staging and the left neighbour's mailbox (address, rkey)."""
        mine = {
            "right": self.right.endpoint().to_json(),
            "left": self.left.endpoint().to_json(),
            "staging": [self.staging.buf, self.staging.rkey, SLOTS, CHUNK],
            "mailbox": [self.mailbox.buf, self.mailbox.rkey],
        }
        store.set(f"{prefix}/ring/{self.rank}", json.dumps(mine).encode())
        n = self.world_size
        right_rank, left_rank = self.order[(self.position + 1) % n], self.order[(self.position - 1) % n]
        right = json.loads(store.get(f"{prefix}/ring/{right_rank}"))
        left = json.loads(store.get(f"{prefix}/ring/{left_rank}"))
        addr, rkey, slots, chunk = right["staging"]
        if (slots, chunk) != (SLOTS, CHUNK):
            raise ValueError(f"rank {right_rank} stages {slots} x {chunk} bytes, this rank {SLOTS} x {CHUNK}")
        for qp, peer in ((self.right, right["left"]), (self.left, left["right"])):
            attr = QPAttr(qp_access_flags=ACCESS, timeout=QP_TIMEOUT, min_rnr_timer=1)
            qp.connect(Endpoint.from_json(peer), attr)
            for _ in range(RECEIVES):
                qp.post_recv(self._recv)
            self._used[qp.qp_num] = 0
        store.set(f"{prefix}/ready/{self.rank}", b"1")
        store.get(f"{prefix}/ready/{right_rank}")
        store.get(f"{prefix}/ready/{left_rank}")
        mailbox_addr, mailbox_rkey = left["mailbox"]
        return (addr, rkey), (mailbox_addr, mailbox_rkey)

    @property
    def resilient(self) -> bool:
        return self.ctx.resilient

    # -- one collective ----------------------------------------------------------------------------------

    def run(self, plan: Plan, region: Region, dtype: np.dtype, op: ops.ReduceOp) -> None:
        """Send and apply every chunk of `plan` (offsets into `region`), each send as soon as its chunk is
        ready and the receiver has room; return when every chunk is applied and every write acknowledged (so
        the region's bytes are the caller's again), or only posted when every one went inline."""
        sends, recvs = plan.sends, plan.recvs
        run = self.runs
        self.runs += 1
        if plan.direct and any(recv.apply == Apply.COPY for recv in recvs):
            self._announce(run, region.mr)
        target: tuple[int, int, int] | None = None  # the right neighbour's memory for COPY chunks
        first_send, first_recv = self.sent, self.consumed
        posted = applied = 0
        acked = any(send.nbytes > INLINE for send in sends)  # whether to wait for the acknowledgements
        deadline = time.monotonic() + self.timeout
        while (
            applied < len(recvs)
            or posted < len(sends)
            or self.owed
            or (acked and self.completed - first_send < len(sends))
        ):
            moved = False
            while posted < len(sends) and sends[posted].after < applied and self.sent - self.credits < SLOTS:
                send = sends[posted]
                if plan.direct and send.apply == Apply.COPY and target is None and self.announced:
                    target = self._target(run)
                if plan.direct and send.apply == Apply.COPY and target is not None:
                    self._write_direct(send, region.mr, target, last=posted == len(sends) - 1)
                else:
                    self._write_staged(send, region.mr, last=posted == len(sends) - 1)
                posted += 1
                moved = True
            if applied < len(recvs) and self.arrived > self.consumed:
                self._apply(recvs[applied], region.data, dtype, op)
                applied += 1
                moved = True
                if self.arrived > self.consumed and self.owed < SLOTS // 2:
                    continue  # the next chunk is here too: hand both back in one credit
            self._hand_back()
            if self._poll(block=not moved, deadline=deadline) or moved:
                deadline = time.monotonic() + self.timeout
        assert self.consumed - first_recv == len(recvs)
        if target is None and plan.direct and any(send.apply == Apply.COPY for send in sends):
            self._unclaim(run)

    def _unclaim(self, run: int) -> None:
        """Every chunk of `run` went staged: its announcement, here already or still to come, goes unused."""
        if self.announced:
            self._target(run)  # the oldest one is this run's (checked)
        else:
            self._unclaimed.add(run & MASK32)

    def _announce(self, run: int, mr: ShiftMR) -> None:
        """Tell the left neighbour where this run's COPY chunks go: `mr`, with the run's number."""
        ANNOUNCEMENT.pack_into(self.mailbox.view, ANNOUNCEMENT.size, mr.buf, mr.length, mr.rkey)
        addr, rkey = self._mailbox_at
        wr = SendWR(
            opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM,
            sg=[SGE(self.mailbox.buf + ANNOUNCEMENT.size, ANNOUNCEMENT.size, self.mailbox.lkey)],
            imm_data=run & MASK32,
            remote_addr=addr,
            rkey=rkey,
            send_flags=0,
        )
        self.left.post_send(wr)

    def _target(self, run: int) -> tuple[int, int, int]:
        """The right neighbour's announced memory for `run`: address, length, rkey."""
        theirs, addr, length, rkey = self.announced.popleft()
        if theirs != run & MASK32:
            raise CollectiveError(
                f"rank {self.rank}: the right neighbour announced collective {theirs} in this rank's "
                f"{run & MASK32}: do all ranks call the same collectives with arrays of the same size?"
            )
        return addr, length, rkey

    def _write_direct(self, send: Send, mr: ShiftMR, target: tuple[int, int, int], last: bool) -> None:
        addr, length, rkey = target
        if send.offset + send.nbytes > length:
            raise CollectiveError(
                f"rank {self.rank}: bytes {send.offset}..{send.offset + send.nbytes} go beyond the right "
                f"neighbour's {length}: do all ranks call the same collectives with arrays of the same size?"
            )
        self._write(send, mr, addr + send.offset, rkey, last, staged=False)

    def _write_staged(self, send: Send, mr: ShiftMR, last: bool) -> None:
        addr, rkey = self._staging_at
        self._write(send, mr, addr + self.sent % SLOTS * CHUNK, rkey, last, staged=True)

    def _write(self, send: Send, mr: ShiftMR, remote_addr: int, rkey: int, last: bool, staged: bool) -> None:
        """Write chunk number `self.sent`; only a run's last write is signaled (completions come in order,
        so its completion says that every write before it is acknowledged too)."""
        wr = SendWR(
            wr_id=self.sent,
            opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM,
            sg=[SGE(mr.buf + send.offset, send.nbytes, mr.lkey)],
            imm_data=self.sent & CHUNK_MASK | (STAGED if staged else 0),
            remote_addr=remote_addr,
            rkey=rkey,
            send_flags=(SIGNALED if last else 0) | (INLINE_FLAG if send.nbytes <= INLINE else 0),
        )
        self.right.post_send(wr)
        self.sent += 1

    def _apply(self, recv: Recv, data: np.ndarray, dtype: np.dtype, op: ops.ReduceOp) -> None:
        """Use the oldest chunk landed on `data` (a chunk placed directly is already there); the slot is
        owed to the left neighbour from then on."""
        got, staged = self._landed.popleft()
        if got != recv.nbytes:
            raise CollectiveError(
                f"rank {self.rank}: a chunk of {got} bytes came from the left neighbour, {recv.nbytes} "
                "expected: do all ranks call the same collectives with arrays of the same size?"
            )
        if staged:
            start = self.consumed % SLOTS * CHUNK
            incoming = self._staged[start : start + recv.nbytes]
            target = data[recv.offset : recv.offset + recv.nbytes]
            if recv.apply == Apply.COPY:
                np.copyto(target, incoming)
            else:
                ops.combine(op, incoming.view(dtype), target.view(dtype))
                if recv.apply == Apply.FINAL:
                    ops.finish(op, target.view(dtype), self.world_size)
        self.consumed += 1
        self.owed += 1

    def _hand_back(self) -> None:
        """Return the chunks applied to the left neighbour in one credit, unless SLOTS credits are already
        on their way: then later, together (so the credits in flight never outgrow the send queue)."""
        if self.owed and self.crediting < SLOTS:
            self.left.post_send(SendWR(opcode=e.IBV_WR_SEND_WITH_IMM, imm_data=self.owed))
            self.crediting += 1
            self.owed = 0

    def _poll(self, block: bool, deadline: float) -> bool:
        """Take the completions there are (waiting up to CHECK_EVERY for one if `block`, then looking at the
        alarm); whether any came."""
        wcs = self._completions(min(deadline - time.monotonic(), CHECK_EVERY) if block else 0.0)
        if not wcs and block:
            self.alarm.check()
            if time.monotonic() >= deadline:
                raise CollectiveError(f"rank {self.rank}: no progress from the ring in {self.timeout:g} s")
        for wc in wcs:
            self._on_completion(wc)
        return bool(wcs)

    def _completions(self, wait: float) -> list[WC]:
        """The completions there are; if none, the first to come within `wait` seconds (or none)."""
        _, wcs = self.cq.poll(4 * SLOTS)
        if wcs or wait <= 0:
            return wcs
        self.cq.req_notify()
        _, wcs = self.cq.poll(4 * SLOTS)
        if not wcs:
            try:
                self.channel.get_cq_event(timeout=wait)
            except TimeoutError:
                return []
            _, wcs = self.cq.poll(4 * SLOTS)
        return wcs

    def _on_completion(self, wc: WC) -> None:
        if wc.status != SUCCESS:
            side, qp = ("right", self.right) if wc.qp_num == self.right.qp_num else ("left", self.left)
            if qp.lost_paths is not None:
                raise self.alarm.raise_for(f"the link to the {side} neighbour is gone: {qp.lost_paths}")
            raise CollectiveError(
                f"rank {self.rank}: work request to the {side} neighbour failed: "
                f"{e.ibv_wc_status(wc.status).name}"
            )
        from_left = wc.qp_num == self.left.qp_num
        if wc.opcode == WRITE_ARRIVED and from_left:
            if wc.imm_data & CHUNK_MASK != self.arrived & CHUNK_MASK:
                got, expected = wc.imm_data & CHUNK_MASK, self.arrived & CHUNK_MASK
                raise CollectiveError(f"rank {self.rank}: chunk {got} arrived, expected {expected}")
            self.arrived += 1
            self._landed.append((wc.byte_len, bool(wc.imm_data & STAGED)))
            self._top_up(self.left)
        elif wc.opcode == WRITE_ARRIVED:
            if wc.imm_data in self._unclaimed:
                self._unclaimed.discard(wc.imm_data)
            else:
                self.announced.append((wc.imm_data, *ANNOUNCEMENT.unpack_from(self.mailbox.view)))
            self._top_up(self.right)
        elif wc.opcode == MESSAGE_ARRIVED and (from_left or wc.imm_data == FAREWELL):
            self.farewells.add(wc.qp_num)
        elif wc.opcode == MESSAGE_ARRIVED:
            self.credits += wc.imm_data
            self._top_up(self.right)
        elif from_left:
            self.crediting -= 1
        else:
            self.completed = wc.wr_id + 1

    def _top_up(self, qp: ShiftQP) -> None:
        """Count a receive used on `qp`; once SLOTS are, post SLOTS again. In batches, because every post
        waits for the provider's lock, which its progress thread holds while it reads a chunk."""
        used = self._used[qp.qp_num] + 1
        if used == SLOTS:
            for _ in range(SLOTS):
                qp.post_recv(self._recv)
            used = 0
        self._used[qp.qp_num] = used

    def _farewell(self, patience: float) -> None:
        """Tell both neighbours that this rank is done, and wait (at most `patience` s) until both have
        said so too. Then neither waits for an acknowledgement from this rank's QPs (a neighbour says it
        only after its last collective, whose writes were all acknowledged, and after its last credits),
        so closing them fails nobody's work request."""
        for qp in (self.right, self.left):
            qp.post_send(SendWR(opcode=e.IBV_WR_SEND_WITH_IMM, imm_data=FAREWELL, send_flags=0))
        deadline = time.monotonic() + patience
        while len(self.farewells) < 2 and (remaining := deadline - time.monotonic()) > 0:
            for wc in self._completions(remaining):
                if wc.status == SUCCESS:  # the neighbours are leaving: errors no longer matter
                    self._on_completion(wc)

    def close(self, farewell: bool = True) -> None:
        """Close everything; first, unless the ring has failed, take leave of both neighbours."""
        if farewell:
            try:
                self._farewell(min(self.timeout, FAREWELL_PATIENCE))
            except VerbsError as exc:
                log.warning("rank %d: no farewell to the neighbours (%s)", self.rank, exc)
        self.buffers.close()
        ends = (self.left, self.right, self.staging, self.mailbox, self.cq, self.channel, self.pd, self.ctx)
        for obj in ends:  # the channel after its CQ, before the context (whose fast path waits for it)
            obj.close()
