"""One side of a failover test stream, run inside a lab host (`lab.exec_command`).

It speaks JSON lines: it prints {"endpoints", "addr", "rkey"}, reads the peer's the same way, connects
`--qps` ShiftQPs over --device (mlx5_0; one CQ for all) and prints {"connected"}; on {"go"} the sender streams
sequence-numbered, checksummed messages round-robin over the QPs (mode send, write_imm or write_read) and the
receiver checks each one, per QP, until {"stop"}. Each prints {"progress"} (sender, at message --progress),
{"state", "at"} when its first QP changes state, and {"done": ...} with what it saw: `errors` are breaches
of the stream (a message missing, twice, out of order, corrupt), `failed` the error completions the
application got. The sender stops posting at its first error completion and reports once every WR it
posted has completed, as an application would after an RC error.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import struct
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from libshift.shift import ShiftQP, State
from libshift.verbs import SGE, WC, QPAttr, QPCap, RecvWR, SendWR
from libshift.verbs import enums as e


def _bench_module(name: str) -> ModuleType:
    """A module of bench/, loaded by path (bench/ is no package)."""
    path = Path(__file__).resolve().parents[2] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stream_peer = _bench_module("stream_peer")  # what this peer shares with bench/failover_peer.py
say, hear = stream_peer.say, stream_peer.hear

SIZE = 512
SLOTS = 32
WINDOW = 16  # WRs outstanding per QP
LANE = 2 * SLOTS * SIZE  # each QP's part of the MR: slots to send from / write into, then to read into
HEADER = struct.Struct("<QI")
ACCESS = e.ALL_ACCESS
ATOMIC_WR = 1 << 40
DEADLINE = 40.0


def message(tag: int) -> bytes:
    body = (tag.to_bytes(8, "little") * (SIZE // 8))[: SIZE - HEADER.size]
    return HEADER.pack(tag, zlib.crc32(body)) + body


def check(data: bytes, expected: int) -> str | None:
    tag, crc = HEADER.unpack_from(data)
    if tag != expected:
        return f"expected message {expected:#x}, got {tag:#x}"
    if zlib.crc32(data[HEADER.size :]) != crc:
        return f"message {tag:#x}: bad checksum"
    return None


@dataclass
class Lane:
    """One QP's stream: its part of the MR, and how far it is (WRs posted, completed; messages received)."""

    index: int
    qp: ShiftQP
    posted: int = 0
    done: int = 0  # WRs completed, in order
    ok: int = 0  # WRs completed successfully before the first error
    received: int = 0

    def tag(self, seq: int) -> int:
        """What message `seq` of this lane carries: a mix-up between lanes shows as a wrong tag."""
        return self.index << 32 | seq


class Side:
    def __init__(self, device: str, qps: int, timeout: int, retry_cnt: int, block: bool, idle: float) -> None:
        self.idle = idle  # a pass that found nothing to do pauses this long (the receiver at least 1 ms)
        self.atomic_at = qps * LANE  # the MR's last word: the receiver's counter, the sender's result
        self.verbs = stream_peer.Verbs(256 * qps, self.atomic_at + 8, ACCESS, block=block, device=device)
        self.ctx, self.mr = self.verbs.ctx, self.verbs.mr
        self.cq, self.channel = self.verbs.cq, self.verbs.channel
        self.woken = {"events": 0, "timeouts": 0}  # how the waits on the channel ended
        cap = QPCap(max_send_wr=2 * WINDOW, max_recv_wr=SLOTS)
        self.lanes = [Lane(i, qp) for i, qp in enumerate(self.verbs.create_qps(qps, cap))]
        self.by_qpn = {lane.qp.qp_num: lane for lane in self.lanes}
        self.attr = QPAttr(qp_access_flags=ACCESS, timeout=timeout, retry_cnt=retry_cnt)
        self.errors: list[str] = []  # breaches of the stream
        self.failed: list[str] = []  # error completions
        self.states: list[tuple[str, int]] = []  # each change of QP 0's state, and how far the stream was

    def exchange(self) -> tuple[int, int]:
        endpoints = [lane.qp.endpoint().to_json() for lane in self.lanes]
        say(endpoints=endpoints, addr=self.mr.buf, rkey=self.mr.rkey)
        peer = hear()
        self.verbs.connect([lane.qp for lane in self.lanes], peer["endpoints"], self.attr)
        states = sorted({lane.qp.state.value for lane in self.lanes})
        say(connected=True, resilient=self.ctx.resilient, state=",".join(states))
        return peer["addr"], peer["rkey"]

    def sge(self, lane: Lane, slot: int, region: int = 0) -> SGE:
        return SGE(self.mr.buf + lane.index * LANE + (region * SLOTS + slot) * SIZE, SIZE, self.mr.lkey)

    def poll(self, progress: int) -> list[tuple[Lane, WC]]:
        state = self.lanes[0].qp.state.value
        if state != (self.states[-1][0] if self.states else State.DEFAULT.value):
            self.states.append((state, progress))
            say(state=state, at=progress)
        _, wcs = self.cq.poll(32)
        for wc in wcs:
            if wc.status != e.IBV_WC_SUCCESS and wc.wr_id != ATOMIC_WR:
                self.failed.append(f"qp {wc.qp_num} wr {wc.wr_id}: {e.ibv_wc_status(wc.status).name}")
        return [(self.by_qpn[wc.qp_num], wc) for wc in wcs]

    def wait(self, progress: int, stop: threading.Event) -> list[tuple[Lane, WC]]:
        """Poll; when nothing came, block on the completion channel (--block) or pause briefly."""
        polled = self.poll(progress)
        if polled:
            return polled
        if self.channel is None:
            stop.wait(max(self.idle, 0.001))
            return []
        polled, woken = self.verbs.block(lambda: self.poll(progress), 0.05)  # bounded, to notice {"stop"}
        if woken is not None:
            self.woken["events" if woken else "timeouts"] += 1
        return polled

    def finals(self) -> list[str]:
        return [lane.qp.state.value for lane in self.lanes]

    def core_moves(self) -> int:
        """The QPs' switches the core made, with no Python in the way (fast_switch.c)."""
        return sum(lane.qp.switcher.core_moves for lane in self.lanes)


class Orders:
    """The test's lines after {"go"}: {"atomic": true} has the sender post one FETCH_AND_ADD into the
    stream; {"armed": path} is answered with {"armed": path} once every QP has that path armed (connected,
    control receive posted: a re-arm is done); {"stop": true, "expect": n} ends it (the receiver waits
    for n messages first)."""

    def __init__(self, side: Side) -> None:
        self.side = side
        self.atomic = threading.Event()
        self.stop = threading.Event()
        self.expect = 0
        self._lines = stream_peer.Orders()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while not (line := self._lines.next(None)).get("stop"):
            if line.get("atomic"):
                self.atomic.set()
            if line.get("armed"):
                threading.Thread(target=self._tell_armed, args=(line["armed"],), daemon=True).start()
        self.expect = int(line.get("expect", 0))
        self.stop.set()

    def _tell_armed(self, path: str) -> None:
        while not all(lane.qp.armed.get(path) for lane in self.side.lanes):
            time.sleep(0.01)
        say(armed=path)


def run_sender(
    side: Side,
    mode: str,
    rate: float,
    progress: int,
    remote: tuple[int, int],
    orders: Orders,
    deadline: float,
) -> None:
    """Post messages round-robin over the QPs at `rate` a second (a fault lands mid-stream) until told to
    stop or an error completes, at most WINDOW WRs outstanding per QP; then wait for every completion."""
    addr, rkey = remote
    lanes = side.lanes
    per_msg = 2 if mode == "write_read" else 1
    sent, verified, atomic = 0, 0, None
    start = time.monotonic()
    deadline += start
    while time.monotonic() < deadline and not side.errors:
        posting = not (orders.stop.is_set() or side.failed)
        if not posting and all(lane.done == lane.posted for lane in lanes):
            break
        before = sent
        while posting and time.monotonic() >= start + sent / rate:
            lane = lanes[sent % len(lanes)]
            if lane.posted - lane.done > WINDOW - per_msg:
                break
            seq = lane.posted // per_msg
            slot, remote_slot = seq % SLOTS, addr + lane.index * LANE + seq % SLOTS * SIZE
            side.mr.write(message(lane.tag(seq)), offset=lane.index * LANE + slot * SIZE)
            for step in range(per_msg):
                wr = SendWR(wr_id=lane.posted, sg=[side.sge(lane, slot, region=step)])
                if mode == "send":
                    wr.opcode = e.IBV_WR_SEND
                elif mode == "write_imm":
                    wr.opcode, wr.imm_data = e.IBV_WR_RDMA_WRITE_WITH_IMM, seq
                    wr.set_wr_rdma(rkey, remote_slot)
                else:
                    wr.opcode = e.IBV_WR_RDMA_WRITE if step == 0 else e.IBV_WR_RDMA_READ
                    wr.set_wr_rdma(rkey, remote_slot)
                lane.qp.post_send(wr)
                lane.posted += 1
            sent += 1
            if sent == progress:
                say(progress=sent)
        if orders.atomic.is_set() and atomic is None:
            atomic = post_atomic(side, remote)
        completed = sum(lane.ok for lane in lanes) // per_msg
        polled = side.poll(completed)
        if side.idle and not polled and sent == before:
            orders.stop.wait(side.idle)
        for lane, wc in polled:
            if wc.wr_id == ATOMIC_WR:
                atomic = e.ibv_wc_status(wc.status).name
                continue
            if wc.wr_id != lane.done:
                side.errors.append(
                    f"qp {lane.index}: completion {wc.wr_id} out of order, expected {lane.done}"
                )
            lane.done = wc.wr_id + 1
            if wc.status != e.IBV_WC_SUCCESS or lane.ok != wc.wr_id:
                continue  # after an error on this QP, nothing counts as delivered
            lane.ok = lane.done
            if mode == "write_read" and wc.wr_id % 2 == 1:
                seq = wc.wr_id // 2
                problem = check(
                    side.mr.read(SIZE, lane.index * LANE + (SLOTS + seq % SLOTS) * SIZE), lane.tag(seq)
                )
                if problem:
                    side.errors.append(f"qp {lane.index}: read back: {problem}")
                verified += 1
    say(
        done=True,
        completed=sum(lane.ok for lane in lanes) // per_msg,
        posted=sum(lane.posted for lane in lanes) // per_msg,
        finished=all(lane.done == lane.posted for lane in lanes),
        verified=verified,
        atomic=atomic,
        errors=side.errors[:10],
        failed=side.failed[:10],
        states=side.states,
        finals=side.finals(),
        core_moves=side.core_moves(),
    )


def post_atomic(side: Side, remote: tuple[int, int]) -> str:
    """One FETCH_AND_ADD on the receiver's counter while still on the default path; "posted" or why not."""
    qp = side.lanes[0].qp
    if qp.state != State.DEFAULT:
        side.errors.append("the atomic came too late: the QP had already switched")
        return "not posted"
    local = SGE(side.mr.buf + side.atomic_at, 8, side.mr.lkey)
    wr = SendWR(wr_id=ATOMIC_WR, opcode=e.IBV_WR_ATOMIC_FETCH_AND_ADD, sg=[local])
    wr.set_wr_atomic(remote[1], remote[0] + side.atomic_at, compare_add=1)
    qp.post_send(wr)
    return "posted"


def run_receiver(side: Side, mode: str, orders: Orders, deadline: float) -> None:
    """Check every message, per QP, until told to stop and `expect` have come (write_read: just poll)."""
    for lane in side.lanes:
        for slot in range(SLOTS):
            post_recv(side, lane, slot, mode)
    deadline += time.monotonic()
    while time.monotonic() < deadline:
        received = sum(lane.received for lane in side.lanes)
        if orders.stop.is_set() and received >= orders.expect:
            break
        polled = side.wait(received, orders.stop)
        for lane, wc in polled:
            if wc.status != e.IBV_WC_SUCCESS or mode == "write_read":
                continue
            slot = wc.wr_id % SLOTS if mode == "send" else wc.imm_data % SLOTS
            if wc.wr_id != lane.received:
                side.errors.append(f"qp {lane.index}: receive {wc.wr_id} completed, expected {lane.received}")
            if mode == "write_imm" and wc.imm_data != lane.received:
                side.errors.append(f"qp {lane.index}: immediate {wc.imm_data}, expected {lane.received}")
            problem = check(side.mr.read(SIZE, lane.index * LANE + slot * SIZE), lane.tag(lane.received))
            if problem:
                side.errors.append(f"qp {lane.index}: {problem}")
            lane.received += 1
            post_recv(side, lane, slot, mode, wr_id=wc.wr_id + SLOTS)
    say(
        done=True,
        received=sum(lane.received for lane in side.lanes),
        counter=int.from_bytes(side.mr.read(8, side.atomic_at), "little"),
        woken=side.woken,
        errors=side.errors[:10],
        failed=side.failed[:10],
        states=side.states,
        finals=side.finals(),
        core_moves=side.core_moves(),
    )


def post_recv(side: Side, lane: Lane, slot: int, mode: str, wr_id: int | None = None) -> None:
    sg = [side.sge(lane, slot)] if mode == "send" else []
    lane.qp.post_recv(RecvWR(wr_id=slot if wr_id is None else wr_id, sg=sg))


def log_for_the_harness() -> None:
    """Log to stderr, timed to the millisecond. libshift's DEBUG lines are the control plane's (NIC words,
    re-arm messages, probes): a few per switch, into a file the harness shows when a check fails, so that a
    rare failure explains itself."""
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s.%(msecs)03d %(threadName)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger("libshift").setLevel(os.environ.get("SHIFT_TEST_LOG", "DEBUG"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["sender", "receiver"])
    parser.add_argument("--mode", choices=["send", "write_imm", "write_read"], default="send")
    parser.add_argument("--qps", type=int, default=1)
    parser.add_argument("--rate", type=float, default=1000.0, help="messages a second, over all QPs")
    parser.add_argument("--progress", type=int, default=500, help="say so when this message is posted")
    parser.add_argument("--timeout", type=int, default=15)
    parser.add_argument("--retry-cnt", type=int, default=3)
    parser.add_argument("--block", action="store_true", help="wait on a completion channel when idle")
    parser.add_argument("--device", default=stream_peer.DEVICE)
    parser.add_argument("--idle", type=float, default=0.0, help="seconds a pass with nothing to do pauses")
    parser.add_argument("--patience", type=float, default=1.0, help="the stream may last this many DEADLINEs")
    args = parser.parse_args()
    log_for_the_harness()
    side = Side(args.device, args.qps, args.timeout, args.retry_cnt, args.block, args.idle)
    remote = side.exchange()
    hear()  # go
    orders = Orders(side)
    deadline = DEADLINE * args.patience
    if args.role == "sender":
        run_sender(side, args.mode, args.rate, args.progress, remote, orders, deadline)
    else:
        run_receiver(side, args.mode, orders, deadline)
    side.ctx.close()


if __name__ == "__main__":
    main()
