"""The loss judge (shiftd/loss.py) on a fake clock: thresholds, the floor of evidence, the hysteresis and
hold, and the back-off of a NIC found lossy again and again; then the health machine and the table on it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shiftd.config import DampingConfig, LossConfig
from shiftd.health import NicHealth
from shiftd.loss import LossJudge
from shiftd.nic import FaultMode, LinkStatus, NicSpec, NicState, PeerTraffic, PortStatus, Traffic
from shiftd.nics import NicTable

POLL = 0.1
CONFIG = LossConfig(
    window_seconds=0.5, min_segments=200, enter_percent=2.0, exit_percent=0.5, hold_seconds=3.0
)
DAMPING = DampingConfig(half_life_seconds=10.0, max_suppress_seconds=60.0)


def feed(judge: LossJudge, start: float, seconds: float, segments: int, retransmitted: int) -> list[float]:
    """One poll every POLL s for `seconds` from `start`, each with these counts; when the verdict changed."""
    changes = []
    for step in range(round(seconds / POLL)):
        now = start + step * POLL
        if judge.add(now, segments, retransmitted):
            changes.append(round(now, 6))
    return changes


def test_a_window_at_the_threshold_is_degraded_and_just_below_is_not() -> None:
    below, at = LossJudge(CONFIG, DAMPING), LossJudge(CONFIG, DAMPING)
    assert feed(below, 0.0, 2.0, 100, 1) == []  # 1 %: TCP copes; no move
    assert below.loss_percent == pytest.approx(1.0)
    assert feed(at, 0.0, 2.0, 100, 2) == [0.1]  # 2 %, judged once the window holds 200 segments
    assert at.degraded and at.loss_percent == pytest.approx(2.0)


def test_too_few_segments_decide_nothing_whatever_their_loss() -> None:
    judge = LossJudge(CONFIG, DAMPING)
    assert feed(judge, 0.0, 3.0, 30, 15) == []  # 150 segments a window, half of them resent
    assert judge.loss_percent is None and not judge.degraded


def test_the_verdict_holds_while_the_loss_stays_above_exit_and_clears_a_hold_after() -> None:
    judge = LossJudge(CONFIG, DAMPING)
    assert feed(judge, 0.0, 1.0, 100, 10) == [0.1]
    assert feed(judge, 1.0, 5.0, 100, 1) == []  # 1 %: below enter, above exit: still lossy
    # clean from 6.0: the windows still holding the last lossy polls end within the window's length
    (cleared,) = feed(judge, 6.0, 5.0, 100, 0)
    assert 6.0 + CONFIG.hold_seconds <= cleared <= 6.0 + CONFIG.window_seconds + CONFIG.hold_seconds
    assert not judge.degraded and judge.loss_percent == 0.0


def test_with_no_traffic_left_the_verdict_clears_a_hold_after_the_last_loss() -> None:
    """The traffic moved off the NIC: nothing says it healed, so it is tried again after the hold."""
    judge = LossJudge(CONFIG, DAMPING)
    assert feed(judge, 0.0, 0.5, 100, 10) == [0.1]
    (cleared,) = feed(judge, 0.5, 5.0, 0, 0)
    assert 0.5 + CONFIG.hold_seconds <= cleared <= 0.5 + CONFIG.window_seconds + CONFIG.hold_seconds
    assert judge.loss_percent is None


def test_a_nic_found_lossy_again_and_again_is_held_longer_each_time() -> None:
    """Each verdict is a flap for the judge's damper: the third within a half-life suppresses, and the hold
    then lasts until the penalty has decayed to reuse, past the fixed hold."""
    judge = LossJudge(CONFIG, DAMPING)
    holds, now = [], 0.0
    for _ in range(3):
        assert feed(judge, now, 0.2, 100, 10) == [pytest.approx(now + 0.1)]
        found = now = now + 0.1
        while not judge.add(now := now + POLL, 0, 0):  # nothing more sent there: the traffic moved off
            pass
        holds.append(now - found)
    assert CONFIG.hold_seconds <= holds[0] <= CONFIG.hold_seconds + CONFIG.window_seconds
    assert holds[1] == pytest.approx(
        holds[0], abs=1.5 * POLL
    )  # a penalty of ~1800: not above the suppress threshold
    assert holds[2] > holds[1] + 5.0  # ~2400: suppressed until it decays to 750, ~17 s on a 10 s half-life


def test_the_hysteresis_keeps_a_loss_between_exit_and_enter_from_flapping_the_verdict() -> None:
    judge = LossJudge(CONFIG, DAMPING)
    changes = feed(judge, 0.0, 0.3, 100, 3)  # 3 %: lossy
    for n in range(10):  # then 0.6 % and 1.9 % in turn, around neither threshold
        changes += feed(judge, 0.3 + n, 1.0, 1000, 6 if n % 2 else 19)
    assert changes == [0.1] and judge.degraded


TCP = NicSpec("mlx5_0", "eth0", "tcp")
UP_LINK = LinkStatus("eth0", True, admin_up=True, operstate="up", carrier=True, addresses=("198.18.0.1",))


def healthy(spec: NicSpec = TCP, link: LinkStatus = UP_LINK) -> NicHealth:
    health = NicHealth(spec, 1.0, DAMPING, CONFIG)
    health.update_link(link, 0.0)
    assert health.state is NicState.UP
    return health


def feed_peers(judge: LossJudge, seconds: float, *counts: tuple[str, int, int]) -> list[float]:
    """As feed, from 0, with these counts by peer each poll (the NIC's own: their sums)."""
    changes = []
    peers = tuple(PeerTraffic(*c) for c in counts)
    for step in range(round(seconds / POLL)):
        now = step * POLL
        segments, retransmitted = sum(p.segments for p in peers), sum(p.retransmitted for p in peers)
        if judge.add(now, segments, retransmitted, peers):
            changes.append(round(now, 6))
    return changes


def test_a_loss_towards_one_peer_beside_clean_ones_is_the_peers_not_this_nics() -> None:
    """The whole NIC's traffic loses 5% (one peer's 10%), but another peer's is clean: the peer's link."""
    judge = LossJudge(CONFIG, DAMPING)
    assert feed_peers(judge, 2.0, ("h1", 100, 10), ("h2", 100, 0)) == []  # no verdict before h2's is known
    assert judge.loss_percent == 0.0 and judge.lossy_peers == ("h1",)


def test_a_loss_towards_every_measured_peer_is_this_nics() -> None:
    judge = LossJudge(CONFIG, DAMPING)
    assert feed_peers(judge, 1.0, ("h1", 100, 10), ("h2", 100, 5)) == [0.0]  # neither looks clean
    assert judge.loss_percent == pytest.approx(5.0) and judge.lossy_peers == ()


def test_with_one_peer_measured_nothing_tells_whose_loss_it_is_and_the_nic_is_judged() -> None:
    """A peer with too few segments to judge proves nothing; one peer measured alone is the whole NIC."""
    judge = LossJudge(CONFIG, DAMPING)
    assert feed_peers(judge, 1.0, ("h1", 100, 10), ("h2", 10, 1)) == [0.1]
    assert judge.loss_percent == pytest.approx(100 * 55 / 550)
    trickle = LossJudge(CONFIG, DAMPING)  # a clean-looking trickle (50 segments a window) proves nothing
    assert feed_peers(trickle, 1.0, ("h1", 100, 10), ("h2", 10, 0)) == [0.1]


def test_health_says_degraded_for_lost_traffic_and_up_once_the_judge_clears() -> None:
    health = healthy()
    assert health.update_traffic(100, 0, 0.1) is None
    moved = health.update_traffic(300, 30, 0.2)
    assert moved is not None and (moved.previous, moved.state, moved.reason) == (
        NicState.UP,
        NicState.DEGRADED,
        "retransmits",
    )
    changes = [health.update_traffic(0, 0, 0.2 + n * POLL) for n in range(1, 40)]
    back = [c for c in changes if c is not None]
    assert [(c.state, c.reason) for c in back] == [(NicState.UP, "up")]
    assert 0.2 + CONFIG.hold_seconds <= back[0].at <= 0.2 + CONFIG.window_seconds + CONFIG.hold_seconds


def test_lost_traffic_is_named_before_an_operators_gray_fault_and_the_change_is_told() -> None:
    health = healthy()
    assert health.set_fault(FaultMode.LOSSY, 0.1).reason == "operator_lossy"
    moved = health.update_traffic(400, 40, 0.2)
    assert moved is not None and (moved.previous, moved.state, moved.reason) == (
        NicState.DEGRADED,
        NicState.DEGRADED,
        "retransmits",
    )


def test_a_down_nic_stays_down_whatever_its_traffic_says() -> None:
    health = healthy()
    health.update_link(replace(UP_LINK, carrier=False, operstate="lowerlayerdown"), 0.1)
    assert health.update_traffic(400, 40, 0.2) is None
    assert (health.state, health.reason) == (NicState.DOWN, "carrier_lost")


def lost(segments: int, retransmitted: int) -> Traffic:
    """A poll's traffic of segments sent and resent (no bytes acknowledged: nothing for the speed judge)."""
    return Traffic(segments, retransmitted, 0, 0)


def table(*transitions: list) -> NicTable:
    specs = [TCP, NicSpec("mlx5_1", "eth1", "tcp")]
    nics = NicTable(specs, 1.0, lambda record, t: transitions[0].append(t) if transitions else None)
    nics.link_changed(UP_LINK)
    nics.link_changed(replace(UP_LINK, netdev="eth1", addresses=("198.18.1.1",)))
    return nics


def test_the_table_gives_each_nic_the_traffic_of_its_addresses() -> None:
    seen: list = []
    nics = table(seen)
    seen.clear()
    nics.traffic_sent({"198.18.0.1": lost(500, 50), "198.18.1.1": lost(500, 0), "10.0.0.1": lost(500, 500)})
    assert [(t.device, t.state, t.reason) for t in seen] == [("mlx5_0", NicState.DEGRADED, "retransmits")]
    assert nics.get("mlx5_1").health.loss.loss_percent == 0.0


def test_the_table_adds_each_peers_counts_over_the_nics_addresses() -> None:
    """A NIC with two addresses: each peer's segments from both are one figure (h1's 10% is h1's)."""
    nics = table()
    nics.link_changed(replace(UP_LINK, addresses=("198.18.0.1", "198.18.0.5")))
    towards = {
        "198.18.0.1": Traffic(300, 20, 0, 0, by_peer=(PeerTraffic("h1", 100, 20), PeerTraffic("h2", 200, 0))),
        "198.18.0.5": Traffic(200, 0, 0, 0, by_peer=(PeerTraffic("h1", 100, 0), PeerTraffic("h2", 100, 0))),
    }
    nics.traffic_sent(towards)
    judge = nics.get("mlx5_0").health.loss
    assert judge.loss_percent == 0.0 and judge.lossy_peers == ("h1",)
    assert nics.get("mlx5_0").health.state is NicState.UP


def test_move_off_only_a_lossy_nic_with_a_healthy_one_beside_it() -> None:
    nics = table()
    assert not nics.move_off("mlx5_0")  # nothing lost
    nics.traffic_sent({"198.18.0.1": lost(500, 50)})
    assert nics.move_off("mlx5_0")
    nics.link_changed(replace(UP_LINK, netdev="eth1", carrier=False, operstate="lowerlayerdown"))
    assert not nics.move_off("mlx5_0")  # the other NIC is DOWN: better a lossy NIC than none
    both = table()
    both.traffic_sent({"198.18.0.1": lost(500, 50), "198.18.1.1": lost(500, 50)})
    assert not both.move_off("mlx5_0")  # both lose: no better place to go


def test_an_rdma_ports_resends_are_judged_as_tcps_are() -> None:
    seen: list = []
    nics = NicTable([NicSpec("mlx5_0", "", "verbs")], 1.0, lambda record, t: seen.append(t))
    nics.port_changed(PortStatus("mlx5_0", 1, "ACTIVE", "LinkUp"))
    nics.port_sent("mlx5_0", 1, 1000, 10)  # 1%
    nics.port_sent("mlx5_0", 1, 1000, 50)  # 3% over the window
    assert [(t.state, t.reason) for t in seen] == [(NicState.UP, "up"), (NicState.DEGRADED, "retransmits")]
    nics.port_sent("mlx5_9", 1, 1000, 500)  # a port shiftd does not watch: nothing


def test_the_table_tells_of_a_nic_given_other_addresses_but_not_of_its_first_report_or_its_removal() -> None:
    readdressed: list[tuple[str, tuple[str, ...], tuple[str, ...], str]] = []
    nics = NicTable(
        [TCP],
        1.0,
        lambda record, t: None,
        on_readdressed=lambda record, before, gid: readdressed.append(
            (record.name, before, record.health.link.addresses, gid)
        ),
    )
    nics.link_changed(UP_LINK)  # the first report: nothing was known before
    nics.link_changed(replace(UP_LINK, carrier=False, operstate="lowerlayerdown"))  # same addresses
    nics.link_changed(replace(UP_LINK, addresses=("198.18.0.9",)))
    nics.link_changed(LinkStatus("eth0", present=False))  # removed: its addresses went with it, not changed
    assert readdressed == [("mlx5_0", ("198.18.0.1",), ("198.18.0.9",), "::ffff:198.18.0.1")]
    # back with the address it had: no GID replaced; then re-addressed the way `ip addr` does it, the old
    # address deleted first: the GID it replaces is told when the new one comes, not the moment with none
    nics.link_changed(replace(UP_LINK, addresses=("198.18.0.9",)))
    nics.link_changed(replace(UP_LINK, addresses=()))
    nics.link_changed(replace(UP_LINK, addresses=("198.18.0.7",)))
    assert readdressed[1:] == [
        ("mlx5_0", (), ("198.18.0.9",), ""),
        ("mlx5_0", ("198.18.0.9",), (), ""),
        ("mlx5_0", (), ("198.18.0.7",), "::ffff:198.18.0.9"),
    ]
