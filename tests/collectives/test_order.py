"""The ring's order (libshift.collectives.order): hosts take turns, each found by the GIDs its ranks share."""

from __future__ import annotations

from libshift.collectives.order import ring_ranks

# two NICs per host: a rank names its own NIC's GID and its backup's
H0 = ["::ffff:198.18.0.10", "::ffff:198.18.1.10"]
H1 = ["::ffff:198.18.0.11", "::ffff:198.18.1.11"]
H2 = ["::ffff:198.18.0.12", "::ffff:198.18.1.12"]


def neighbours_on_one_host(order: list[int], host_of: list[int]) -> int:
    return sum(host_of[a] == host_of[b] for a, b in zip(order, order[1:] + order[:1], strict=True))


def test_one_rank_per_host_keeps_the_rank_order():
    assert ring_ranks([H0, H1, H2]) == [0, 1, 2]


def test_two_ranks_per_host_alternate_between_the_hosts():
    order = ring_ranks([H0, H0, H1, H1])  # torchrun --nproc-per-node 2 on two hosts
    assert order == [0, 2, 1, 3]
    assert neighbours_on_one_host(order, [0, 0, 1, 1]) == 0


def test_many_ranks_per_host_never_neighbour_their_own_host():
    host_of = [r // 4 for r in range(12)]  # three hosts of four ranks
    order = ring_ranks([[H0, H1, H2][h] for h in host_of])
    assert sorted(order) == list(range(12))
    assert neighbours_on_one_host(order, host_of) == 0


def test_a_shared_gid_anywhere_in_a_chain_joins_ranks_into_one_host():
    # four NICs, each rank opening its own and the next: 0-1, 1-2, 2-3 share a NIC pairwise, so one host
    nics = [["a", "b"], ["c", "d"], ["b", "c"], ["x", "y"]]
    assert ring_ranks(nics) == [0, 3, 1, 2]  # the host of ranks 0, 1, 2 and the host of rank 3 take turns


def test_a_host_with_more_ranks_than_the_others_ends_next_to_itself():
    host_of = [0, 0, 0, 1]
    order = ring_ranks([[H0, H1][h] for h in host_of])
    assert order == [0, 3, 1, 2]
    assert neighbours_on_one_host(order, host_of) == 2  # 1-2 and 2-0: one rank of h1 parts only one pair
