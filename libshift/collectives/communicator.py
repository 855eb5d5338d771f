"""The Communicator: collectives over the ring, on numpy arrays (or tensors viewed as numpy arrays).

A call lays its arrays out in registered memory (a large array of all_reduce or broadcast is registered in
place; anything else is copied into the ring's work buffer), runs the plan of the collective through the
ring, and copies results back out where it copied.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from types import TracebackType

import numpy as np

from libshift.collectives import ops, plan
from libshift.collectives.device import pick_device
from libshift.collectives.errors import CollectiveError
from libshift.collectives.ops import ReduceOp
from libshift.collectives.pairs import Pairs
from libshift.collectives.peer import Done
from libshift.collectives.ring import CHUNK, Ring
from libshift.collectives.store import Store

# An all-reduce of at most this many bytes all-gathers the arrays and reduces them on every rank in rank
# order: a small array's time is the ring's steps, not its bytes (see docs/collectives.md)
SMALL_ALL_REDUCE = 64 << 10


class Communicator:
    """`Communicator(store, rank, world_size)`: every rank makes one, then all call the same collectives in
    the same order. `device` is the NIC (default: pick_device(), see device.py); store keys live
    under `prefix`; `timeout` bounds the wait for the ring to make any progress."""

    def __init__(
        self,
        store: Store,
        rank: int,
        world_size: int,
        device: str | None = None,
        *,
        prefix: str = "shift",
        timeout: float = 300.0,
    ) -> None:
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank!r}")
        self.rank, self.world_size = rank, world_size
        self._store, self._prefix, self._timeout = store, prefix, timeout
        self._ring: Ring | None = None
        self._pairs: Pairs | None = None  # point to point, made at its first use
        self._closed = False
        self._failed: CollectiveError | None = None  # an earlier failure: the ring's state is unknown
        if world_size > 1:
            self._ring = Ring(store, rank, world_size, device or pick_device(), prefix, timeout)

    @property
    def resilient(self) -> bool:
        """Whether the ring's QPs have backups on another NIC (a lone rank has no QPs to back up)."""
        return self._ring is not None and self._ring.resilient

    # -- the collectives -------------------------------------------------------------------------------

    def all_reduce(self, array: object, op: ReduceOp = ReduceOp.SUM) -> None:
        """array <- op over the ranks' arrays, in place and bit-identical on every rank."""
        a = ops.as_array(array, "array", writable=True)
        op = ops.check_op(op, a.dtype)
        ring = self._live()
        if ring is None or a.size == 0:
            return
        if a.nbytes <= SMALL_ALL_REDUCE:  # one all-gather of n-1 steps, not the ring's 2(n-1)
            rows = np.empty((self.world_size, *a.shape), a.dtype)
            self.all_gather(list(rows), a)
            ops.reduce_rows(op, rows, a)
            return
        item = a.itemsize
        segments = [(lo * item, (hi - lo) * item) for lo, hi in ops.segment_bounds(a.size, self.world_size)]
        steps = plan.all_reduce(segments, ring.position)
        self._run(ring, steps, segments[-1][1], [a], [a], a.dtype, op)

    def broadcast(self, array: object, root: int) -> None:
        """array <- the root's array, in place."""
        self._check_rank(root, "root")
        a = ops.as_array(array, "array", writable=self.rank != root)
        ring = self._live()
        if ring is None or a.size == 0:
            return
        steps = plan.broadcast((0, a.nbytes), ring.position, ring.order.index(root), self.world_size)
        self._run(ring, steps, a.nbytes, [a], [] if self.rank == root else [a], a.dtype, ReduceOp.SUM)

    def all_gather(self, outputs: Sequence[object], array: object) -> None:
        """outputs[r] <- rank r's array."""
        a = ops.as_array(array, "array", writable=False)
        outs = self._arrays_like(outputs, a, "outputs", writable=True)
        ring = self._live()
        if ring is None:
            np.copyto(outs[0], a)
            return
        segments = [(q * a.nbytes, a.nbytes) for q in range(self.world_size)]
        ins = [None] * self.world_size
        ins[self.rank] = a
        steps = plan.all_gather(ring.in_order(segments), ring.position)
        self._run(ring, steps, a.nbytes, ins, outs, a.dtype, ReduceOp.SUM)

    def reduce_scatter(self, output: object, inputs: Sequence[object], op: ReduceOp = ReduceOp.SUM) -> None:
        """output <- op over the ranks of their inputs[rank]."""
        out = ops.as_array(output, "output", writable=True)
        ins = self._arrays_like(inputs, out, "inputs", writable=False)
        op = ops.check_op(op, out.dtype)
        ring = self._live()
        if ring is None:
            np.copyto(out, ins[0])
            ops.finish(op, out, 1)
            return
        segments = [(q * out.nbytes, out.nbytes) for q in range(self.world_size)]
        outs: list[np.ndarray | None] = [None] * self.world_size
        outs[self.rank] = out
        steps = plan.reduce_scatter(ring.in_order(segments), ring.position)
        self._run(ring, steps, out.nbytes, ins, outs, out.dtype, op)

    def reduce(self, array: object, root: int, op: ReduceOp = ReduceOp.SUM) -> None:
        """The root's array <- op over the ranks' arrays; the other ranks' arrays stay as they were. An
        all-reduce (on a copy off the root): the ring has no cheaper path to one rank."""
        self._check_rank(root, "root")
        a = ops.as_array(array, "array", writable=self.rank == root)
        self.all_reduce(a if self.rank == root else a.copy(), op)

    def gather(self, outputs: Sequence[object] | None, array: object, root: int) -> None:
        """At the root, outputs[r] <- rank r's array (`outputs` is not used on the other ranks)."""
        self._check_rank(root, "root")
        a = ops.as_array(array, "array", writable=False)
        if self.rank != root:
            outputs = [np.empty_like(a) for _ in range(self.world_size)]
        self.all_gather(outputs, a)

    def scatter(self, output: object, inputs: Sequence[object] | None, root: int) -> None:
        """output <- the root's inputs[rank] (`inputs` is not used on the other ranks)."""
        self._check_rank(root, "root")
        out = ops.as_array(output, "output", writable=True)
        whole = np.empty((self.world_size, *out.shape), out.dtype)
        if self.rank == root:
            for q, a in enumerate(self._arrays_like(inputs, out, "inputs", writable=False)):
                whole[q] = a
        self.broadcast(whole, root)
        np.copyto(out, whole[self.rank])

    def all_to_all(self, outputs: Sequence[object], inputs: Sequence[object]) -> None:
        """outputs[q] <- rank q's inputs[rank]. The arrays' sizes may differ (each pair must agree); every
        rank's inputs, laid end to end and padded to the longest, go round as one all-gather."""
        n = self.world_size
        ins = self._per_rank(inputs, "inputs", writable=False)
        outs = self._per_rank(outputs, "outputs", writable=True)
        sizes = np.array([a.nbytes for a in ins] + [a.nbytes for a in outs], np.int64)
        table = [np.empty_like(sizes) for _ in range(n)]  # every rank's bytes sent to, received from each
        self.all_gather(table, sizes)
        for q, p in itertools.product(range(n), repeat=2):  # every rank finds the same mistake
            if table[q][p] != table[p][n + q]:
                sent, taken = table[q][p], table[p][n + q]
                raise ValueError(f"all_to_all: rank {q} sends {sent} bytes to rank {p}, which takes {taken}")
        block = np.zeros(max(int(row[:n].sum()) for row in table), np.uint8)
        np.concatenate([a.reshape(-1).view(np.uint8) for a in ins], out=block[: int(sizes[:n].sum())])
        blocks = [np.empty_like(block) for _ in range(n)]
        self.all_gather(blocks, block)
        for q, out in enumerate(outs):
            start = int(table[q][: self.rank].sum())
            np.copyto(out.reshape(-1).view(np.uint8), blocks[q][start : start + out.nbytes])

    def send(self, array: object, peer: int, tag: int, done: Done) -> None:
        """Send `array` to rank `peer`, where a recv with the same tag and size takes it; returns at once,
        `done(error or None)` is called (on another thread) when it has ended. Sends and receives between
        two ranks pair up in the order they were made (pairs.py)."""
        self._point_to_point(peer).send(ops.as_array(array, "array", writable=False), peer, tag, done)

    def recv(self, array: object, peer: int, tag: int, done: Done) -> None:
        """Receive into `array` what rank `peer` sends with the same tag; as `send`, returns at once."""
        self._point_to_point(peer).recv(ops.as_array(array, "array", writable=True), peer, tag, done)

    def _point_to_point(self, peer: int) -> Pairs:
        self._check_rank(peer, "peer")
        if peer == self.rank:
            raise ValueError(f"peer must be another rank than this one ({self.rank})")
        ring = self._live()
        assert ring is not None  # a world of one has no other rank
        if self._pairs is None:
            self._pairs = Pairs(ring.ctx, ring.pd, ring.alarm, self._store, self._prefix, self._timeout)
        return self._pairs

    def barrier(self) -> None:
        """Return once every rank has entered the barrier: one byte from each rank goes round the ring."""
        ring = self._live()
        if ring is not None:
            segments = [(q, 1) for q in range(self.world_size)]
            steps = plan.all_gather(ring.in_order(segments), ring.position)
            self._run(ring, steps, 1, [], [], np.dtype(np.uint8), ReduceOp.SUM, nbytes=self.world_size)

    # -- the mechanics -----------------------------------------------------------------------------------

    def _run(
        self,
        ring: Ring,
        steps: list[plan.Step],
        segment: int,
        inputs: Sequence[np.ndarray | None],
        outputs: Sequence[np.ndarray | None],
        dtype: np.dtype,
        op: ReduceOp,
        nbytes: int | None = None,
    ) -> None:
        """Run `steps` (segments of about `segment` bytes) on one array in place, or on the inputs laid end
        to end in the work buffer, the outputs copied back out of it."""
        chunks = plan.build(steps, plan.chunk_size(segment, CHUNK), direct=segment >= plan.DIRECT_MIN)
        try:
            self._lay_out_and_run(ring, chunks, inputs, outputs, dtype, op, nbytes)
        except CollectiveError as exc:
            self._failed = exc
            raise

    def _lay_out_and_run(
        self,
        ring: Ring,
        chunks: plan.Plan,
        inputs: Sequence[np.ndarray | None],
        outputs: Sequence[np.ndarray | None],
        dtype: np.dtype,
        op: ReduceOp,
        nbytes: int | None,
    ) -> None:
        if len(inputs) == 1 and inputs[0] is not None and all(o is inputs[0] for o in outputs):
            region = ring.buffers.in_place(inputs[0])
            if region is not None:
                ring.run(chunks, region, dtype, op)
                return
        size = max((a.nbytes for a in (*inputs, *outputs) if a is not None), default=0)
        region = ring.buffers.work(nbytes if nbytes is not None else size * max(len(inputs), len(outputs)))
        for q, a in enumerate(inputs):
            if a is not None:
                np.copyto(region.data[q * size : (q + 1) * size], a.reshape(-1).view(np.uint8))
        ring.run(chunks, region, dtype, op)
        for q, a in enumerate(outputs):
            if a is not None:
                np.copyto(a.reshape(-1).view(np.uint8), region.data[q * size : (q + 1) * size])

    def _arrays_like(
        self, arrays: Sequence[object] | None, like: np.ndarray, what: str, writable: bool
    ) -> list[np.ndarray]:
        """One array per rank, each of `like`'s shape and dtype."""
        found = self._per_rank(arrays, what, writable)
        for q, a in enumerate(found):
            if a.dtype != like.dtype:
                raise TypeError(f"{what}[{q}]: dtype {a.dtype} does not match {like.dtype}")
            if a.shape != like.shape:
                raise ValueError(f"{what}[{q}]: shape {a.shape} does not match {like.shape}")
        return found

    def _per_rank(self, arrays: Sequence[object] | None, what: str, writable: bool) -> list[np.ndarray]:
        """One array per rank."""
        if isinstance(arrays, (str, bytes)) or not isinstance(arrays, Sequence):
            raise TypeError(f"{what}: expected a list of {self.world_size} arrays")
        if len(arrays) != self.world_size:
            raise ValueError(f"{what}: expected {self.world_size} arrays (one per rank), got {len(arrays)}")
        return [ops.as_array(a, f"{what}[{q}]", writable) for q, a in enumerate(arrays)]

    def _check_rank(self, value: object, what: str) -> None:
        if not isinstance(value, int) or not 0 <= value < self.world_size:
            raise ValueError(f"{what} must be a rank in [0, {self.world_size}), got {value!r}")

    def _live(self) -> Ring | None:
        if self._closed:
            raise ValueError("the communicator is closed")
        if self._failed is not None:
            failed = self._failed  # of its kind: a lost path stays a lost path
            raise type(failed)(f"an earlier collective failed ({failed}); close this communicator")
        return self._ring

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._pairs is not None:
                self._pairs.close()
            if self._ring is not None:
                self._ring.close(farewell=self._failed is None)

    def __enter__(self) -> Communicator:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
