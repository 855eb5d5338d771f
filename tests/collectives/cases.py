"""The inputs of the collective tests and numpy's own results for them, shared by the test and the ranks.

Every rank's input is a pure function of (case, rank), so the test computes what each rank should end with
without asking the ranks; references combine the ranks in the ring's fixed order, so floating-point results
must match bit for bit.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace

import numpy as np

from libshift.collectives import ReduceOp
from libshift.collectives.communicator import SMALL_ALL_REDUCE
from libshift.collectives.ops import UFUNCS, finish, ring_order, segment_bounds

LATE = 0.3


@dataclass(frozen=True)
class Case:
    collective: str  # all_reduce, broadcast, all_gather, reduce_scatter, reduce, gather, scatter, all_to_all,
    # barrier
    dtype: str = "float32"
    count: int = 0  # elements of each rank's array
    op: str = "SUM"
    root: int = 0
    torch: bool = False  # hand the collective torch tensors (over the same memory) instead of arrays
    late: int = -1  # this rank comes to the call LATE s after the others (they go on without it meanwhile)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def reduce_op(self) -> ReduceOp:
        return ReduceOp[self.op]


def make_input(case: Case, index: int, rank: int, part: int = 0) -> np.ndarray:
    """Rank `rank`'s input (its `part`-th array for reduce_scatter) in case number `index`."""
    rng = np.random.default_rng([index, rank, part, 7])
    dtype = np.dtype(case.dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, case.count).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, case.count, dtype=dtype, endpoint=True)
    values = rng.standard_normal(case.count) * 10.0 ** rng.integers(-3, 4, case.count)
    if case.op == "PRODUCT":  # keep products of a few ranks finite and away from zero
        values = 1.0 + rng.standard_normal(case.count) / 8
    if dtype.kind == "c":
        values = values + 1j * rng.standard_normal(case.count)
    return values.astype(dtype)


def all_to_all_piece(case: Case, index: int, source: int, target: int) -> np.ndarray:
    """What rank `source` sends rank `target` in an all_to_all case: every pair a size of its own."""
    return make_input(replace(case, count=case.count + source + 2 * target), index, source, part=target)


def reduce_in_ring_order(op: ReduceOp, values: list[np.ndarray], segment: int) -> np.ndarray:
    """numpy's op over the ranks' values of one segment, combined in the ring's order."""
    ufunc = UFUNCS[op]
    ordered = [values[q] for q in ring_order(segment, len(values))]
    result = functools.reduce(lambda acc, x: ufunc(acc, x), ordered[1:], ordered[0].copy())
    finish(op, result, len(values))
    return result


def all_reduce(op: ReduceOp, inputs: list[np.ndarray]) -> np.ndarray:
    """The Communicator's all-reduce: a small array's combined in rank order, a larger one's in the ring's."""
    if 0 < inputs[0].nbytes <= SMALL_ALL_REDUCE:
        result = functools.reduce(lambda acc, x: UFUNCS[op](acc, x), inputs[1:], inputs[0].copy())
        finish(op, result, len(inputs))
        return result
    return ring_all_reduce(op, inputs)


def ring_all_reduce(op: ReduceOp, inputs: list[np.ndarray]) -> np.ndarray:
    """The ring schedule's all-reduce (plan.all_reduce), whatever the size."""
    count, world = inputs[0].size, len(inputs)
    pieces = [
        reduce_in_ring_order(op, [x[lo:hi] for x in inputs], j)
        for j, (lo, hi) in enumerate(segment_bounds(count, world))
    ]
    return np.concatenate(pieces) if pieces else inputs[0].copy()


def expected(case: Case, index: int, rank: int, world: int) -> list[np.ndarray]:
    """What rank `rank` holds after the case: its array (all_reduce, broadcast, reduce_scatter) or its
    list of outputs (all_gather); nothing for a barrier."""
    if case.collective == "all_reduce":
        return [all_reduce(case.reduce_op, [make_input(case, index, q) for q in range(world)])]
    if case.collective == "broadcast":
        return [make_input(case, index, case.root)]
    if case.collective == "all_gather":
        return [make_input(case, index, q) for q in range(world)]
    if case.collective == "reduce":
        if rank != case.root:  # the others' arrays stay as they were
            return [make_input(case, index, rank)]
        return [all_reduce(case.reduce_op, [make_input(case, index, q) for q in range(world)])]
    if case.collective == "gather":
        return [make_input(case, index, q) for q in range(world)] if rank == case.root else []
    if case.collective == "scatter":
        return [make_input(case, index, case.root, part=rank)]
    if case.collective == "all_to_all":
        return [all_to_all_piece(case, index, q, rank) for q in range(world)]
    if case.collective == "reduce_scatter":
        parts = [make_input(case, index, q, part=rank) for q in range(world)]
        return [reduce_in_ring_order(case.reduce_op, parts, rank)]
    return []
