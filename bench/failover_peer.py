"""One end of a failover benchmark stream, run on a lab host by failover_lab.Pair.

It speaks JSON lines. It builds either shift objects (ShiftContext over mlx5_0, backup on mlx5_1) or the
bare tcp-provider objects (--plain), prints {"endpoints", "addr", "rkey", "rss"}, reads the peer's the same
way, connects `--qps` QPs (one CQ for all), prints {"connected", "connected_s"}, and then obeys orders:

  {"stream": true}        sender: post continuously (SEND, RDMA_WRITE or RDMA_READ of --size bytes,
                          round-robin, at most --window outstanding per QP) until told to stop;
  {"arm": true}           sender: answer {"armed"}, then post one WR beyond the window on every QP each
                          TICK, the wait doubling with each of them not yet completed past TICK_STEADY
                          (while it has SPARE room), so that one is posted within a TICK of a fault
                          taking effect however late the {"mark"} comes (the order's own trip takes 1-2 ms);
  {"mark": t0, "after": t}  sender: post one more WR on every QP at once, and answer {"resumed"} once every
                          QP has completed a WR posted at or after t (CLOCK_MONOTONIC ns; t0 when not given),
                          the moment the fault had taken effect: such a WR can only complete on the backup
                          (one posted between t0 and t may have made it over the old path just in time);
                          NIC events count from t0; the ticks of {"arm"} end with it;
  {"burst": seconds}      sender: stream for that long, answer {"burst": bytes, seconds};
  {"ping": n}             sender: n ping-pongs of --size bytes on QP 0, answer {"ping": [half round trips]};
  {"nic": "down", "since": t}  sender: answer {"nic": true} once shiftd's NIC event ("down" or "up") for
                          mlx5_0 has reached the application after t;
  {"settled": true}       answer once every QP is on the default path with its backup armed (a failure now
                          is a clean trial);
  {"stop": true}          end the stream, answer {"done": counts, errors, timeline, rss, steps} and exit
                          (steps: with --steps, the moments of each switch's steps; libshift.shift.steps).

The receiver re-posts receives (send mode) and echoes pings; in write and read mode it only has to be alive
(its watcher threads answer the failover handshake). With nothing to do, a side busy-polls (with --spin
without ever sleeping), or with --block
waits on a completion channel. Every completion is timed on CLOCK_MONOTONIC, which all
processes of the machine share, so the orchestrator can compare with the instant it injected a fault.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from array import array
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from stream_peer import DEVICE, Orders, Verbs, hear, rss_kib, say

from libshift.agent import Agent
from libshift.notices import NicChange, NicState
from libshift.shift import State, steps
from libshift.verbs import SGE, WC, QPAttr, QPCap, RecvWR, SendWR
from libshift.verbs import enums as e

ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
OPCODES = {"send": e.IBV_WR_SEND, "write": e.IBV_WR_RDMA_WRITE, "read": e.IBV_WR_RDMA_READ}
PING = 0x50494E47  # the immediate of a ping: the receiver answers it
PING_WR = 1 << 48  # wr_id of pings and their answers, apart from the stream's sequence numbers
BATCH = 64
IDLE_WAIT = 0.01  # the longest block on the channel, so that orders are noticed
ANSWER_WITHIN = 30.0  # an order not met by then is answered anyway, saying so
SPARE = 24  # room beyond the window on every QP (and receives beyond it): {"mark"}'s and {"arm"}'s WRs
TICK_NS = 50_000  # while armed, a WR beyond the window this often,
TICK_STEADY = 8  # while at most this many are outstanding (a fault's first 0.4 ms); then doubled per one more
TICK_DOUBLINGS = 5  # at most: the longest wait between two of them is TICK_NS << 5, 1.6 ms


@dataclass
class Lane:
    """One QP and its stream: WRs posted and completed (sequence numbers), post times of the outstanding."""

    qp: Any
    posted: int = 0
    done: int = 0
    post_ns: deque[int] = field(default_factory=deque)


class Stack:
    """The verbs objects of one side: shift objects, or the bare provider's (--plain)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.nic_events: list[tuple[int, int, str]] = []  # (arrived, shiftd saw, state) for our device
        cqe = args.qps * (2 * args.window + 2) + 16
        cap = QPCap(max_send_wr=args.window + SPARE, max_recv_wr=args.window + SPARE)
        self.agent: Agent | None = None
        self.settle_by: float | None = None  # when a pending {"settled"} is answered anyway
        self.nic_wait: tuple[str, int, float] | None = None  # a pending {"nic"}: state, since, answer by
        if not args.plain:
            self.agent = Agent.connect()
            if self.agent is None:
                raise SystemExit("failover_peer: no shiftd at SHIFT_SOCKET")
            self.agent.add_listener(self._on_nic)  # before the context's: it times the arrival itself
        self.verbs = Verbs(cqe, args.size, ACCESS, plain=args.plain, block=args.block, agent=self.agent)
        self.ctx, self.mr, self.cq = self.verbs.ctx, self.verbs.mr, self.verbs.cq
        self.base_rss = rss_kib()
        self.lanes = [Lane(qp) for qp in self.verbs.create_qps(args.qps, cap)]
        self.by_qpn = {lane.qp.qp_num: lane for lane in self.lanes}
        self.sge = [SGE(self.mr.buf, args.size, self.mr.lkey)]

    def _on_nic(self, change: NicChange) -> None:
        if change.device == DEVICE:
            self.nic_events.append((time.monotonic_ns(), change.monotonic_nanos, change.state.value))

    def connect(self, peer: dict[str, Any]) -> None:
        attr = QPAttr(qp_access_flags=ACCESS, timeout=self.args.timeout, retry_cnt=self.args.retry_cnt)
        self.verbs.connect([lane.qp for lane in self.lanes], peer["endpoints"], attr)
        if self.args.mode == "send":
            for lane in self.lanes:
                for _ in range(self.args.window + SPARE):
                    self.post_recv(lane)

    def post_recv(self, lane: Lane) -> None:
        lane.qp.post_recv(RecvWR(sg=self.sge))

    def poll(self, wait: bool) -> list[WC]:
        """The CQ's completions; with `wait` and none there, block on the channel (--block, as perftest's -e)
        for a while, or yield the interpreter to the provider's and the context's threads: for an instant of
        sleep, in which they can take its lock, or with --spin by sched_yield, which keeps this thread
        runnable. A latency test spins: two peers that sleep an instant look idle to the scheduler, which
        ran both on one CPU (half round trips of 86-160 us where qperf took 27). A failover test sleeps:
        a spinning thread takes the interpreter lock back before the context's threads can, so each of
        their steps waits for the interpreter's switch interval (5 ms), and a failback took seconds."""
        _, wcs = self.cq.poll(BATCH)
        if wcs or not wait:
            return wcs
        if self.verbs.channel is None:
            if self.args.spin:
                os.sched_yield()
            else:
                time.sleep(0)
            return wcs
        wcs, woken = self.verbs.block(lambda: self.cq.poll(BATCH)[1], IDLE_WAIT)
        if woken is not None:
            _, wcs = self.cq.poll(BATCH)
        return wcs

    def state(self, lane: Lane) -> str:
        return "plain" if self.args.plain else lane.qp.state.value

    def states(self) -> dict[str, int]:
        return dict(Counter(self.state(lane) for lane in self.lanes))

    def settled(self) -> bool:
        """Every QP on the default path with its backup armed: a failure now finds somewhere to go."""
        return self.args.plain or all(
            lane.qp.state == State.DEFAULT and lane.qp.armed["backup"] for lane in self.lanes
        )

    def expect(self, order: dict[str, Any]) -> None:
        """Note a {"settled"} or {"nic"} order, answered by answer_pending when it holds."""
        by = time.monotonic() + ANSWER_WITHIN
        if "settled" in order:
            self.settle_by = by
        else:
            self.nic_wait = (NicState(order["nic"]).value, int(order["since"]), by)

    def nic_seen(self) -> bool:
        assert self.nic_wait is not None
        state, since, _ = self.nic_wait
        return any(arrived >= since and st == state for arrived, _, st in self.nic_events)

    def answer_pending(self) -> None:
        """Answer pending orders once they hold, or when overdue (then with false)."""
        if self.settle_by is not None and (self.settled() or time.monotonic() > self.settle_by):
            say(settled=self.settled(), states=self.states())
            self.settle_by = None
        if self.nic_wait is not None and (self.nic_seen() or time.monotonic() > self.nic_wait[2]):
            say(nic=self.nic_seen())
            self.nic_wait = None

    def close(self) -> None:
        self.ctx.close()
        if self.agent is not None:
            self.agent.close()


class Sender:
    """The data loop of the sending side: streams, marks, bursts and pings, on one thread."""

    def __init__(self, stack: Stack, remote: tuple[int, int], signal_every: int) -> None:
        self.stack = stack
        self.args = stack.args
        self.remote = remote
        self.signal_every = signal_every
        self.streaming = False
        self.done_ns = array("q")  # completion times of the signaled WRs, for the timeline
        self.done_bytes = array("q")
        self.states: list[tuple[int, str]] = []  # (time, state) of QP 0 whenever it changes
        self.errors: list[str] = []
        # t0, the fault's effect (the earliest post that counts), qpn -> first completion, deadline
        self.mark: tuple[int, int, dict[int, int], float] | None = None
        self.ticked: int | None = None  # while armed: when the last WR beyond the window went
        self.ticks: deque[tuple[Lane, int]] = deque()  # those WRs not yet completed: (lane, seq)
        self.armed_done: list[tuple[int, int, int]] = []  # while armed, before the mark: (qpn, posted, done)
        self.pings = 0

    def post(self, lane: Lane) -> None:
        seq = lane.posted
        last_of_window = (seq + 1) % self.signal_every == 0 or lane.posted - lane.done + 1 >= self.args.window
        flags = e.IBV_SEND_SIGNALED if last_of_window else 0
        wr = SendWR(wr_id=seq, opcode=OPCODES[self.args.mode], sg=self.stack.sge, send_flags=flags)
        if self.args.mode != "send":
            wr.set_wr_rdma(self.remote[1], self.remote[0])
        lane.post_ns.append(time.monotonic_ns())
        lane.qp.post_send(wr)
        lane.posted += 1

    def fill(self) -> bool:
        """Post on every lane with room; whether anything was posted."""
        posted = False
        for lane in self.stack.lanes:
            while lane.posted - lane.done < self.args.window:
                self.post(lane)
                posted = True
        return posted

    def post_beyond_window(self) -> None:
        """One more WR on every streaming QP, at once: with the window full when the link died, nothing
        completes (so nothing would be posted) until the backup carries traffic, and the first WR posted
        after t0 would wait for that; this one is posted as soon as the mark arrives (the QPs have room)."""
        if self.streaming:
            steps.note(0, "marked")
            for lane in self.stack.lanes:
                if lane.posted - lane.done <= self.args.window:
                    self.post(lane)

    def tick(self) -> bool:
        """Armed: one WR beyond the window on every QP, TICK_NS after the last, the wait doubled for each
        of them still outstanding past TICK_STEADY (up to TICK_DOUBLINGS times), while fewer than SPARE - 1
        are (the last spare is {"mark"}'s). On a healthy path each completes within a round trip; at a fault
        they pile up: one goes within TICK_NS of the fault taking effect (t0's request acked, 0.1-0.3 ms
        after t0), and the doubling spreads the rest over ~10 ms, however late the mark comes. The doubling
        from the first outstanding one (before) spaced them 0.1-0.4 ms apart on a healthy stream already,
        and the WR that ends the downtime went up to 0.8 ms after the fault. Whether any went."""
        now = time.monotonic_ns()
        while self.ticks and self.ticks[0][0].done > self.ticks[0][1]:
            self.ticks.popleft()
        outstanding = len(self.ticks) // len(self.stack.lanes)
        wait = TICK_NS << min(max(0, outstanding - TICK_STEADY), TICK_DOUBLINGS)
        if self.ticked is None or now - self.ticked < wait or outstanding >= SPARE - 1:
            return False
        self.ticked = now
        for lane in self.stack.lanes:
            self.ticks.append((lane, lane.posted))
            self.post(lane)
        return True

    def poll(self, wait: bool = False) -> int:
        wcs = self.stack.poll(wait)
        now = time.monotonic_ns()
        for wc in wcs:
            lane = self.stack.by_qpn[wc.qp_num]
            if wc.status != e.IBV_WC_SUCCESS:
                self.errors.append(f"qp {wc.qp_num} wr {wc.wr_id}: {e.ibv_wc_status(wc.status).name}")
                self.streaming = False
                continue
            if wc.opcode == e.IBV_WC_RECV:  # a ping's answer
                self.pings += 1
                self.stack.post_recv(lane)
                continue
            if wc.wr_id == PING_WR:
                continue
            if wc.wr_id < lane.done:
                self.errors.append(f"qp {wc.qp_num}: completion {wc.wr_id} after {lane.done - 1}")
                continue
            count = wc.wr_id + 1 - lane.done
            posted = [lane.post_ns.popleft() for _ in range(count)]
            lane.done = wc.wr_id + 1
            self.done_ns.append(now)
            self.done_bytes.append(count * self.args.size)
            if self.mark is not None and posted[-1] >= self.mark[1]:
                self.mark[2].setdefault(lane.qp.qp_num, now)
            elif self.mark is None and self.ticked is not None:  # t0 is not known here yet
                self.armed_done.append((lane.qp.qp_num, posted[-1], now))
        if self.streaming:  # the timeline of a stream; a ping-pong measures the stack alone
            state = self.stack.state(self.stack.lanes[0])
            if not self.states or self.states[-1][1] != state:
                self.states.append((now, state))
        return len(wcs)

    def check_mark(self) -> None:
        if self.mark is None:
            return
        t0, _after, firsts, deadline = self.mark
        if len(firsts) == len(self.stack.lanes) or time.monotonic() > deadline or self.errors:
            times = sorted(firsts.values())
            events = [(arrived, seen) for arrived, seen, state in self.stack.nic_events if arrived >= t0]
            say(
                resumed=len(times) == len(self.stack.lanes),
                first_ns=times[0] if times else None,
                all_ns=times[-1] if times else None,
                median_ns=times[len(times) // 2] if times else None,
                qps=len(times),
                nic_event=events[0] if events else None,
                errors=self.errors[:5],
            )
            self.mark = self.ticked = None
            self.armed_done.clear()

    def burst(self, seconds: float) -> None:
        start_bytes, start = sum(self.done_bytes), time.monotonic()
        self.streaming = True
        while time.monotonic() - start < seconds and not self.errors:
            self.poll(wait=not self.fill())
        self.streaming = False
        while any(lane.done < lane.posted for lane in self.stack.lanes) and not self.errors:
            self.poll(wait=True)
        say(
            burst=sum(self.done_bytes) - start_bytes, seconds=time.monotonic() - start, errors=self.errors[:5]
        )

    def ping(self, count: int) -> None:
        lane = self.stack.lanes[0]
        halves = []
        for _ in range(count):
            wr = SendWR(wr_id=PING_WR, opcode=e.IBV_WR_SEND_WITH_IMM, sg=self.stack.sge, imm_data=PING)
            before, target = time.monotonic_ns(), self.pings + 1
            lane.qp.post_send(wr)
            while self.pings < target and not self.errors:
                self.poll(wait=True)
            halves.append((time.monotonic_ns() - before) / 2e9)
        say(ping=halves, errors=self.errors[:5])

    def run(self, orders: Orders) -> None:
        while True:
            posted = self.streaming and (self.fill() | self.tick())
            busy = self.poll(wait=not posted and self.streaming) > 0 or posted
            self.check_mark()
            self.stack.answer_pending()
            order = orders.next(0 if busy or self.streaming or self.mark else 0.01)
            if order is None:
                continue
            if "stream" in order:
                self.streaming = True
            elif "arm" in order:
                self.ticked = time.monotonic_ns()
                self.armed_done.clear()
                say(armed=True)
            elif "mark" in order:
                t0 = int(order["mark"])
                after = int(order.get("after", t0))
                firsts: dict[int, int] = {}
                for qpn, posted, done in self.armed_done:  # completions that came before the mark did
                    if posted >= after:
                        firsts.setdefault(qpn, done)
                self.mark = (t0, after, firsts, time.monotonic() + ANSWER_WITHIN)
                self.post_beyond_window()
            elif "settled" in order or "nic" in order:
                self.stack.expect(order)
            elif "burst" in order:
                self.burst(float(order["burst"]))
            elif "ping" in order:
                self.ping(int(order["ping"]))
            elif "stop" in order:
                self.stop(bool(order.get("timeline")))
                return

    def stop(self, timeline: bool) -> None:
        self.streaming = False
        deadline = time.monotonic() + 10
        while any(lane.done < lane.posted for lane in self.stack.lanes) and time.monotonic() < deadline:
            if not self.errors:
                self.poll(wait=True)
        say(
            done=True,
            completed=sum(lane.done for lane in self.stack.lanes),
            states=self.stack.states(),
            errors=self.errors[:10],
            timeline={"ns": list(self.done_ns), "bytes": list(self.done_bytes)} if timeline else None,
            transitions=self.states,
            nic_events=self.stack.nic_events,
            rss=rss_kib(),
            steps=steps.kept(),
        )


def run_receiver(stack: Stack, orders: Orders) -> None:
    """Re-post receives and answer pings (send mode); otherwise only wait: the threads do the work."""
    errors: list[str] = []
    received = 0
    on_backup = False  # a receive has completed since QP 0 last left the default path (--steps notes it)
    while True:
        order = orders.next(0 if stack.args.mode == "send" else 0.05)
        if order is not None and "stop" in order:
            break
        if order is not None and "settled" in order:
            stack.expect(order)
        stack.answer_pending()
        if stack.args.mode != "send":
            continue
        wcs = stack.poll(wait=True)
        # only a step trace follows the state; a ping-pong measures the stack alone
        fallback = stack.args.steps and not stack.args.plain and stack.lanes[0].qp.state is State.FALLBACK
        if wcs and fallback and not on_backup:
            steps.note(0, "received_on_backup")
        on_backup = fallback and (on_backup or bool(wcs))
        for wc in wcs:
            if wc.status != e.IBV_WC_SUCCESS:
                errors.append(f"qp {wc.qp_num} wr {wc.wr_id}: {e.ibv_wc_status(wc.status).name}")
                continue
            if wc.opcode != e.IBV_WC_RECV:
                continue
            lane = stack.by_qpn[wc.qp_num]
            stack.post_recv(lane)
            received += 1
            if wc.imm_data == PING and wc.wc_flags & e.IBV_WC_WITH_IMM:
                lane.qp.post_send(SendWR(wr_id=PING_WR, opcode=e.IBV_WR_SEND, sg=stack.sge))
    say(
        done=True,
        received=received,
        states=stack.states(),
        errors=errors[:10],
        rss=rss_kib(),
        steps=steps.kept(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["sender", "receiver"])
    parser.add_argument("--mode", choices=sorted(OPCODES), default="send")
    parser.add_argument("--plain", action="store_true", help="bare tcp-provider objects, no failover")
    parser.add_argument("--qps", type=int, default=1)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--window", type=int, default=16, help="outstanding WRs per QP")
    parser.add_argument("--signal-every", type=int, default=1)
    parser.add_argument("--block", action="store_true", help="wait on a completion channel, not busy")
    parser.add_argument(
        "--spin", action="store_true", help="busy-poll without sleeping (sched_yield): a latency test's poll"
    )
    parser.add_argument("--timeout", type=int, default=QPAttr.timeout)
    parser.add_argument("--retry-cnt", type=int, default=QPAttr.retry_cnt)
    parser.add_argument("--steps", action="store_true", help="keep the moments of each switch's steps")
    args = parser.parse_args()
    if args.steps:
        steps.keep()
    logging.basicConfig(level=os.environ.get("SHIFT_BENCH_LOG", "WARNING"), stream=sys.stderr)
    stack = Stack(args)
    say(
        endpoints=[lane.qp.endpoint().to_json() for lane in stack.lanes],
        addr=stack.mr.buf,
        rkey=stack.mr.rkey,
        rss=[stack.base_rss, rss_kib()],
    )
    peer = hear()
    started = time.monotonic()
    stack.connect(peer)
    say(connected=True, states=stack.states(), connected_s=time.monotonic() - started)
    orders = Orders()
    if args.role == "sender":
        Sender(stack, (peer["addr"], peer["rkey"]), args.signal_every).run(orders)
    else:
        run_receiver(stack, orders)
    stack.close()


if __name__ == "__main__":
    main()
