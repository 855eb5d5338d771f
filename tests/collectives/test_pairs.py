"""Point to point (pairs.py) between two Communicators of one process, over loopback tcp devices.

No shiftd: the QPs are plain, so what is checked is the staging itself: order, messages of many chunks,
sends ahead of their receives and more than the slots hold, empty arrays, a mistake that fails the
receive and leaves the pair usable, and a close that ends what still waits; and large messages written
straight into their receives, whole or after a staged beginning, or staged when they do not fit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from libshift.collectives import CollectiveError, Communicator, FileStore, NoPathLeft
from libshift.collectives.direct import AHEAD
from libshift.collectives.peer import DIRECT_MIN, MAILBOX, PAYLOAD, SLOTS, Peer

WAIT = 30.0
LARGE = 4 << 20  # registered in place at once (buffers.IN_PLACE_MIN): a message that can go direct


class Outcome:
    """A transfer's end, as its `done` callback tells it (on the pairs' thread)."""

    def __init__(self) -> None:
        self.ended = threading.Event()
        self.error: BaseException | None = None

    def __call__(self, error: BaseException | None) -> None:
        self.error = error
        self.ended.set()

    def result(self) -> BaseException | None:
        assert self.ended.wait(WAIT), "the transfer did not end"
        return self.error


@contextmanager
def two_ranks(directory: Path) -> Iterator[tuple[Communicator, Communicator]]:
    """Ranks 0 and 1 of one process on a loopback device, closed at the end (together: each one's close
    waits for the other's farewell)."""
    store = FileStore(directory, timeout=WAIT)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SHIFT_TCP_DEVICES", "mlx5_0=lo")
        env.setenv("SHIFT_SOCKET", str(directory / "shiftd.sock"))  # no shiftd
        env.setenv("SHIFT_DEVICE", "mlx5_0")
        made: dict[int, Communicator] = {}
        together(*(lambda r=r: made.__setitem__(r, Communicator(store, r, 2)) for r in (0, 1)))
        assert set(made) == {0, 1}, "the ring did not connect"
        try:
            yield made[0], made[1]
        finally:
            together(*(comm.close for comm in made.values()))


def together(*calls: Callable[[], object]) -> None:
    threads = [threading.Thread(target=call) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Communicator, Communicator]]:
    with two_ranks(tmp_path_factory.mktemp("pair")) as made:
        yield made


def send(comm: Communicator, array: np.ndarray, peer: int, tag: int = 0) -> Outcome:
    outcome = Outcome()
    comm.send(array, peer, tag, outcome)
    return outcome


def recv(comm: Communicator, array: np.ndarray, peer: int, tag: int = 0) -> Outcome:
    outcome = Outcome()
    comm.recv(array, peer, tag, outcome)
    return outcome


def test_sends_and_receives_pair_up_in_order(pair) -> None:
    a, b = pair
    arrays = [np.arange(n, dtype=np.int64) * (n + 1) for n in (1, 1000, 300_000)]
    sent = [send(a, x, 1, tag=5) for x in arrays]
    got = [np.zeros_like(x) for x in arrays]
    received = [recv(b, g, 0, tag=5) for g in got]
    assert [o.result() for o in sent + received] == [None] * 6
    for want, have in zip(arrays, got, strict=True):
        assert np.array_equal(want, have)


def test_a_small_send_ends_before_its_receive_is_posted(pair) -> None:
    a, b = pair
    assert send(a, np.arange(10, dtype=np.int16), 1, tag=3).result() is None  # it waits in b's staging
    got = np.zeros(10, np.int16)
    assert recv(b, got, 0, tag=3).result() is None
    assert got.tolist() == list(range(10))


def test_more_transfers_out_than_slots_and_both_directions_at_once(pair) -> None:
    a, b = pair
    count = 3 * SLOTS
    got = [np.zeros(16, np.float32) for _ in range(count)]
    back = np.zeros(4, np.uint8)
    received = [recv(b, g, 0, tag=i) for i, g in enumerate(got)]  # all posted before any send
    back_recv = recv(a, back, 1, tag=99)
    sent = [send(a, np.full(16, i, np.float32), 1, tag=i) for i in range(count)]
    back_sent = send(b, np.array([1, 2, 3, 4], np.uint8), 0, tag=99)
    assert all(o.result() is None for o in [*received, *sent, back_recv, back_sent])
    assert [int(g[0]) for g in got] == list(range(count)) and all((g == g[0]).all() for g in got)
    assert back.tolist() == [1, 2, 3, 4]


def test_an_empty_array_travels(pair) -> None:
    a, b = pair
    sent = send(b, np.zeros(0, np.float64), 0)
    assert recv(a, np.zeros(0, np.float64), 1).result() is None
    assert sent.result() is None


@pytest.mark.parametrize(("size", "tag"), [(8, 2), (9, 1)])  # another tag; another size
def test_a_mismatch_fails_the_receive_and_the_next_pair_works(pair, size: int, tag: int) -> None:
    a, b = pair
    sent = send(a, np.ones(8, np.int32), 1, tag=1)
    error = recv(b, np.zeros(size, np.int32), 0, tag=tag).result()
    assert sent.result() is None  # it went: the receiver finds the mistake
    assert isinstance(error, CollectiveError)
    assert str(error) == (
        f"rank 1: receive of {size * 4} bytes with tag {tag} from rank 0 met a send of 32 bytes with tag 1"
    )
    out = np.zeros(3, np.int32)
    sent = send(a, np.array([7, 8, 9], np.int32), 1)
    assert recv(b, out, 0).result() is None and sent.result() is None
    assert out.tolist() == [7, 8, 9]


def test_a_peer_that_is_not_another_rank_is_refused(pair) -> None:
    a, _ = pair
    with pytest.raises(ValueError, match=r"peer must be a rank in \[0, 2\), got 2"):
        a.send(np.zeros(1), 2, 0, Outcome())
    with pytest.raises(ValueError, match=r"peer must be another rank than this one \(0\)"):
        a.recv(np.zeros(1), 0, 0, Outcome())
    with pytest.raises(ValueError, match="read-only"):
        a.recv(np.frombuffer(b"12345678"), 1, 0, Outcome())


def test_closing_ends_the_transfers_still_waiting(tmp_path: Path) -> None:
    with two_ranks(tmp_path) as (a, b):
        waiting = recv(b, np.zeros(4, np.int32), 0, tag=8)  # no send comes
        sent = send(b, np.ones(2, np.int32), 0, tag=9)  # the other way: the pair is connected
        assert recv(a, np.zeros(2, np.int32), 1, tag=9).result() is None and sent.result() is None
    error = waiting.result()
    assert isinstance(error, CollectiveError)
    assert str(error) == "rank 1: closed before the transfer ended"


def peer_of(comm: Communicator, q: int) -> Peer:
    assert comm._pairs is not None
    return comm._pairs.peers[q]


def wait_until(predicate: Callable[[], bool]) -> None:
    deadline = threading.Event()
    for _ in range(int(WAIT / 0.01)):
        if predicate():
            return
        deadline.wait(0.01)
    raise AssertionError("not within the wait")


@pytest.fixture
def fresh_pair(tmp_path: Path) -> Iterator[tuple[Communicator, Communicator]]:
    """A pair of its own: direct placement's counts of registrations start from nothing."""
    with two_ranks(tmp_path) as made:
        yield made


def exchange(
    sender: Communicator, want: np.ndarray, receiver: Communicator, got: np.ndarray, tag: int
) -> None:
    """One message, its receive posted and announced (when it can be) before its send."""
    received = recv(receiver, got, sender.rank, tag)
    if receiver._pairs is not None and got.nbytes >= DIRECT_MIN and sender._pairs is not None:
        time.sleep(0.05)  # time for the announcement, if one goes
    assert send(sender, want, receiver.rank, tag).result() is None and received.result() is None
    assert np.array_equal(got, want)


def test_a_large_message_into_memory_used_before_goes_straight_into_its_receive(fresh_pair) -> None:
    a, b = fresh_pair
    want, got = np.random.default_rng(1).random(LARGE // 8), np.zeros(LARGE // 8)
    exchange(a, want, b, got, tag=4)  # the receive's first use: staged (buffers.py), no announcement
    assert peer_of(a, 1).written > 0 and peer_of(b, 0).registered == 0
    exchange(a, want, b, got, tag=4)  # the receive's second: announced; the send's first: staged
    assert peer_of(b, 0).registered == 1 and peer_of(a, 1).registered == 0
    got[:] = 0
    received = recv(b, got, 0, tag=4)
    wait_until(lambda: 2 in peer_of(a, 1).announcements)
    written = peer_of(a, 1).written
    assert send(a, want, 1, tag=4).result() is None and received.result() is None
    assert np.array_equal(got, want)
    assert peer_of(a, 1).written == written  # the third: no chunk staged
    assert peer_of(a, 1).registered == 1 and peer_of(b, 0).reused == 1


def test_messages_sent_before_their_announcements_end_direct_or_staged(fresh_pair) -> None:
    a, b = fresh_pair
    want = [np.random.default_rng(seed).random(LARGE // 8) for seed in range(MAILBOX + 1)]
    got = [np.zeros_like(w) for w in want]
    for _ in range(4):  # the arrays come again, as a pipeline's buffers do
        sent = [send(b, w, 0, tag=i) for i, w in enumerate(want)]  # sent first, more than the mailbox holds
        received = [recv(a, g, 1, tag=i) for i, g in enumerate(got)]
        assert [o.result() for o in sent + received] == [None] * len(sent + received)
        assert all(np.array_equal(w, g) for w, g in zip(want, got, strict=True))
        for g in got:
            g[:] = 0
    assert peer_of(b, 0).reused > 0  # later rounds went direct, on the registrations of the first
    assert not peer_of(b, 0).announcements and not peer_of(a, 1).announcing


def test_both_ways_at_once_direct_and_staged_messages_mixed(fresh_pair) -> None:
    a, b = fresh_pair
    sizes = [LARGE, 100, PAYLOAD + 1, LARGE + 8, 0, DIRECT_MIN]
    arrays = {
        (x.rank, n): (np.random.default_rng(n).integers(0, 255, n, np.uint8), np.zeros(n, np.uint8))
        for x in (a, b)
        for n in sizes
    }
    for _ in range(4):
        for first, second in ((a, b), (b, a)):
            pairs = [arrays[first.rank, n] for n in sizes]
            one = [recv(second, g, first.rank, tag=7) for _, g in pairs[:3]]
            sent = [send(first, w, second.rank, tag=7) for w, _ in pairs]
            rest = [recv(second, g, first.rank, tag=7) for _, g in pairs[3:]]
            assert all(o.result() is None for o in [*one, *sent, *rest])
            assert all(np.array_equal(w, g) for w, g in pairs)
            for _, g in pairs:
                g[:] = 0
    assert peer_of(a, 1).reused > 0 and peer_of(b, 0).reused > 0


def test_a_large_receive_of_another_size_fails_and_the_next_pair_goes_direct(fresh_pair) -> None:
    a, b = fresh_pair
    want, got = np.arange(LARGE // 4, dtype=np.int32), np.zeros(LARGE // 4, np.int32)
    for _ in range(2):  # the receive registered, the send seen (test above)
        exchange(a, want, b, got, tag=6)
    wrong = np.zeros(LARGE // 4 + 1, np.int32)
    received = recv(b, wrong, 0, tag=6)
    assert send(a, want, 1, tag=6).result() is None  # staged: it does not fit
    error = received.result()
    assert isinstance(error, CollectiveError) and f"met a send of {LARGE} bytes with tag 6" in str(error)
    written = peer_of(a, 1).written
    exchange(a, want, b, got, tag=6)
    assert peer_of(a, 1).written == written  # direct


def test_fresh_memory_every_time_stops_registering(fresh_pair) -> None:
    a, b = fresh_pair
    want = np.random.default_rng(2).random(LARGE // 8)
    kept = []  # every array alive, so none comes again at an address seen before
    for _ in range(3 * AHEAD):
        got = np.zeros_like(want)
        kept.append(got)
        exchange(a, want, b, got, tag=1)
    assert peer_of(b, 0).registered <= AHEAD  # then staged: registering each would cost a round trip


def test_a_pair_that_lost_its_paths_while_idle_ends_the_job_only_when_used_again(tmp_path: Path) -> None:
    """Two ranks of one host whose NICs are each other's backup lose both paths of their pair with one NIC
    failure, while the ring's QPs (to other hosts) fail over. An idle pair that lost its paths must not end
    the job by itself: the collectives go on; a later transfer with that peer does end it (the job needs
    the link), with the reason and what to do, as a loss under way does."""
    with two_ranks(tmp_path) as (a, b):
        sent = send(b, np.ones(2, np.int32), 0, tag=1)
        assert recv(a, np.zeros(2, np.int32), 1, tag=1).result() is None and sent.result() is None
        lost = peer_of(b, 0)
        with b._ring.ctx.lock:  # as the failover layer does when no armed path is left
            lost.qp.switcher.give_up("QP 7 has no path left to its peer: this host's mlx5_0 is down (test)")
        time.sleep(0.3)  # the pair's receives flush meanwhile, on both sides: no alarm is raised
        arrays = [np.arange(5, dtype=np.float32), np.ones(5, np.float32)]
        together(*(lambda c=c, x=x: c.all_reduce(x) for c, x in zip((a, b), arrays, strict=True)))
        assert all(np.array_equal(x, np.arange(5, dtype=np.float32) + 1) for x in arrays)
        error = send(b, np.ones(2, np.int32), 0, tag=2).result()
        assert isinstance(error, NoPathLeft)
        assert str(error).startswith(
            "rank 1: the link to rank 0 is gone: QP 7 has no path left to its peer: this host's mlx5_0 is "
            "down (test). shift cannot carry this job on"
        )
