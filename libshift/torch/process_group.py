"""ShiftProcessGroup: torch.distributed's collectives, carried out by a libshift.collectives Communicator.

Tensors are handed to the communicator as numpy views of their own memory, so results land in place. Calls
that only move bytes (broadcast, all_gather) view the tensor as bytes, so every dtype travels, bfloat16
included; reductions need a dtype numpy can compute with. Calls without a mapping raise NotImplementedError
naming the call, never a silent fallback.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from libshift.collectives import Communicator, ReduceOp, pick_device
from libshift.torch import BACKEND
from libshift.torch.work import SerialRunner, ShiftWork

SUPPORTED = ", ".join(
    (
        "all_reduce",
        "broadcast",
        "all_gather",
        "all_gather_single (all_gather_into_tensor)",
        "reduce_scatter",
        "reduce_scatter_single (reduce_scatter_tensor)",
        "their coalesced forms",
        "reduce",
        "gather",
        "scatter",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "send",
        "recv (from a named rank)",
    )
)
INLINE_BYTES = 64 << 10  # a call on this many bytes at most may run on the caller's thread (work.py)
# torch's operators by name (PREMUL_SUM, a scaled sum torch builds for FSDP, has no counterpart)
REDUCE_OPS = {getattr(dist.ReduceOp, op.name): op for op in ReduceOp}
# ProcessGroup methods without a mapping, and the torch.distributed call a user made to reach each
UNSUPPORTED = {"recv_anysource": "recv without a source rank"}


def unsupported(call: str) -> NotImplementedError:
    return NotImplementedError(f"the {BACKEND} backend does not support {call} (it supports {SUPPORTED})")


class ShiftProcessGroup(dist.ProcessGroup):
    """One torch process group: a ring of QPs on this rank's NIC (pick_device), failover beneath it."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> None:
        super().__init__(rank, world_size)
        self.device = pick_device()
        # torchrun keeps its store when it restarts the workers (--max-restarts): an attempt's keys (the
        # ring's endpoints, its alarm) must not be read by the next attempt's ranks
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        seconds = timeout.total_seconds()
        self._comm = Communicator(
            store, rank, world_size, self.device, prefix=f"shift/{attempt}", timeout=seconds
        )
        self._runner = SerialRunner(f"shift-pg-r{rank}")
        self._group_name = ""  # until torch names the group

    @property
    def resilient(self) -> bool:
        """Whether the ring's QPs have backups on another NIC (shiftd reachable, a second NIC here)."""
        return self._comm.resilient

    def getBackendName(self) -> str:
        return BACKEND

    # torch names each group (DeviceMesh, and so FSDP2, asks for the name); a ProcessGroup keeps its name in
    # its C++ backends, which a group written in Python has none of, so the name is kept here
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    def __repr__(self) -> str:
        return f"ShiftProcessGroup(rank={self.rank()}, size={self.size()}, device={self.device!r})"

    def allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions | None = None) -> ShiftWork:
        op = reduce_op(opts, "all_reduce")
        calls = [(numbers(t, "all_reduce"), op) for t in tensors]
        return self._submit("all_reduce", tensors, lambda: self._each(self._comm.all_reduce, calls))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: object = None) -> ShiftWork:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions | None = None) -> ShiftWork:
        root = (opts or dist.BroadcastOptions()).rootRank
        calls = [(raw(t, "broadcast"), root) for t in tensors]
        return self._submit("broadcast", tensors, lambda: self._each(self._comm.broadcast, calls))

    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: object = None
    ) -> ShiftWork:
        one_each(inputs, outputs, "all_gather")
        return self.allgather_coalesced(outputs, inputs, call="all_gather")

    def allgather_coalesced(
        self,
        outputs: list[list[torch.Tensor]],
        inputs: list[torch.Tensor],
        opts: object = None,
        call: str = "all_gather_coalesced",
    ) -> ShiftWork:
        pairs = [([raw(t, call) for t in out], raw(t, call)) for out, t in paired(outputs, inputs, call)]
        return self._submit(call, outputs, lambda: self._each(self._comm.all_gather, pairs))

    def all_gather_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: object = None) -> ShiftWork:
        return self.all_gather_single_coalesced([output], [tensor], call="all_gather_single")

    def all_gather_single_coalesced(
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        opts: object = None,
        call: str = "all_gather_single_coalesced",
    ) -> ShiftWork:
        pairs = [(self._rows(raw(o, call), call), raw(t, call)) for o, t in paired(outputs, inputs, call)]
        return self._submit(call, outputs, lambda: self._each(self._comm.all_gather, pairs))

    def reduce_scatter(
        self,
        outputs: list[torch.Tensor],
        inputs: list[list[torch.Tensor]],
        opts: dist.ReduceScatterOptions | None = None,
    ) -> ShiftWork:
        one_each(outputs, inputs, "reduce_scatter")
        op = reduce_op(opts, "reduce_scatter")
        out = numbers(outputs[0], "reduce_scatter")
        ins = [numbers(t, "reduce_scatter") for t in inputs[0]]
        return self._submit("reduce_scatter", outputs, lambda: self._comm.reduce_scatter(out, ins, op))

    def reduce_scatter_single(
        self, output: torch.Tensor, tensor: torch.Tensor, opts: dist.ReduceScatterOptions | None = None
    ) -> ShiftWork:
        return self.reduce_scatter_single_coalesced([output], [tensor], opts, call="reduce_scatter_single")

    def reduce_scatter_single_coalesced(
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        opts: dist.ReduceScatterOptions | None = None,
        call: str = "reduce_scatter_single_coalesced",
    ) -> ShiftWork:
        op = reduce_op(opts, call)
        pairs = paired(outputs, inputs, call)
        calls = [(numbers(o, call), self._rows(numbers(t, call), call), op) for o, t in pairs]
        return self._submit(call, outputs, lambda: self._each(self._comm.reduce_scatter, calls))

    def reduce(self, tensors: list[torch.Tensor], opts: dist.ReduceOptions | None = None) -> ShiftWork:
        root = (opts or dist.ReduceOptions()).rootRank
        op = reduce_op(opts, "reduce")
        calls = [(numbers(t, "reduce"), root, op) for t in tensors]
        return self._submit("reduce", tensors, lambda: self._each(self._comm.reduce, calls))

    def gather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: dist.GatherOptions
    ) -> ShiftWork:
        root = opts.rootRank
        out = self._roots_list(inputs, outputs, root, "gather")
        array = raw(inputs[0], "gather")
        return self._submit("gather", outputs, lambda: self._comm.gather(out, array, root))

    def scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: dist.ScatterOptions
    ) -> ShiftWork:
        root = opts.rootRank
        ins = self._roots_list(outputs, inputs, root, "scatter")
        out = raw(outputs[0], "scatter")
        return self._submit("scatter", outputs, lambda: self._comm.scatter(out, ins, root))

    def alltoall(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: object = None
    ) -> ShiftWork:
        outs = [raw(t, "all_to_all") for t in outputs]
        ins = [raw(t, "all_to_all") for t in inputs]
        return self._submit("all_to_all", outputs, lambda: self._comm.all_to_all(outs, ins))

    def all_to_all_single(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: object = None,
    ) -> ShiftWork:
        call = "all_to_all_single"
        outs = self._splits(output, output_split_sizes, call)
        ins = self._splits(tensor, input_split_sizes, call)
        return self._submit(call, [output], lambda: self._comm.all_to_all(outs, ins))

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> ShiftWork:
        return self._point_to_point("send", self._comm.send, tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> ShiftWork:
        return self._point_to_point("recv", self._comm.recv, tensors, src, tag)

    @staticmethod
    def _point_to_point(
        call: str, start: Callable[..., None], tensors: list[torch.Tensor], peer: int, tag: int
    ) -> ShiftWork:
        """A send or recv: started at once, beside the collectives (pairs.py); the transfer ends its Work."""
        if len(tensors) != 1:
            raise ValueError(f"{call}: the {BACKEND} backend takes one tensor (list) per process")
        work = ShiftWork(call, tensors)
        start(raw(tensors[0], call), peer, tag, work.finish)
        return work

    def barrier(self, opts: object = None) -> ShiftWork:
        return self._submit("barrier", None, self._comm.barrier)

    def _submit(self, call: str, result: object, run: Callable[[], None]) -> ShiftWork:
        """Hand `run` to the runner; one whose tensors (`result`) hold at most INLINE_BYTES may run at once on
        this thread (SerialRunner.submit)."""
        return self._runner.submit(call, result, run, inline=nbytes(result) <= INLINE_BYTES)

    @staticmethod
    def _each(collective: Callable[..., None], calls: list[tuple]) -> None:
        for args in calls:
            collective(*args)

    def _roots_list(
        self, single: list[torch.Tensor], lists: list[list[torch.Tensor]], root: int, call: str
    ) -> list[np.ndarray] | None:
        """gather's outputs or scatter's inputs: the root's one list, as byte views; None on other ranks,
        whose lists torch leaves empty."""
        at_root = self.rank() == root
        one_each(single, lists if at_root else [[]], call)
        return [raw(t, call) for t in lists[0]] if at_root else None

    def _rows(self, flat: np.ndarray, call: str) -> list[np.ndarray]:
        """A tensor holding one equal part per rank, as the list of those parts (views)."""
        if flat.size % self.size():
            raise ValueError(f"{call}: {flat.size} elements cannot be cut into {self.size()} equal parts")
        return list(flat.reshape(self.size(), -1))

    def _splits(self, tensor: torch.Tensor, rows: list[int], call: str) -> list[np.ndarray]:
        """A tensor cut along its first dimension into one part per rank (byte views): `rows` of it each, or
        equal parts when `rows` is empty."""
        flat = raw(tensor, call)
        first = tensor.shape[0] if tensor.dim() else 1
        if not rows:
            if first % self.size():
                raise ValueError(f"{call}: {first} rows cannot be cut into {self.size()} equal parts")
            rows = [first // self.size()] * self.size()
        if len(rows) != self.size() or sum(rows) != first or min(rows) < 0:
            parts = self.size()
            raise ValueError(f"{call}: split sizes {list(rows)} do not cut {first} rows into {parts} parts")
        row = flat.size // first if first else 0
        cuts = np.cumsum([0, *rows]) * row
        return [flat[lo:hi] for lo, hi in itertools.pairwise(cuts)]

    def shutdown(self) -> None:
        """destroy_process_group(): finish what is queued, then take the ring down."""
        self._runner.close()
        self._comm.close()


def _refuse(method: str, call: str) -> Callable[..., ShiftWork]:
    def refuse(self: ShiftProcessGroup, *args: object, **kwargs: object) -> ShiftWork:
        raise unsupported(call)

    refuse.__name__ = method
    return refuse


for _method, _call in UNSUPPORTED.items():
    setattr(ShiftProcessGroup, _method, _refuse(_method, _call))


def reduce_op(
    opts: dist.AllreduceOptions | dist.ReduceScatterOptions | dist.ReduceOptions | None, call: str
) -> ReduceOp:
    """The collectives' operator for the one in torch's options (SUM when there are none)."""
    op = dist.ReduceOp.SUM if opts is None else opts.reduceOp.op
    try:
        return REDUCE_OPS[op]
    except KeyError:
        known = ", ".join(member.name for member in ReduceOp)
        raise NotImplementedError(
            f"the {BACKEND} backend does not support {call} with {op.name} (it supports {known})"
        ) from None


def one_each(single: Sequence[object], nested: Sequence[Sequence[object]], call: str) -> None:
    """torch's list-of-lists forms carry one tensor per process here (no multi-device ranks)."""
    if len(single) != 1 or len(nested) != 1:
        raise ValueError(f"{call}: the {BACKEND} backend takes one tensor (list) per process")


def nbytes(tensors: object) -> int:
    """The bytes of a tensor, or of the tensors in (nested) lists of them."""
    if isinstance(tensors, torch.Tensor):
        return tensors.nbytes
    if isinstance(tensors, (list, tuple)):
        return sum(nbytes(t) for t in tensors)
    return 0


def paired(outputs: Sequence[object], inputs: Sequence[object], call: str) -> list[tuple]:
    """A coalesced call's outputs and inputs, one of each per collective."""
    if len(outputs) != len(inputs):
        raise ValueError(f"{call}: {len(outputs)} outputs for {len(inputs)} inputs")
    return list(zip(outputs, inputs, strict=True))


def tensor_memory(tensor: torch.Tensor, call: str) -> torch.Tensor:
    """The tensor's own memory, detached from autograd: CPU and contiguous, or a one-line error."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{call}: expected a tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"{call}: the {BACKEND} backend takes CPU tensors, got one on {tensor.device}")
    if not tensor.is_contiguous():
        raise ValueError(f"{call}: the tensor must be contiguous (call .contiguous() first)")
    return tensor.detach().reshape(-1)


def numbers(tensor: torch.Tensor, call: str) -> np.ndarray:
    """A numpy view to compute with (a dtype numpy lacks, such as bfloat16, is a one-line TypeError)."""
    flat = tensor_memory(tensor, call)
    try:
        return flat.numpy()
    except TypeError:
        raise TypeError(f"{call}: the {BACKEND} backend cannot reduce {tensor.dtype} tensors") from None


def raw(tensor: torch.Tensor, call: str) -> np.ndarray:
    """A byte view: what only moves, moves in any dtype."""
    return tensor_memory(tensor, call).view(torch.uint8).numpy()
