"""libshift.shift.keys.RemoteKeys against an agent whose lookups wait as shiftd's do: a key not published
holds the caller for the whole wait. What an application that registers memory per message needs: keys
withdrawn meanwhile do not hold up a live one, a miss in the background is asked again when a switch needs
the key, a final miss is remembered, neither the chains kept nor the lookups in flight grow without end, and
a QP that follows the peer is told each chain once, as it is found.
"""

from __future__ import annotations

import threading
import time

import pytest

from libshift.agent import MrBackup
from libshift.shift import keys
from libshift.shift.keys import RemoteKeys

GID, BACKUP_GID = "::ffff:198.18.0.11", "::ffff:198.18.1.11"


class WaitingAgent:
    """lookup_mr as shiftd answers it: at once for a published key, else after `wait` seconds, None."""

    def __init__(self) -> None:
        self.published: dict[int, int] = {}
        self.asked: list[tuple[int, float]] = []
        self._lock = threading.Lock()

    def lookup_mr(self, gid: str, rkey: int, wait: float = 0.0) -> MrBackup | None:
        with self._lock:
            self.asked.append((rkey, wait))
        backup = self.published.get(rkey)
        if backup is None:
            time.sleep(wait)
            backup = self.published.get(rkey)
        return None if backup is None else MrBackup(gid, rkey, BACKUP_GID, backup)


@pytest.fixture
def agent() -> WaitingAgent:
    return WaitingAgent()


@pytest.fixture
def remote(agent: WaitingAgent):
    keys_ = RemoteKeys(agent, depth=1)  # type: ignore[arg-type]
    yield keys_
    keys_.close()


class Follower:
    """What a QP following the peer is told: (rkey, chain) in order; open until `closed`."""

    def __init__(self) -> None:
        self.told: list[tuple[int, list[int]]] = []
        self.closed = False
        self.event = threading.Event()

    def __call__(self, rkey: int, chain: list[int]) -> bool:
        if self.closed:
            return False
        self.told.append((rkey, chain))
        self.event.set()
        return True


def test_a_published_key_is_prefetched_and_then_only_collected(agent, remote) -> None:
    agent.published[7] = 70
    follower = Follower()
    remote.follow(GID, follower)
    remote.prefetch(GID, 7)
    assert follower.event.wait(5) and follower.told == [(7, [70])]
    assert remote.backup(GID, 7) == 70
    assert agent.asked == [(7, keys.PREFETCH_WAIT)]
    assert follower.told == [(7, [70])]  # collected, not found again: told once


def test_a_follower_is_told_the_chains_kept_then_each_new_one_until_it_closes(agent, remote) -> None:
    agent.published.update({1: 10, 2: 20, 3: 30})
    assert remote.backup(GID, 1) == 10
    assert remote.backup("::ffff:198.18.0.99", 1) == 10  # another peer's: not told
    follower = Follower()
    remote.follow(GID, follower)
    assert follower.told == [(1, [10])]  # the chains kept, at once
    assert remote.backup(GID, 2) == 20  # found on this thread: told at once
    assert follower.told == [(1, [10]), (2, [20])]
    follower.closed = True
    assert remote.backup(GID, 3) == 30
    assert remote._followers[GID] == []  # dropped once it said it is closed


def test_withdrawn_keys_do_not_hold_up_a_live_one(agent, remote, monkeypatch) -> None:
    monkeypatch.setattr(keys, "PREFETCH_WAIT", 0.3)
    for stale in range(100, 110):  # each holds a lookup worker 0.3 s: 1.5 s of queue for two workers
        remote.prefetch(GID, stale)
    agent.published[7] = 70
    remote.prefetch(GID, 7)  # queued behind them
    started = time.monotonic()
    assert remote.backup(GID, 7) == 70
    assert time.monotonic() - started < 0.2  # asked on the switch's own thread, not behind the queue


def test_a_background_miss_is_asked_again_when_a_switch_needs_it(agent, remote, monkeypatch) -> None:
    monkeypatch.setattr(keys, "PREFETCH_WAIT", 0.05)
    remote.prefetch(GID, 7)
    deadline = time.monotonic() + 5
    while len(agent.asked) < 1 or remote._pending:  # the miss has come back
        assert time.monotonic() < deadline
        time.sleep(0.01)
    follower = Follower()
    remote.follow(GID, follower)
    assert follower.told == []  # a miss is no chain
    agent.published[7] = 70  # published late
    assert remote.backup(GID, 7) == 70
    assert [wait for _, wait in agent.asked] == [0.05, keys.LOOKUP_WAIT]


def test_a_final_miss_is_remembered(agent, remote, monkeypatch) -> None:
    monkeypatch.setattr(keys, "LOOKUP_WAIT", 0.05)
    assert remote.backup(GID, 9) is None
    assert remote.backup(GID, 9) is None
    assert agent.asked == [(9, 0.05)]  # one full wait, then the answer stands


def test_lookups_in_flight_and_chains_kept_are_bounded(agent, remote, monkeypatch) -> None:
    monkeypatch.setattr(keys, "PENDING_MAX", 3)
    monkeypatch.setattr(keys, "PREFETCH_WAIT", 0.2)
    for rkey in range(10):  # none published: each lookup is slow
        remote.prefetch(GID, rkey)
    time.sleep(0.6)
    assert len(agent.asked) == 3  # the rest were skipped, for a switch to ask
    monkeypatch.setattr(keys, "KEPT", 5)
    monkeypatch.setattr(keys, "PENDING_MAX", 1000)
    for rkey in range(100, 120):
        agent.published[rkey] = rkey + 1
    for rkey in range(100, 120):
        assert remote.backup(GID, rkey) == rkey + 1
    follower = Follower()
    remote.follow(GID, follower)
    assert follower.told == [(rkey, [rkey + 1]) for rkey in range(115, 120)]  # the last five
