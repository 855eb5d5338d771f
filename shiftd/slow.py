"""Whether a NIC carries its traffic far slower than it has: the judge of one NIC's throughput (a slow path).

A port that trained at a lower speed, or a link shaped or policed somewhere on the way, loses little or
nothing; what shows it is throughput. The tcp_loss monitor counts, every poll, the bytes the NIC's TCP
connections had acknowledged, and among them those of connections the network held back (they had more to
send than the path took, and a peer ready for it: shiftd/monitors/tcp_loss.py). This judge keeps the NIC's
best rate, the rate of a window of `window_seconds` taken while the NIC was judged healthy (decaying with
`best_half_life_seconds`, so that a lasting change becomes the norm), and judges:

- slow once a window holds at least `min_polls` polls whose traffic the network held back, and that traffic
  ran at less than `enter_fraction` of the best. Only such polls count: an application that computes, waits
  or sends little is not a slow link. A loaded healthy link runs its held-back traffic at its capacity, and
  congestion elsewhere costs a share of it, far above the fraction. The rate is over the time that traffic
  was in flight (the kernel's tcpi_busy_time, where it says; else the poll's): a burst of a few
  milliseconds held back by the network (a training step's gradients) and then quiet is a fast link, not
  its bytes spread over the whole poll. It is taken by peer and added up (held_rate): one peer's slow
  link is that peer's, not this NIC's;
- healthy again once `hold_seconds` have passed since the last window below `exit_fraction`, with the
  damper's back-off (verdict.py: the hysteresis both judges share).

What it cannot see: a NIC slow since its first byte (it has no best yet: `min_best_bytes_per_second`), and
RDMA traffic, whose ports count bytes but not whether the application kept them busy.

Pure like the health machine that owns it: every call carries `now`.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from shiftd.config import DampingConfig, SlowConfig
from shiftd.nic import PeerTraffic
from shiftd.verdict import Judge

REASON = "slow"


class Poll(NamedTuple):
    now: float
    seconds: float  # since the poll before
    busy: float  # of them, the seconds the held-back bytes were in flight
    acked: int
    limited: int  # held back
    peers: tuple[tuple[str, int, float], ...]  # the held-back bytes by peer, and their seconds in flight


def in_flight(busy: float, seconds: float) -> float:
    """The seconds held-back bytes were in flight in a poll of `seconds` (busy 0: not known, all of it)."""
    return min(busy, seconds) if busy > 0 else seconds


def held_rate(held: list[Poll]) -> float:
    """The rate of the held-back traffic of these polls. By peer where the polls say, added up: each peer's
    bytes over its own time in flight, so that a peer's slow link, busy all the time with little, does not
    stretch the time of the others' fast bursts (the NIC would look slow for one peer's fault); a NIC that
    is slow itself is slow towards every peer, and their rates add up to its own."""
    if not any(p.peers for p in held):
        return sum(p.limited for p in held) / sum(p.busy for p in held)
    peers: dict[str, list[float]] = {}
    for poll in held:
        for peer, limited, busy in poll.peers:
            totals = peers.setdefault(peer, [0.0, 0.0])
            totals[0] += limited
            totals[1] += busy
    return sum(limited / busy for limited, busy in peers.values())


class SlowJudge(Judge):
    def __init__(self, config: SlowConfig, damping: DampingConfig) -> None:
        super().__init__(config.hold_seconds, damping)
        self.config = config
        self.best = 0.0  # bytes a second, decaying
        self.rate: float | None = None  # the last window's held-back rate; None without enough polls
        self._best_at: float | None = None
        self._last: float | None = None  # the last poll's time
        self._polls: deque[Poll] = deque()

    def add(
        self, now: float, acked: int, limited: int, busy: float = 0.0, by_peer: tuple[PeerTraffic, ...] = ()
    ) -> bool:
        """One poll's bytes acknowledged, of those the held-back ones, and the seconds those were in flight
        (0: not known, the poll's own are taken), the same by peer where known; whether the verdict
        changed."""
        seconds = 0.0 if self._last is None else now - self._last
        self._last = now
        peers = tuple((p.peer, p.limited, in_flight(p.busy, seconds)) for p in by_peer if p.limited)
        self._polls.append(Poll(now, seconds, in_flight(busy, seconds), acked, limited, peers))
        window = self.config.window_seconds
        while self._polls[0].now <= now - window:
            self._polls.popleft()
        held = [p for p in self._polls if p.seconds > 0 and p.busy > 0 and 2 * p.limited >= p.acked > 0]
        enough = len(held) >= self.config.min_polls and self.best >= self.config.min_best_bytes_per_second
        self.rate = held_rate(held) if enough else None
        seconds_seen = sum(p.seconds for p in self._polls)
        if not self.degraded and seconds_seen >= 0.9 * window:  # a whole window: what the NIC carried
            self._learn(now, sum(p.acked for p in self._polls) / seconds_seen)
        if self.rate is None:
            return self.verdict.judge(now, False, False, False)
        config = self.config
        return self.verdict.judge(
            now,
            True,
            self.rate < config.enter_fraction * self.best,
            self.rate < config.exit_fraction * self.best,
        )

    def _learn(self, now: float, rate: float) -> None:
        if self._best_at is not None:
            self.best *= 0.5 ** ((now - self._best_at) / self.config.best_half_life_seconds)
        self._best_at = now
        self.best = max(self.best, rate)
