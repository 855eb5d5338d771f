"""ShiftProcessGroup: torch.distributed's collectives, carried out by a libshift.collectives Communicator.

Tensors are handed to the communicator as numpy views of their own memory, so results land in place. Calls
that only move bytes (broadcast, all_gather) view the tensor as bytes, so every dtype travels, bfloat16
included; reductions need a dtype numpy can compute with. Calls without a mapping raise NotImplementedError
naming the call, never a silent fallback.
"""

from __future__ import annotations

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
        "barrier",
    )
)
# torch's operators by name (PREMUL_SUM, a scaled sum torch builds for FSDP, has no counterpart)
REDUCE_OPS = {getattr(dist.ReduceOp, op.name): op for op in ReduceOp}
# ProcessGroup methods without a mapping, and the torch.distributed call a user made to reach each
UNSUPPORTED = {
    "send": "send",
    "recv": "recv",
    "recv_anysource": "recv",
    "gather": "gather",
    "scatter": "scatter",
    "reduce": "reduce",
    "alltoall": "all_to_all",
    "all_to_all_single": "all_to_all_single",
    "allgather_coalesced": "all_gather_coalesced",
    "all_gather_single_coalesced": "all_gather_single (coalesced)",
    "reduce_scatter_single_coalesced": "reduce_scatter_single (coalesced)",
}


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

    @property
    def resilient(self) -> bool:
        """Whether the ring's QPs have backups on another NIC (shiftd reachable, a second NIC here)."""
        return self._comm.resilient

    def getBackendName(self) -> str:
        return BACKEND

    def __repr__(self) -> str:
        return f"ShiftProcessGroup(rank={self.rank()}, size={self.size()}, device={self.device!r})"

    def allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions | None = None) -> ShiftWork:
        op = reduce_op(opts, "all_reduce")
        arrays = [numbers(t, "all_reduce") for t in tensors]

        def run() -> None:
            for array in arrays:
                self._comm.all_reduce(array, op)

        return self._runner.submit("all_reduce", tensors, run)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: object = None) -> ShiftWork:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions | None = None) -> ShiftWork:
        root = (opts or dist.BroadcastOptions()).rootRank
        arrays = [raw(t, "broadcast") for t in tensors]

        def run() -> None:
            for array in arrays:
                self._comm.broadcast(array, root)

        return self._runner.submit("broadcast", tensors, run)

    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: object = None
    ) -> ShiftWork:
        one_each(inputs, outputs, "all_gather")
        out = [raw(t, "all_gather") for t in outputs[0]]
        array = raw(inputs[0], "all_gather")
        return self._runner.submit("all_gather", outputs, lambda: self._comm.all_gather(out, array))

    def all_gather_single(self, output: torch.Tensor, tensor: torch.Tensor, opts: object = None) -> ShiftWork:
        out = self._rows(raw(output, "all_gather_single"), "all_gather_single")
        array = raw(tensor, "all_gather_single")
        return self._runner.submit("all_gather_single", [output], lambda: self._comm.all_gather(out, array))

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
        return self._runner.submit("reduce_scatter", outputs, lambda: self._comm.reduce_scatter(out, ins, op))

    def reduce_scatter_single(
        self, output: torch.Tensor, tensor: torch.Tensor, opts: dist.ReduceScatterOptions | None = None
    ) -> ShiftWork:
        op = reduce_op(opts, "reduce_scatter_single")
        out = numbers(output, "reduce_scatter_single")
        ins = self._rows(numbers(tensor, "reduce_scatter_single"), "reduce_scatter_single")
        return self._runner.submit(
            "reduce_scatter_single", [output], lambda: self._comm.reduce_scatter(out, ins, op)
        )

    def barrier(self, opts: object = None) -> ShiftWork:
        return self._runner.submit("barrier", None, self._comm.barrier)

    def _rows(self, flat: np.ndarray, call: str) -> list[np.ndarray]:
        """A tensor holding one equal part per rank, as the list of those parts (views)."""
        if flat.size % self.size():
            raise ValueError(f"{call}: {flat.size} elements cannot be cut into {self.size()} equal parts")
        return list(flat.reshape(self.size(), -1))

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


def reduce_op(opts: dist.AllreduceOptions | dist.ReduceScatterOptions | None, call: str) -> ReduceOp:
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
