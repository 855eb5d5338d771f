"""The ring transport: a ShiftQP to the right neighbour, one from the left, staging slots, and credits.

Data goes right as RDMA_WRITE_WITH_IMM into the right neighbour's staging slots (chunk n into slot n mod
SLOTS; the immediate is n, as a check). The receiver applies the chunk to the collective's memory and
hands the slot back with a zero-byte SEND_WITH_IMM (immediate: slots freed) on the same connection. A
sender has at most SLOTS chunks not yet handed back, so nothing is overwritten before it is used. Counts
run over the Communicator's whole life: a neighbour already in the next collective may fill free slots,
which stay put until this rank gets there. The QPs are ShiftQPs, so a NIC failure moves them to the
backup NIC beneath this code; two-sided messages arrive exactly once and in order either way. Closing, a
rank first sends each neighbour a farewell (a SEND_WITH_IMM of 0) and waits for theirs, so that no
neighbour still waits for an acknowledgement from a QP that is going away.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque

import numpy as np

from libshift.collectives import ops
from libshift.collectives.buffers import Buffers, Region
from libshift.collectives.plan import Apply, Plan, Recv, Send
from libshift.collectives.store import Store
from libshift.shift import ShiftCompChannel, ShiftContext, ShiftCQ, ShiftMR, ShiftPD, ShiftQP
from libshift.verbs import SGE, WC, Endpoint, QPAttr, QPCap, QPInitAttr, RecvWR, SendWR, get_device_list
from libshift.verbs import enums as e
from libshift.verbs.errors import VerbsError

log = logging.getLogger("libshift.collectives")
CHUNK = 4 << 20  # bytes a message carries at most: one staging slot
SLOTS = 4  # staging slots per rank: how many chunks can be in flight on one link
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
ROOM = 8  # spare work requests per queue beyond the slots
QP_TIMEOUT = 16  # ack deadline 4.096 us * 2**16 = 0.27 s a try: a loaded machine is not a dead link
SUCCESS = e.ibv_wc_status.IBV_WC_SUCCESS
DATA_ARRIVED = e.ibv_wc_opcode.IBV_WC_RECV_RDMA_WITH_IMM
MESSAGE_ARRIVED = e.ibv_wc_opcode.IBV_WC_RECV  # a credit from the right, or a farewell from either side
FAREWELL = 0  # the immediate of a farewell (a credit always frees at least one slot)
FAREWELL_PATIENCE = 10.0


class CollectiveError(RuntimeError):
    """The ring failed under a collective (a work request failed, or no progress within the timeout)."""


def default_device() -> str:
    name = os.environ.get("SHIFT_DEVICE")
    if name:
        return name
    devices = get_device_list()
    if not devices:
        raise ValueError("no RDMA device found (set SHIFT_TCP_DEVICES, or pass device=)")
    return devices[0].name


class Ring:
    """This rank's place in the ring; `run(plan, ...)` moves a plan's chunks through it."""

    def __init__(
        self, store: Store, rank: int, world_size: int, device: str, prefix: str, timeout: float
    ) -> None:
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.ctx = ShiftContext(name=device)
        self.pd = ShiftPD(self.ctx)
        self.channel = ShiftCompChannel(self.ctx)
        self.cq = ShiftCQ(self.ctx, 4 * (SLOTS + ROOM), channel=self.channel)
        cap = QPCap(max_send_wr=SLOTS + ROOM, max_recv_wr=SLOTS + ROOM)
        self.right = ShiftQP(self.pd, QPInitAttr(scq=self.cq, rcq=self.cq, cap=cap))
        self.left = ShiftQP(self.pd, QPInitAttr(scq=self.cq, rcq=self.cq, cap=cap))
        self.staging = ShiftMR(self.pd, SLOTS * CHUNK, ACCESS)
        self._staged = np.frombuffer(self.staging.view, np.uint8)
        self.buffers = Buffers(self.pd)
        self.sent = self.credits = self.completed = 0  # data chunks written; slots handed back; writes acked
        self.arrived = self.consumed = 0  # data chunks landed in our slots; applied and handed back
        self._lengths: deque[int] = deque()  # the sizes of the chunks landed and not yet applied
        self.owed = self.crediting = 0  # slots freed but not yet handed back; credit messages in flight
        self.farewells: set[int] = set()  # the QPs on which the neighbour said it is done
        try:
            self._target = self._connect(store, prefix)
        except BaseException:
            self.close(farewell=False)
            raise

    def _connect(self, store: Store, prefix: str) -> tuple[int, int]:
        """Swap endpoints and staging keys with both neighbours, connect, and wait until both are ready."""
        mine = {
            "right": self.right.endpoint().to_json(),
            "left": self.left.endpoint().to_json(),
            "staging": [self.staging.buf, self.staging.rkey, SLOTS, CHUNK],
        }
        store.set(f"{prefix}/ring/{self.rank}", json.dumps(mine).encode())
        right_rank, left_rank = (self.rank + 1) % self.world_size, (self.rank - 1) % self.world_size
        right = json.loads(store.get(f"{prefix}/ring/{right_rank}"))
        left = json.loads(store.get(f"{prefix}/ring/{left_rank}"))
        addr, rkey, slots, chunk = right["staging"]
        if (slots, chunk) != (SLOTS, CHUNK):
            raise ValueError(f"rank {right_rank} stages {slots} x {chunk} bytes, this rank {SLOTS} x {CHUNK}")
        for qp, peer in ((self.right, right["left"]), (self.left, left["right"])):
            attr = QPAttr(qp_access_flags=ACCESS, timeout=QP_TIMEOUT, min_rnr_timer=1)
            qp.connect(Endpoint.from_json(peer), attr)
            for _ in range(SLOTS + 1):
                qp.post_recv(RecvWR())
        store.set(f"{prefix}/ready/{self.rank}", b"1")
        store.get(f"{prefix}/ready/{right_rank}")
        store.get(f"{prefix}/ready/{left_rank}")
        return addr, rkey

    @property
    def resilient(self) -> bool:
        return self.ctx.resilient

    # -- one collective ----------------------------------------------------------------------------------

    def run(self, plan: Plan, region: Region, dtype: np.dtype, op: ops.ReduceOp) -> None:
        """Send and apply every chunk of `plan` (offsets into `region`), each send as soon as its chunk is
        ready and a slot free; return when every chunk is applied and every write acknowledged (so the
        region's bytes are the caller's again)."""
        sends, recvs = plan.sends, plan.recvs
        first_send, first_recv = self.sent, self.consumed
        posted = applied = 0
        deadline = time.monotonic() + self.timeout
        while applied < len(recvs) or self.completed - first_send < len(sends) or self.owed:
            moved = False
            while posted < len(sends) and sends[posted].after < applied and self.sent - self.credits < SLOTS:
                self._write(sends[posted], region.mr)
                posted += 1
                moved = True
            if applied < len(recvs) and self.arrived > self.consumed:
                self._apply(recvs[applied], region.data, dtype, op)
                applied += 1
                moved = True
            elif not self._poll(block=not moved, deadline=deadline):
                continue
            deadline = time.monotonic() + self.timeout
        assert self.consumed - first_recv == len(recvs)

    def _write(self, send: Send, mr: ShiftMR) -> None:
        addr, rkey = self._target
        slot = self.sent % SLOTS
        wr = SendWR(
            wr_id=self.sent,
            opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM,
            sg=[SGE(mr.buf + send.offset, send.nbytes, mr.lkey)],
            imm_data=self.sent & 0xFFFFFFFF,
            remote_addr=addr + slot * CHUNK,
            rkey=rkey,
        )
        self.right.post_send(wr)
        self.sent += 1

    def _apply(self, recv: Recv, data: np.ndarray, dtype: np.dtype, op: ops.ReduceOp) -> None:
        """Use the oldest filled slot on `data`, then hand the slot back to the left neighbour."""
        got = self._lengths.popleft()
        if got != recv.nbytes:
            raise CollectiveError(
                f"rank {self.rank}: a chunk of {got} bytes came from the left neighbour, {recv.nbytes} "
                "expected: do all ranks call the same collectives with arrays of the same size?"
            )
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
        self._hand_back()

    def _hand_back(self) -> None:
        """Return the freed slots to the left neighbour in one credit, unless SLOTS credits are already on
        their way: then later, together (so the credits in flight never outgrow the send queue)."""
        if self.owed and self.crediting < SLOTS:
            self.left.post_send(SendWR(opcode=e.IBV_WR_SEND_WITH_IMM, imm_data=self.owed))
            self.crediting += 1
            self.owed = 0

    def _poll(self, block: bool, deadline: float) -> bool:
        """Take the completions there are (waiting up to a second for one if `block`); whether any came."""
        wcs = self._completions(min(deadline - time.monotonic(), 1.0) if block else 0.0)
        if not wcs and block and time.monotonic() >= deadline:
            raise CollectiveError(f"rank {self.rank}: no progress from the ring within {self.timeout:g} s")
        for wc in wcs:
            self._on_completion(wc)
        self._hand_back()
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
            side = "right" if wc.qp_num == self.right.qp_num else "left"
            raise CollectiveError(
                f"rank {self.rank}: work request to the {side} neighbour failed: "
                f"{e.ibv_wc_status(wc.status).name}"
            )
        if wc.opcode == DATA_ARRIVED:
            if wc.imm_data != self.arrived & 0xFFFFFFFF:
                expected = self.arrived & 0xFFFFFFFF
                raise CollectiveError(f"rank {self.rank}: chunk {wc.imm_data} arrived, expected {expected}")
            self.arrived += 1
            self._lengths.append(wc.byte_len)
            self.left.post_recv(RecvWR())
        elif wc.opcode == MESSAGE_ARRIVED and (wc.qp_num == self.left.qp_num or wc.imm_data == FAREWELL):
            self.farewells.add(wc.qp_num)
        elif wc.opcode == MESSAGE_ARRIVED:
            self.credits += wc.imm_data
            self.right.post_recv(RecvWR())
        elif wc.qp_num == self.right.qp_num:
            self.completed += 1
        else:
            self.crediting -= 1

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
        for obj in (self.left, self.right, self.staging, self.cq, self.pd, self.ctx):
            obj.close()
