"""The ring schedules without a fabric: every rank's plan run against its neighbours' in one process.

The simulation moves chunks the way the ring transport does (in order on each link, a send only after the
chunk it forwards has been applied, at most SLOTS chunks unapplied per link) and applies them with the same
ops, so the schedules, the chunking and the fixed reduction order are checked for many world sizes and
sizes in milliseconds; the lab tests then check the transport.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from cases import Case, expected, make_input, ring_all_reduce

from libshift.collectives import ReduceOp, ops, plan
from libshift.collectives.plan import Apply, Plan

SLOTS = 4


def simulate(plans: list[Plan], data: list[np.ndarray], dtype: np.dtype, op: ReduceOp) -> None:
    """Run every rank's plan on its bytes in `data`; fails on a size mismatch or a stuck ring."""
    n = len(plans)
    links: list[deque[bytes]] = [deque() for _ in range(n)]  # links[r]: chunks from rank r to r+1
    posted, applied = [0] * n, [0] * n
    while any(applied[r] < len(p.recvs) or posted[r] < len(p.sends) for r, p in enumerate(plans)):
        moved = False
        for r, p in enumerate(plans):
            while (
                posted[r] < len(p.sends) and p.sends[posted[r]].after < applied[r] and len(links[r]) < SLOTS
            ):
                send = p.sends[posted[r]]
                links[r].append(data[r][send.offset : send.offset + send.nbytes].tobytes())
                posted[r] += 1
                moved = True
            inbox = links[(r - 1) % n]
            if applied[r] < len(p.recvs) and inbox:
                recv = p.recvs[applied[r]]
                incoming = np.frombuffer(inbox.popleft(), np.uint8)
                assert len(incoming) == recv.nbytes, f"rank {r}: chunk {applied[r]} has the wrong size"
                target = data[r][recv.offset : recv.offset + recv.nbytes]
                if recv.apply == Apply.COPY:
                    target[:] = incoming
                else:
                    ops.combine(op, incoming.view(dtype), target.view(dtype))
                    if recv.apply == Apply.FINAL:
                        ops.finish(op, target.view(dtype), n)
                applied[r] += 1
                moved = True
        assert moved, "the ring is stuck"
    assert not any(links), "chunks were sent that nobody received"


def as_bytes(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([a.view(np.uint8) for a in arrays]) if arrays else np.zeros(0, np.uint8)


CHUNK = plan.MIN_CHUNK


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize(
    ("dtype", "count", "op"),
    [
        ("float32", 0, "SUM"),
        ("float32", 3, "SUM"),
        ("float64", 100_003, "SUM"),
        ("float32", 77_777, "AVG"),
        ("float16", 40_001, "PRODUCT"),
        ("int64", 30_000, "MAX"),
        ("uint8", 200_001, "BXOR"),
        ("bool", 1_001, "BOR"),
    ],
)
def test_all_reduce_schedule(world: int, dtype: str, count: int, op: str) -> None:
    case = Case("all_reduce", dtype, count, op)
    inputs = [make_input(case, 3, r) for r in range(world)]
    item = np.dtype(dtype).itemsize
    segments = [(lo * item, (hi - lo) * item) for lo, hi in ops.segment_bounds(count, world)]
    plans = [plan.build(plan.all_reduce(segments, r), CHUNK) for r in range(world)]
    data = [x.view(np.uint8).copy() for x in inputs]
    simulate(plans, data, np.dtype(dtype), case.reduce_op)
    want = ring_all_reduce(case.reduce_op, inputs)
    for r in range(world):
        assert data[r].tobytes() == want.tobytes(), f"rank {r} differs from numpy's result"


@pytest.mark.parametrize("world", [2, 3, 4])
def test_reduce_scatter_and_all_gather_schedules(world: int) -> None:
    rs, ag = Case("reduce_scatter", "float32", 50_001, "SUM"), Case("all_gather", "int16", 50_001)
    nbytes = {c.collective: 50_001 * np.dtype(c.dtype).itemsize for c in (rs, ag)}
    segs = {k: [(q * v, v) for q in range(world)] for k, v in nbytes.items()}
    rs_data = [as_bytes([make_input(rs, 1, r, part=q) for q in range(world)]) for r in range(world)]
    rs_plans = [plan.build(plan.reduce_scatter(segs["reduce_scatter"], r), CHUNK) for r in range(world)]
    simulate(rs_plans, rs_data, np.dtype("float32"), ReduceOp.SUM)
    ag_data = [np.zeros(world * nbytes["all_gather"], np.uint8) for _ in range(world)]
    for r in range(world):
        ag_data[r][r * nbytes["all_gather"] : (r + 1) * nbytes["all_gather"]] = make_input(ag, 2, r).view(
            np.uint8
        )
    ag_plans = [plan.build(plan.all_gather(segs["all_gather"], r), CHUNK) for r in range(world)]
    simulate(ag_plans, ag_data, np.dtype("int16"), ReduceOp.SUM)
    for r in range(world):
        (mine,) = expected(rs, 1, r, world)
        size = nbytes["reduce_scatter"]
        assert rs_data[r][r * size : (r + 1) * size].tobytes() == mine.tobytes()
        assert ag_data[r].tobytes() == as_bytes(expected(ag, 2, r, world)).tobytes()


@pytest.mark.parametrize(("world", "root"), [(2, 0), (2, 1), (4, 2), (5, 4)])
def test_broadcast_schedule(world: int, root: int) -> None:
    nbytes = 1_000_001
    data = [np.full(nbytes, r, np.uint8) for r in range(world)]
    plans = [plan.build(plan.broadcast((0, nbytes), r, root, world), CHUNK) for r in range(world)]
    simulate(plans, data, np.dtype(np.uint8), ReduceOp.SUM)
    assert all((d == root).all() for d in data)


def test_a_forwarded_chunk_waits_for_exactly_its_own_arrival() -> None:
    steps = plan.broadcast((0, 5 * CHUNK), position=1, root=0, world_size=3)
    built = plan.build(steps, CHUNK)
    assert [s.after for s in built.sends] == [0, 1, 2, 3, 4]
    assert [(r.offset, r.nbytes) for r in built.recvs] == [(s.offset, s.nbytes) for s in built.sends]


def test_chunk_size_follows_the_segment_within_bounds() -> None:
    assert plan.chunk_size(1, 4 << 20) == plan.MIN_CHUNK
    assert plan.chunk_size(8 << 20, 4 << 20) == 2 << 20
    assert plan.chunk_size(1 << 30, 4 << 20) == 4 << 20
    assert plan.chunk_size(3 * plan.MIN_CHUNK * plan.PIECES + 1, 1 << 30) % plan.ALIGN == 0


def test_ring_order_starts_after_the_owner_and_ends_with_it() -> None:
    assert ops.ring_order(0, 3) == [1, 2, 0]
    assert ops.ring_order(2, 3) == [0, 1, 2]
    assert ops.ring_order(0, 1) == [0]


@pytest.mark.parametrize("world", [2, 3, 5])
def test_every_rank_sends_what_its_right_neighbour_receives_and_how_it_is_applied(world: int) -> None:
    """The ring writes a COPY chunk straight into the receiver's memory only if the sender knows, from its
    own plan, that the receiver copies it: every send list must equal the right neighbour's receive list,
    in ranges and in what is done with each chunk."""
    segments = [(q * 300_000, 300_000) for q in range(world)]
    schedules = {
        "all_reduce": lambda r: plan.all_reduce(segments, r),
        "reduce_scatter": lambda r: plan.reduce_scatter(segments, r),
        "all_gather": lambda r: plan.all_gather(segments, r),
        "broadcast": lambda r: plan.broadcast((0, 1_000_000), r, world - 1, world),
    }
    for name, steps in schedules.items():
        plans = [plan.build(steps(r), plan.ALIGN * 16) for r in range(world)]
        for r, mine in enumerate(plans):
            theirs = plans[(r + 1) % world].recvs
            sent = [(s.offset, s.nbytes, s.apply) for s in mine.sends]
            assert sent == [(c.offset, c.nbytes, c.apply) for c in theirs], f"{name}: rank {r}"
