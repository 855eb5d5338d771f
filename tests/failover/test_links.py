"""The link watch (libshift/shift/links.py) on a real veth pair in two namespaces: the kernel's own link
messages, read by the core's parser on the watch's thread."""

from __future__ import annotations

import logging
import os
import queue
import subprocess
import time
from collections.abc import Callable

import pytest

from libshift.shift.links import LinkWatch
from shiftlab.veth import VethPair

pytestmark = pytest.mark.lab

QUIET = 0.3  # how long nothing must be said for "nothing was said" (the kernel's messages come within ms)


@pytest.fixture
def pair():
    with VethPair(f"lw{os.getpid() % 100000}", subnet="198.18.94") as pair:
        yield pair


def keys_to(told: queue.Queue[str]) -> Callable[[str, int], None]:
    return lambda key, _seen_ns: told.put(key)


def test_a_watched_link_losing_its_carrier_is_told_and_its_return_is_not(pair: VethPair) -> None:
    """h1's end going down takes h0's carrier: the key of h0's netdev is told, once per failure, with the
    moment the watch read it; the carrier's return is shiftd's to judge (flap damping), so nothing is said
    of it."""
    told: queue.Queue[tuple[str, int]] = queue.Queue()
    h0 = pair.hosts[0]
    watch = LinkWatch({"primary": (h0.netdev, h0.netns)}, lambda key, seen: told.put((key, seen)), "test")
    try:
        assert watch.watched == {"primary"}
        before = time.monotonic_ns()
        pair.down(1)
        key, seen = told.get(timeout=5)
        assert key == "primary" and before < seen <= time.monotonic_ns()
        pair.restore(1)
        time.sleep(QUIET)
        assert told.empty()  # the failure's later messages and the return said nothing more
        pair.down(1)
        assert told.get(timeout=5)[0] == "primary"  # every failure, the second too
    finally:
        watch.close()
    assert not watch._thread.is_alive()  # the close really ended the thread


def test_only_the_watched_links_are_told(pair: VethPair) -> None:
    """A link of the same namespace that is not watched (h0's lo going down) says nothing; the other
    namespace's link with the same name is another link."""
    told: queue.Queue[str] = queue.Queue()
    h0, h1 = pair.hosts
    watch = LinkWatch({"primary": (h0.netdev, h0.netns)}, keys_to(told), "test")
    try:
        subprocess.run(["ip", "-n", h0.netns, "link", "set", "lo", "down"], check=True)
        subprocess.run(["ip", "-n", h1.netns, "link", "set", h1.netdev, "mtu", "1400"], check=True)
        time.sleep(QUIET)
        assert told.empty()
    finally:
        watch.close()


def test_a_netdev_that_is_not_there_is_left_out(pair: VethPair, caplog: pytest.LogCaptureFixture) -> None:
    h0 = pair.hosts[0]
    with caplog.at_level(logging.WARNING, logger="libshift.shift"):
        netdevs = {"primary": (h0.netdev, h0.netns), "backup": ("nosuchnic0", h0.netns)}
        watch = LinkWatch(netdevs, keys_to(queue.Queue()), "t")
    try:
        assert watch.watched == {"primary"}
        assert "no link watch on nosuchnic0" in caplog.text
    finally:
        watch.close()


def test_a_failing_reaction_does_not_stop_the_watch(pair: VethPair) -> None:
    """The callback raising (a refused verb in a switch) is logged; the next failure is told all the same."""
    told: queue.Queue[str] = queue.Queue()
    calls = []

    def react(key: str, _seen_ns: int) -> None:
        calls.append(key)
        if len(calls) == 1:
            raise RuntimeError("refused")
        told.put(key)

    h0 = pair.hosts[0]
    watch = LinkWatch({"primary": (h0.netdev, h0.netns)}, react, "test")
    try:
        pair.down(1)
        deadline = time.monotonic() + 5
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        pair.restore(1)
        time.sleep(QUIET)
        pair.down(1)
        assert told.get(timeout=5) == "primary"
    finally:
        watch.close()
