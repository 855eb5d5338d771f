"""Reduction operators, the order in which they combine the ranks' values, and the checks on user arrays.

The ring combines each segment of an array in one fixed order (`ring_order`), the same on every run and on
every rank, so that a result is bitwise reproducible and identical everywhere, floating point included.
"""

from __future__ import annotations

import enum
import itertools

import numpy as np

NUMERIC_KINDS = "biufc"  # bool, signed, unsigned, float, complex: what numpy's ufuncs reduce without objects


class ReduceOp(enum.Enum):
    """The reduction operators of torch.distributed, by the same names."""

    SUM = "sum"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"
    AVG = "avg"


UFUNCS: dict[ReduceOp, np.ufunc] = {
    ReduceOp.SUM: np.add,
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or,
    ReduceOp.BXOR: np.bitwise_xor,
    ReduceOp.AVG: np.add,  # then divided by the world size (finish)
}
BITWISE = {ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR}


def check_op(op: object, dtype: np.dtype) -> ReduceOp:
    """`op` if it can reduce arrays of `dtype`; TypeError (one line) for what it cannot."""
    if not isinstance(op, ReduceOp):
        raise TypeError(f"op must be a libshift.collectives.ReduceOp, got {op!r}")
    kind = dtype.kind
    if op in BITWISE and kind not in "biu":
        raise TypeError(f"{op.name} needs an integer or bool dtype, got {dtype}")
    if op == ReduceOp.AVG and kind not in "fc":
        raise TypeError(f"AVG needs a floating-point or complex dtype, got {dtype}")
    if op in (ReduceOp.MIN, ReduceOp.MAX) and kind == "c":
        raise TypeError(f"{op.name} is not defined for complex dtype {dtype}")
    return op


def combine(op: ReduceOp, incoming: np.ndarray, local: np.ndarray) -> None:
    """local <- op(incoming, local): the value that travelled the ring so far comes first."""
    UFUNCS[op](incoming, local, out=local)


def finish(op: ReduceOp, reduced: np.ndarray, world_size: int) -> None:
    """What follows the combination: AVG divides by the number of ranks."""
    if op == ReduceOp.AVG:
        np.divide(reduced, world_size, out=reduced)


def reduce_rows(op: ReduceOp, rows: np.ndarray, out: np.ndarray) -> None:
    """out <- op over rows[0], rows[1], ... combined in that order (every rank the same order), finished."""
    np.copyto(out, rows[0])
    for row in rows[1:]:
        UFUNCS[op](out, row, out=out)
    finish(op, out, len(rows))


def ring_order(segment: int, world_size: int) -> list[int]:
    """The ranks whose values make segment `segment`, in the order they are combined: the ring starts each
    segment on the rank after the one that ends up owning it, so segment j is
    op(...op(op(x[j+1], x[j+2]), x[j+3])..., x[j]) with ranks taken modulo the world size."""
    return [(segment + 1 + i) % world_size for i in range(world_size)]


def segment_bounds(count: int, world_size: int) -> list[tuple[int, int]]:
    """Split `count` elements into `world_size` contiguous segments as even as can be: (start, stop)."""
    cuts = [count * j // world_size for j in range(world_size + 1)]
    return list(itertools.pairwise(cuts))


def as_array(obj: object, what: str, writable: bool) -> np.ndarray:
    """The numpy array behind `obj` (a numpy array, or a tensor whose .numpy() shares its memory), checked
    for what the collectives need: C order, a numeric dtype, and (for results) writable memory."""
    if not isinstance(obj, np.ndarray):
        to_numpy = getattr(obj, "numpy", None)
        if not callable(to_numpy):
            raise TypeError(f"{what}: expected a numpy array or a CPU tensor, got {type(obj).__name__}")
        try:
            obj = to_numpy()
        except (RuntimeError, TypeError, ValueError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TypeError(f"{what}: cannot be viewed as a numpy array ({reason})") from None
        if not isinstance(obj, np.ndarray):
            raise TypeError(f"{what}: .numpy() returned {type(obj).__name__}, not a numpy array")
    if obj.dtype.kind not in NUMERIC_KINDS:
        raise TypeError(f"{what}: dtype {obj.dtype} is not supported (bool, integer, float or complex)")
    if not obj.flags.c_contiguous:
        raise ValueError(f"{what}: must be C-contiguous")
    if writable and not obj.flags.writeable:
        raise ValueError(f"{what}: is read-only, but the result is written into it")
    return obj
