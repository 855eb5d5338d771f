"""What the two JSON-lines stream peers share: bench/failover_peer.py (the benchmarks' streams) and
tests/failover/peer.py (the failover tests' checked streams, which loads this file by path).

Both run on a lab host, build one side's verbs objects over mlx5_0 (shift objects, or the bare provider's),
print their endpoints as a JSON line, read the peer's, connect, and then take orders line by line on a
thread of their own. Each keeps its own orders and data loops.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from libshift.agent import Agent
from libshift.shift import ShiftCompChannel, ShiftContext, ShiftCQ, ShiftMR, ShiftPD, ShiftQP
from libshift.verbs import CQ, MR, PD, QP, CompChannel, Context, Endpoint, QPAttr, QPCap, QPInitAttr

DEVICE = "mlx5_0"
T = TypeVar("T")


def rss_kib() -> int:
    """This process's resident memory, KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def hear() -> dict[str, Any]:
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("stdin closed")
    return json.loads(line)


class Orders:
    """The orchestrator's lines, read on a thread of their own so that no data loop blocks on stdin; the end
    of stdin reads as {"stop": true}."""

    def __init__(self) -> None:
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            self.queue.put(json.loads(line))
        self.queue.put({"stop": True})

    def next(self, wait: float | None) -> dict[str, Any] | None:
        """The next order: waiting up to `wait` s (forever when None, not at all when 0), else None."""
        try:
            return self.queue.get(timeout=wait) if wait != 0 else self.queue.get_nowait()
        except queue.Empty:
            return None


class Verbs:
    """One side's verbs objects over `device` (DEVICE unless told) and one CQ: shift objects (failover
    through shiftd's agent, the context's own unless `agent` is given), or the bare provider's with `plain`;
    a completion channel with `block`. QPs come from create_qps, so that a caller can measure what the rest
    costs first."""

    def __init__(
        self,
        cqe: int,
        mr_bytes: int,
        access: int,
        plain: bool = False,
        block: bool = False,
        agent: Agent | None = None,
        device: str = DEVICE,
    ) -> None:
        self.plain = plain
        if plain:
            self.ctx: Any = Context(device)
            self.pd: Any = PD(self.ctx)
            self.mr: Any = MR(self.pd, mr_bytes, access)
            self.channel: Any = CompChannel(self.ctx) if block else None
            self.cq: Any = CQ(self.ctx, cqe, channel=self.channel)
        else:
            self.ctx = ShiftContext(device, agent=agent)
            self.pd = ShiftPD(self.ctx)
            self.mr = ShiftMR(self.pd, mr_bytes, access)
            self.channel = ShiftCompChannel(self.ctx) if block else None
            self.cq = ShiftCQ(self.ctx, cqe, channel=self.channel)

    def create_qps(self, count: int, cap: QPCap) -> list[Any]:
        make = QP if self.plain else ShiftQP
        return [make(self.pd, QPInitAttr(scq=self.cq, rcq=self.cq, cap=cap)) for _ in range(count)]

    @staticmethod
    def connect(qps: list[Any], endpoints: list[dict[str, Any]], attr: QPAttr) -> None:
        """Connect each QP to the peer's, in order, each with its own copy of `attr`."""
        for qp, endpoint in zip(qps, endpoints, strict=True):
            qp.connect(Endpoint.from_json(endpoint), dataclasses.replace(attr))

    def block(self, poll: Callable[[], list[T]], timeout: float) -> tuple[list[T], bool | None]:
        """Arm the CQ and wait on the channel up to `timeout` s. Returns what a poll right after the arming
        found (a completion may come between a poll and the arming) and whether the channel woke (None: it
        was not waited on, the poll found some)."""
        assert self.channel is not None
        self.cq.req_notify()
        polled = poll()
        if polled:
            return polled, None
        with contextlib.suppress(TimeoutError):
            self.channel.get_cq_event(timeout=timeout)
            return polled, True
        return polled, False
