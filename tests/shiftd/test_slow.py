"""The speed judge (shiftd/slow.py) on a fake clock: a NIC whose traffic, held back by the network, runs far
below the NIC's own best is slow; one whose application sends little, or a loaded healthy one, is not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shiftd.config import DampingConfig, SlowConfig
from shiftd.health import NicHealth
from shiftd.nic import LinkStatus, NicSpec, NicState, PeerTraffic, Traffic
from shiftd.nics import NicTable
from shiftd.slow import SlowJudge

POLL = 0.2
GB = 1 << 30
CONFIG = SlowConfig(hold_seconds=5.0)
NO_DAMPING = DampingConfig(penalty=0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def feed(
        self, judge: SlowJudge, seconds: float, rate: float, held: bool = True, busy: float = 0.0
    ) -> list[float]:
        """Polls for `seconds` of traffic at `rate` bytes a second (held back by the network, or not; in
        flight `busy` seconds of each poll, 0: not known); when the verdict changed."""
        changes = []
        for _ in range(round(seconds / POLL)):
            self.now += POLL
            acked = int(rate * POLL)
            if judge.add(self.now, acked, acked if held else 0, busy):
                changes.append(self.now)
        return changes


def judged_healthy(rate: float = GB) -> tuple[SlowJudge, Clock]:
    judge, clock = SlowJudge(CONFIG, NO_DAMPING), Clock()
    clock.now = 100.0
    judge.add(clock.now, 0, 0)  # the first poll: no interval yet
    assert clock.feed(judge, 3.0, rate) == []
    return judge, clock


def test_a_nic_far_below_its_best_is_slow_within_a_window_and_healthy_again_after_the_hold() -> None:
    judge, clock = judged_healthy()
    assert judge.best == pytest.approx(GB, rel=1e-3) and judge.rate == pytest.approx(GB, rel=1e-3)
    faulted = clock.now
    changes = clock.feed(judge, 2.0, GB / 100)  # a link shaped to a hundredth
    assert len(changes) == 1 and judge.degraded
    assert changes[0] - faulted <= CONFIG.window_seconds + POLL
    assert judge.best == pytest.approx(GB, rel=1e-3)  # what it ran at while slow taught it nothing
    moved = clock.now
    changes = clock.feed(judge, 10.0, 0)  # the traffic moved away: no evidence either way
    assert changes and changes[0] - moved >= CONFIG.hold_seconds - CONFIG.window_seconds
    assert not judge.degraded


def test_an_application_that_sends_little_or_a_loaded_healthy_link_is_not_slow() -> None:
    judge, clock = judged_healthy()
    assert clock.feed(judge, 5.0, GB / 100, held=False) == []  # a trickle the application chose
    assert judge.rate is None
    assert clock.feed(judge, 5.0, GB / 4) == []  # four flows share the link: a quarter each
    assert clock.feed(judge, 5.0, GB / 5) == []
    assert not judge.degraded and judge.rate is not None


def test_bursts_of_a_fast_link_are_not_slow_for_the_quiet_between_them() -> None:
    """A training step's gradients: a few milliseconds at the link's speed, held back by the network (it
    had more to send than the path took), then quiet until the next step. Over the whole poll that is a
    fortieth of the best; over the time it was in flight (tcpi_busy_time), the best."""
    judge, clock = judged_healthy()
    assert clock.feed(judge, 5.0, GB / 40, busy=POLL / 40) == []
    assert judge.rate == pytest.approx(GB, rel=1e-3) and not judge.degraded
    judge, clock = judged_healthy()
    assert len(clock.feed(judge, 5.0, GB / 40)) == 1  # the kernel not saying how long: the poll's time
    assert judge.degraded
    assert clock.feed(judge, 0.4, GB / 100, busy=POLL) == []  # a slow link is in flight all the time


def two_peers(
    judge: SlowJudge, clock: Clock, seconds: float, fast: PeerTraffic, slow: PeerTraffic
) -> list[float]:
    """Polls for `seconds`, each with these two peers' held-back bytes and times in flight; when the
    verdict changed. The NIC's own time in flight is the longer of the two (their sockets ran at once)."""
    changes = []
    for _ in range(round(seconds / POLL)):
        clock.now += POLL
        limited = fast.limited + slow.limited
        if judge.add(clock.now, limited, limited, max(fast.busy, slow.busy), (fast, slow)):
            changes.append(clock.now)
    return changes


def test_one_peers_slow_link_beside_a_fast_one_is_not_this_nics() -> None:
    """Bursts to a healthy peer at the NIC's speed (5 ms a poll), and a peer behind a slow link busy the
    whole poll with little. Over the NIC's longest time in flight the bursts look a fortieth of the best;
    by peer, the healthy one runs at the best and the NIC is not slow. A NIC slow itself is slow towards
    both."""
    judge, clock = judged_healthy()
    fast = PeerTraffic("h2", 0, 0, int(GB * POLL / 40), POLL / 40)
    slow = PeerTraffic("h1", 0, 0, int(GB * POLL / 1000), POLL)
    assert two_peers(judge, clock, 5.0, fast, slow) == []
    assert judge.rate == pytest.approx(GB * 1.001, rel=1e-3) and not judge.degraded
    both = PeerTraffic("h2", 0, 0, int(GB * POLL / 1000), POLL)
    assert len(two_peers(judge, clock, 2.0, both, slow)) == 1 and judge.degraded
    unknown, its_clock = judged_healthy()  # no peers given: the NIC's figure, over its longest time in flight
    assert len(its_clock.feed(unknown, 2.0, GB / 40 + GB / 1000, busy=POLL)) == 1


def test_a_nic_that_never_ran_fast_has_no_verdict() -> None:
    judge, clock = SlowJudge(CONFIG, NO_DAMPING), Clock()
    judge.add(clock.now, 0, 0)
    assert clock.feed(judge, 5.0, CONFIG.min_best_bytes_per_second / 2) == []
    assert judge.rate is None


def test_the_best_decays_so_a_lasting_change_becomes_the_norm() -> None:
    config = replace(CONFIG, best_half_life_seconds=10.0)
    judge, clock = SlowJudge(config, NO_DAMPING), Clock()
    judge.add(clock.now, 0, 0)
    clock.feed(judge, 2.0, GB)
    clock.feed(judge, 60.0, 0)  # idle for six half-lives
    assert clock.feed(judge, 3.0, GB / 20) == []  # a twentieth of the old best is the new normal
    assert GB / 21 < judge.best < GB / 16


def test_the_health_machine_says_slow_and_the_table_moves_off_it() -> None:
    specs = [NicSpec("mlx5_0", "eth0", "tcp"), NicSpec("mlx5_1", "eth1", "tcp")]
    clock = Clock()
    nics = NicTable(
        specs, 0.0, lambda record, t: None, clock=lambda: clock.now, slow=CONFIG, damping=NO_DAMPING
    )
    up = LinkStatus(
        "eth0", present=True, admin_up=True, operstate="up", carrier=True, addresses=("198.18.0.1",)
    )
    nics.link_changed(up)
    nics.link_changed(replace(up, netdev="eth1", addresses=("198.18.1.1",)))

    def poll(rate: float) -> None:
        clock.now += POLL
        acked = int(rate * POLL)
        nics.traffic_sent({"198.18.0.1": Traffic(100, 0, acked, acked)})

    for _ in range(15):
        poll(GB)
    assert not nics.move_off("mlx5_0")
    for _ in range(10):
        poll(GB / 50)
    health = nics.get("mlx5_0").health
    assert (health.state, health.reason) == (NicState.DEGRADED, "slow")
    assert nics.move_off("mlx5_0")  # mlx5_1 is UP and neither slow nor lossy
    assert isinstance(health, NicHealth) and nics.get("mlx5_1").health.state is NicState.UP
