"""The order of the ranks round the ring: the hosts take turns, so that each link of the ring joins two hosts.

Two ranks of one host, each on its own NIC with the other's NIC as its backup, would join through both NICs
on either path (mine to yours, my backup to your backup): one NIC failure takes both paths, and the ring.
Two ranks of different hosts join through four NICs, two per path, so one failure leaves a path. So the ring
takes the first rank of every host in turn, then the second of every host, and so on; with one rank per
host that is the rank order. Only a host with more ranks than the others has neighbours of its own left.

Ranks find their hosts by their NICs: each names the GIDs of the devices its context opened (its own and its
backups), and ranks that share one are on one host.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def ring_ranks(nics: Sequence[Collection[str]]) -> list[int]:
    """The ranks in ring order, given each rank's GIDs (`nics[rank]`)."""
    hosts = _hosts(nics)
    members: dict[int, list[int]] = {}
    for rank, host in enumerate(hosts):
        members.setdefault(host, []).append(rank)
    turns = list(members.values())  # hosts in the order of their first rank, ranks in rank order
    deepest = max(len(ranks) for ranks in turns)
    return [ranks[slot] for slot in range(deepest) for ranks in turns if slot < len(ranks)]


def _hosts(nics: Sequence[Collection[str]]) -> list[int]:
    """For each rank, the lowest rank of its host: ranks are on one host when a chain of shared GIDs joins
    them."""
    host = list(range(len(nics)))

    def root(rank: int) -> int:
        while host[rank] != rank:
            rank = host[rank]
        return rank

    first: dict[str, int] = {}  # GID -> the first rank that named it
    for rank, gids in enumerate(nics):
        for gid in gids:
            other = first.setdefault(gid, rank)
            a, b = root(rank), root(other)
            host[max(a, b)] = min(a, b)
    return [root(rank) for rank in range(len(nics))]
