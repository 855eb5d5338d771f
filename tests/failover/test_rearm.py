"""The re-arm protocol's own rules (rearm.py), on a fake QP and clock:

- how often a QP that left its default path on its own completions (a silent failure: no NIC UP will come)
  tries it again: after RETRY_FIRST, then backing off; and the back-off goes on across a failback whose
  path fails again soon after, as a lossy link's does (the probe gets through, a message is lost), so that
  such a link is not tried every second for as long as it stays lossy;
- a peer's REARM read after a newer one for the same path (it came on another path, slower) is stale, and
  is not answered (test_third_nic saw it once: the second arm and the stale ARMED left the backup unarmed).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from libshift.shift import rearm
from libshift.shift.notify import Kind, Message
from libshift.shift.paths import PRIMARY
from libshift.shift.states import Send, State


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(rearm.time, "monotonic", clock)
    return clock


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the re-arm requests sent to the peer."""
    requests: list[str] = []
    monkeypatch.setattr(rearm.notify, "send_message", lambda *args: requests.append(args[-1].path))
    return requests


def on_the_backup() -> rearm.Rearm:
    """A QP in FALLBACK on its backup after a silent failure of its default path (device UP here)."""
    ctx = SimpleNamespace(devices={PRIMARY: "mlx5_0", "backup": "mlx5_1"}, lock=threading.RLock())
    ctx.device_up = lambda path: True
    qp = SimpleNamespace(ctx=ctx, qp_num=7, current="backup", state=State.FALLBACK)
    qp.states = SimpleNamespace(send=Send.FALLBACK)
    qp.armed = {PRIMARY: False, "backup": True}
    qp.peers = {PRIMARY: None, "backup": None}
    qp.qps = qp.controls = qp.targets = dict.fromkeys(qp.peers)
    qp.arms = []
    qp.arm = qp.arms.append
    return rearm.Rearm(qp)


def tries_after(schedule: rearm.Rearm, clock: Clock, sent: list[str]) -> float:
    """The QP failed over on its completions now: seconds until it asks for its default path again."""
    before = len(sent)
    schedule.resumed(False, "error_completion")
    started = clock.now
    while len(sent) == before:
        clock.now += 0.25
        schedule.retry_default(clock.now)
        assert clock.now - started < 100, "never tried again"
    assert sent[-1] == PRIMARY
    return clock.now - started


def test_a_path_that_fails_again_soon_after_each_failback_is_tried_ever_less_often(clock, sent) -> None:
    schedule = on_the_backup()
    waits = []
    for _ in range(6):
        waits.append(tries_after(schedule, clock, sent))
        schedule.resumed(True, "nic_recovered")  # home again, and lost again a second later
        clock.now += 1.0
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0]


def test_a_path_that_held_after_its_failback_starts_the_back_off_over(clock, sent) -> None:
    schedule = on_the_backup()
    for wait in (1.0, 2.0, 4.0):
        assert tries_after(schedule, clock, sent) == wait
        schedule.resumed(True, "nic_recovered")
        clock.now += 1.0
    clock.now += rearm.MENDED_AFTER  # it carried the traffic that long: mended
    assert tries_after(schedule, clock, sent) == 1.0


def test_a_stale_rearm_read_after_a_newer_one_is_not_answered(monkeypatch, sent) -> None:
    """The peer asked for its backup's re-arm on backup2 (epoch 2), failed back, and asked again on the
    default path (epoch 3); both are read in one pass, the newer first. Only the newer is armed and
    answered."""
    schedule = on_the_backup()
    qp = schedule.qp
    qp.current, qp.state = PRIMARY, State.DEFAULT
    qp.states = SimpleNamespace(send=Send.DEFAULT, live=True)
    qp.peers = dict.fromkeys((PRIMARY, "backup", "backup2"))
    qp.controls = {path: path for path in qp.peers}  # each path's control MR, as its name
    schedule._seen = dict.fromkeys(qp.peers)
    latest = {PRIMARY: Message(Kind.REARM, "backup", 3), "backup2": Message(Kind.REARM, "backup", 2)}
    monkeypatch.setattr(rearm.notify, "latest", latest.get)
    schedule.read()
    assert qp.arms == ["backup"]
    assert sent == ["backup"]  # one ARMED, for epoch 3
