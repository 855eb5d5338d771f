"""libshift.shift.keys.RemoteKeys against an agent whose lookups wait as shiftd's do: a key not published
holds the caller for the whole wait. What an application that registers memory per message needs: keys
withdrawn meanwhile do not hold up a live one, a miss in the background is asked again when a switch needs
the key, a final miss is remembered, and neither the chains kept nor the lookups in flight grow without end.
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


def test_a_published_key_is_prefetched_and_then_only_collected(agent, remote) -> None:
    agent.published[7] = 70
    got = threading.Event()
    chains: list[list[int]] = []
    remote.prefetch(GID, 7, lambda chain: (chains.append(chain), got.set()))
    assert got.wait(5) and chains == [[70]]
    assert remote.backup(GID, 7) == 70 and remote.known(GID, 1) == {7: 70}
    assert agent.asked == [(7, keys.PREFETCH_WAIT)]


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
    assert remote.known(GID, 1) == {}
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
    assert remote.known(GID, 1) == {rkey: rkey + 1 for rkey in range(115, 120)}  # the last five
