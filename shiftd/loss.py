"""Whether a NIC's traffic is being lost: the judge of one NIC's TCP retransmissions (a degraded path).

A link that drops a few percent of its packets keeps its carrier and its port; what shows it is the
transport retransmitting. The tcp_loss monitor counts, every poll, the data segments the NIC's TCP
connections sent and how many of them were retransmissions; this judge turns those counts into a verdict:

- degraded once a window of `window_seconds` holds at least `min_segments` segments of which
  `enter_percent` or more were retransmitted. The floor keeps a trickle of traffic from deciding on a
  handful of segments; a loaded but healthy link retransmits next to nothing, so the threshold is far above
  what congestion costs;
- healthy again once `hold_seconds` have passed since the last window at or above `exit_percent`, with
  the damper's back-off (verdict.py: the hysteresis both judges share).

Whose loss it is: a NIC, cable or port that loses packets loses them towards every peer; a peer's bad link
loses only what goes to that peer. So the NIC's figure is that of its cleanest peer with `min_segments` or
more in the window (the monitor counts by peer address): a peer reached cleanly proves the NIC sound, and
the loss towards another is that peer's, which its own shiftd sees towards everyone. With one peer, or
none measured, nothing tells the two apart and the NIC's own traffic is judged.

Pure like the health machine that owns it: every call carries `now`.
"""

from __future__ import annotations

from collections import deque

from shiftd.config import DampingConfig, LossConfig
from shiftd.nic import PeerTraffic, by_peer
from shiftd.verdict import Judge

REASON = "retransmits"


class LossJudge(Judge):
    def __init__(self, config: LossConfig, damping: DampingConfig) -> None:
        super().__init__(config.hold_seconds, damping)
        self.config = config
        self.loss_percent: float | None = None  # the last full window's figure; None without enough segments
        self.lossy_peers: tuple[str, ...] = ()  # the peers whose loss was left out of it (not this NIC's)
        # (now, segments, retransmitted, the same by peer)
        self._samples: deque[tuple[float, int, int, tuple[PeerTraffic, ...]]] = deque()

    def add(
        self, now: float, segments: int, retransmitted: int, by_peer: tuple[PeerTraffic, ...] = ()
    ) -> bool:
        """One poll's counts (what was sent since the last poll), and the same by peer where known; whether
        the verdict changed."""
        self._samples.append((now, segments, retransmitted, by_peer))
        while self._samples[0][0] <= now - self.config.window_seconds:
            self._samples.popleft()
        sent = sum(s for _, s, _, _ in self._samples)
        lost = sum(r for _, _, r, _ in self._samples)
        loss = 100.0 * lost / sent if sent >= self.config.min_segments else None
        loss, self.lossy_peers = self._cleanest_peer(loss)
        self.loss_percent = loss
        if loss is None:
            return self.verdict.judge(now, False, False, False)
        return self.verdict.judge(
            now, True, loss >= self.config.enter_percent, loss >= self.config.exit_percent
        )

    def _cleanest_peer(self, loss: float | None) -> tuple[float | None, tuple[str, ...]]:
        """The window's figure for this NIC: that of its cleanest peer with `min_segments` (a clean one
        proves the NIC sound, whatever the others lose), or with none such `loss`, its whole traffic's; None
        (no figure yet) while clean-looking peers not measured yet could still prove it sound. And the peers
        left out: those losing at the threshold or more beside a cleaner figure."""
        peers = {t.peer: t for t in by_peer(share for *_, shares in self._samples for share in shares)}
        enter, enough = self.config.enter_percent, self.config.min_segments
        figures = {p: 100.0 * t.retransmitted / t.segments for p, t in peers.items() if t.segments}
        measured = [figures[p] for p, t in peers.items() if t.segments >= enough]
        figure = min(measured) if measured else loss
        # clean-looking peers with half the segments it takes will be measured within a window: wait for
        # them; a trickle proves nothing either way
        unmeasured = [t for p, t in peers.items() if t.segments < enough and figures.get(p, 0) < enter]
        coming = sum(t.segments for t in unmeasured)
        if figure is not None and figure >= enter and coming >= enough / 2:
            return None, ()
        if figure is None or figure >= enter:
            return figure, ()
        return figure, tuple(sorted(p for p, f in figures.items() if f >= enter))
