"""One side of an application that registers memory per message, run inside a lab host.

    fresh_mr_peer.py receiver|sender COUNT [--device mlx5_0]

The receiver, for each message i: registers a fresh ShiftMR, posts a receive, sends the sender a word with
the MR's address and rkey, and once the sender's RDMA_WRITE_WITH_IMM (immediate i) has landed checks the
bytes and deregisters the MR. The sender writes message i's pattern where each word says. So every rkey the
sender writes to is new, and withdrawn soon after: what a switch must cope with in the middle. JSON lines:
{"endpoints"} then the peer's (stdin), {"connected"}, {"progress": i} every PROGRESS messages, and
{"done": messages, "errors": [...], "failed": [...]} (errors: wrong bytes; failed: error completions).
"""

from __future__ import annotations

import argparse
import faulthandler
import struct
import time

import numpy as np
from peer import log_for_the_harness, stream_peer  # stream_peer: bench/stream_peer.py, as peer.py loads it

from libshift.shift import ShiftMR
from libshift.verbs import SGE, WC, QPAttr, QPCap, RecvWR, SendWR
from libshift.verbs import enums as e

Verbs, hear, say = stream_peer.Verbs, stream_peer.hear, stream_peer.say

SIZE = 4096
WORD = struct.Struct("<QI")  # address, rkey
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
PROGRESS = 100
RECEIVES = 8
GIVE_UP = 60.0  # a completion that does not come within this long ends the run
STACKS_EVERY = 60.0  # a run still going this long after "go" writes every thread's stack to stderr


def pattern(i: int) -> np.ndarray:
    return (np.arange(SIZE, dtype=np.uint32) * 2654435761 + i).astype(np.uint8)


class Side:
    def __init__(self, device: str) -> None:
        self.verbs = Verbs(4 * RECEIVES, SIZE + RECEIVES * WORD.size, ACCESS, device=device)
        cap = QPCap(max_send_wr=2 * RECEIVES, max_recv_wr=2 * RECEIVES)
        (self.qp,) = self.verbs.create_qps(1, cap)
        self.mr = self.verbs.mr  # [0, SIZE): the sender's pattern; then word slots
        self.failed: list[str] = []

    def connect(self) -> None:
        say(endpoints=[self.qp.endpoint().to_json()])
        self.verbs.connect([self.qp], hear()["endpoints"], QPAttr(qp_access_flags=ACCESS))
        say(connected=True, resilient=self.verbs.ctx.resilient)

    def word_sge(self, slot: int) -> SGE:
        return SGE(self.mr.buf + SIZE + slot * WORD.size, WORD.size, self.mr.lkey)

    def next_wc(self) -> WC | None:
        deadline = time.monotonic() + GIVE_UP
        while time.monotonic() < deadline:
            _, wcs = self.verbs.cq.poll(1)
            if wcs:
                wc = wcs[0]
                if wc.status != e.IBV_WC_SUCCESS:
                    self.failed.append(e.ibv_wc_status(wc.status).name)
                return wc
        self.failed.append(f"no completion in {GIVE_UP:g} s")
        return None


def receiver(side: Side, count: int) -> list[str]:
    errors = []
    for i in range(count):
        mr = ShiftMR(side.verbs.pd, SIZE, ACCESS)
        side.qp.post_recv(RecvWR(wr_id=i))
        WORD.pack_into(side.mr.view, SIZE, mr.buf, mr.rkey)
        side.qp.post_send(SendWR(wr_id=i, opcode=e.IBV_WR_SEND, sg=[side.word_sge(0)]))
        landed = sent = False
        while not (landed and sent):
            wc = side.next_wc()
            if wc is None or side.failed:
                return errors
            if wc.opcode == e.ibv_wc_opcode.IBV_WC_RECV_RDMA_WITH_IMM:
                landed = True
                if wc.imm_data != i or not np.array_equal(np.frombuffer(mr.view, np.uint8, SIZE), pattern(i)):
                    errors.append(f"message {i}: immediate {wc.imm_data} or bytes wrong")
            else:
                sent = True
        mr.close()  # withdrawn while the sender's write may still wait for its acknowledgement
        if i % PROGRESS == 0:
            say(progress=i)
    return errors


def sender(side: Side, count: int) -> None:
    """Write message i where word i says; the next word may come before the write's completion."""
    for slot in range(RECEIVES):
        side.qp.post_recv(RecvWR(wr_id=slot, sg=[side.word_sge(slot)]))
    view = np.frombuffer(side.mr.view, np.uint8, SIZE)
    written = completed = 0
    while completed < count:
        wc = side.next_wc()
        if wc is None or side.failed:
            return
        if wc.opcode == e.ibv_wc_opcode.IBV_WC_RDMA_WRITE:
            completed += 1
            continue
        address, rkey = WORD.unpack_from(side.mr.view, SIZE + wc.wr_id * WORD.size)
        side.qp.post_recv(RecvWR(wr_id=wc.wr_id, sg=[side.word_sge(wc.wr_id)]))
        view[:] = pattern(written)  # the last write has landed (its word came after): the buffer is free
        write = SendWR(
            wr_id=written, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, imm_data=written,
            sg=[SGE(side.mr.buf, SIZE, side.mr.lkey)], remote_addr=address, rkey=rkey,
        )  # fmt: skip
        side.qp.post_send(write)
        written += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["receiver", "sender"])
    parser.add_argument("count", type=int)
    parser.add_argument("--device", default="mlx5_0")
    args = parser.parse_args()
    log_for_the_harness()
    side = Side(args.device)
    side.connect()
    hear()  # {"go"}
    # a call that never returns would leave GIVE_UP unchecked: the stacks say which call, and the
    # failure message shows them (faulthandler's own thread writes them, with no interpreter lock)
    faulthandler.dump_traceback_later(STACKS_EVERY, repeat=True)
    errors = receiver(side, args.count) if args.role == "receiver" else []
    if args.role == "sender":
        sender(side, args.count)
    say(done=True, errors=errors, failed=side.failed)


if __name__ == "__main__":
    main()
