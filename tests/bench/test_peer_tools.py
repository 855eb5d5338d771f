"""bench/peer_tools.py measures the lab's link with qperf and iperf3 and leaves no server behind.

On a 2 hosts x 1 NIC lab: the servers on h1's mlx5_0, the clients on h0's, a second each. The figures are
checked for sense (a latency in a plausible range, bandwidths positive), not for speed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from labs import running_lab

from shiftlab import netns
from shiftlab.lab import Lab
from shiftlab.veth import Host

pytestmark = [pytest.mark.lab, pytest.mark.timeout(60)]

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # the benches import each other so
import peer_tools  # noqa: E402

TOOLS = ("qperf", "iperf3")


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with running_lab("pt", hosts=2, nics=1) as lab:
        yield lab


def tools_in(ns: str) -> list[int]:
    """PIDs of qperf or iperf3 processes inside namespace `ns`."""
    inode = netns.path(ns).stat().st_ino
    found = []
    for proc in Path("/proc").iterdir():
        try:
            ours = proc.name.isdigit() and (proc / "comm").read_text().strip() in TOOLS
            if ours and os.stat(proc / "ns" / "net").st_ino == inode:
                found.append(int(proc.name))
        except OSError:
            continue  # ended meanwhile
    return found


def test_the_peer_tools_measure_the_lab_link_and_end_their_servers(lab: Lab) -> None:
    client, server = peer_tools.lab_end(lab, "h0"), peer_tools.lab_end(lab, "h1")
    assert (server.netdev, server.address) == ("ens1f0np0", "198.18.0.11")
    peers = peer_tools.measure(client, server, seconds=1.0)
    assert 0.1 <= peers.tcp_lat * 1e6 <= 100_000, peers
    assert peers.tcp_bw > 0 and peers.iperf3 > 0, peers
    assert tools_in(server.netns) == []


def test_a_failing_client_still_ends_its_server(lab: Lab) -> None:
    client, server = peer_tools.lab_end(lab, "h0"), peer_tools.lab_end(lab, "h1")
    nobody = Host(server.netns, server.netdev, "198.18.0.99")  # on the rail, answered by no host
    with pytest.raises(peer_tools.PeerToolError, match=r"qperf client .*failed to connect"):
        peer_tools.qperf(client, nobody, 1.0, 8, 1 << 20)
    with pytest.raises(peer_tools.PeerToolError, match="iperf3 server ended"):
        peer_tools.iperf3(client, nobody, 1.0, 1 << 20)  # it cannot bind an address its host lacks
    assert tools_in(server.netns) == []


def test_a_missing_tool_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    end = Host("nowhere", "eth0", "198.18.0.1")
    with pytest.raises(peer_tools.PeerToolError, match=r"^qperf is not installed: [^\n]*$"):
        peer_tools.measure(end, end)
