"""An ordinary torch.distributed script on the "shift" backend, run by torchrun (tests/torch_backend).

It does not import libshift: `init_process_group(backend="shift")` must work through torch's backend
autoload alone. It prints JSON lines: {"rank", "device", "backend", "resilient"} once the group is up;
{"checks"}, each collective's outcome ("ok" or what was wrong); {"errors"}, the error of each unsupported
call and mistake; {"step"} after each DDP step and {"params"}, a SHA-256 of the parameters after training.
With --pause-at it trains the same way a second time ({"paused_params"}), rank 0 printing {"paused"} and
waiting for --resume-file after that step (the test fails a NIC meanwhile); with --gloo-reference, once more
over a gloo group ({"gloo_params"}).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

MISTAKES = {
    "all_reduce of a non-contiguous tensor": lambda: dist.all_reduce(torch.ones(4, 4).t()),
    "all_reduce of bfloat16": lambda: dist.all_reduce(torch.ones(4, dtype=torch.bfloat16)),
    "broadcast from a rank out of range": lambda: dist.broadcast(torch.ones(4), src=7),
}
UNSUPPORTED = {
    "send": lambda t: dist.send(t, dst=1 - dist.get_rank()),
    "gather": lambda t: dist.gather(
        t, [torch.zeros_like(t)] * dist.get_world_size() if dist.get_rank() == 0 else None, dst=0
    ),
    "all_to_all_single": lambda t: dist.all_to_all_single(torch.zeros_like(t), t),
    "reduce": lambda t: dist.reduce(t, dst=0),
}


def say(**fields: object) -> None:
    """One JSON line in one write: torchrun's ranks share stdout, and print() writes the text and its
    newline apart when unbuffered, so two ranks' lines could run into one."""
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def values(rank: int, dtype: torch.dtype) -> torch.Tensor:
    """This rank's input: different on every rank, and exact in every dtype used here."""
    return (torch.arange(1, 9) * (rank + 2) + rank).to(dtype)


def expected_reduce(op: dist.ReduceOp, dtype: torch.dtype, world: int) -> torch.Tensor:
    """What the reduction of every rank's values gives, combined here in rank order."""
    inputs = [values(r, dtype) for r in range(world)]
    combine: dict[object, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        dist.ReduceOp.SUM: torch.add,
        dist.ReduceOp.AVG: torch.add,
        dist.ReduceOp.PRODUCT: torch.mul,
        dist.ReduceOp.MIN: torch.minimum,
        dist.ReduceOp.MAX: torch.maximum,
        dist.ReduceOp.BAND: torch.bitwise_and,
        dist.ReduceOp.BOR: torch.bitwise_or,
        dist.ReduceOp.BXOR: torch.bitwise_xor,
    }
    result = inputs[0].clone()
    for other in inputs[1:]:
        result = combine[op](result, other)
    return result / world if op == dist.ReduceOp.AVG else result


def same(got: torch.Tensor, want: torch.Tensor) -> str:
    return (
        "ok"
        if got.dtype == want.dtype and torch.equal(got, want)
        else f"got {got.tolist()}, want {want.tolist()}"
    )


def check_collectives(rank: int, world: int) -> dict[str, str]:
    outcome: dict[str, str] = {}
    reductions = [
        (op, dtype)
        for op in ("SUM", "AVG", "PRODUCT", "MIN", "MAX")
        for dtype in (torch.float32, torch.float64)
    ]
    reductions += [(op, torch.int64) for op in ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")]
    reductions += [("SUM", torch.int32), ("BXOR", torch.uint8), ("MAX", torch.float16)]
    for name, dtype in reductions:
        op = getattr(dist.ReduceOp, name)
        tensor = values(rank, dtype)
        dist.all_reduce(tensor, op=op)
        outcome[f"all_reduce {name} {dtype}"] = same(tensor, expected_reduce(op, dtype, world))

    for root in range(world):
        for dtype in (torch.float32, torch.bfloat16, torch.bool):
            tensor = values(rank, dtype)
            dist.broadcast(tensor, src=root)
            outcome[f"broadcast from {root} {dtype}"] = same(tensor, values(root, dtype))

    gathered = [torch.empty(8, dtype=torch.bfloat16) for _ in range(world)]
    dist.all_gather(gathered, values(rank, torch.bfloat16))
    outcome["all_gather"] = same(
        torch.stack(gathered), torch.stack([values(r, torch.bfloat16) for r in range(world)])
    )
    flat = torch.empty(8 * world, dtype=torch.int64)
    dist.all_gather_single(flat, values(rank, torch.int64))
    outcome["all_gather_single"] = same(flat, torch.cat([values(r, torch.int64) for r in range(world)]))

    out = torch.empty(8 // world, dtype=torch.float64)
    dist.reduce_scatter_single(out, values(rank, torch.float64))
    want = expected_reduce(dist.ReduceOp.SUM, torch.float64, world).chunk(world)[rank]
    outcome["reduce_scatter_single"] = same(out, want)

    work = dist.all_reduce(values(rank, torch.float32), async_op=True)
    outcome["async all_reduce"] = "ok" if work.wait() and work.is_completed() else "wait() gave False"
    dist.barrier()
    outcome["barrier"] = "ok"

    return outcome


def check_errors(rank: int) -> dict[str, str]:
    """The error that each unsupported call and each mistake raises; the group must still work after."""
    tensor = values(rank, torch.float32)
    errors = {
        call: error_of(lambda refused=refused: refused(tensor)) for call, refused in UNSUPPORTED.items()
    }
    errors.update((mistake, error_of(run)) for mistake, run in MISTAKES.items())
    dist.barrier()
    return errors


def error_of(run: Callable[[], object]) -> str:
    try:
        run()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def train(rank: int, steps: int, group: dist.ProcessGroup | None = None, pause: Pause | None = None) -> str:
    """A few DDP steps of a small MLP; each rank its own data. Returns a digest of the final parameters."""
    torch.manual_seed(1234 + rank)  # different initial weights: DDP's broadcast from rank 0 must fix that
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 8)),
        process_group=group,
        bucket_cap_mb=0.05,  # several buckets, so allreduces overlap the backward pass
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(99 + rank)
    for step in range(steps):
        x = torch.randn(32, 64, generator=data)
        y = torch.randn(32, 8, generator=data)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        say(step=step, rank=rank)
        if pause and rank == 0 and step == pause.at:
            pause.wait()
    digest = hashlib.sha256()
    for parameter in model.module.parameters():
        digest.update(parameter.detach().numpy().tobytes())
    return digest.hexdigest()


class Pause:
    """Rank 0 stops after step `at` until `resume` exists, while rank 1 is already in the next all-reduce:
    the test fails a NIC in that gap, with the ring's receives posted."""

    def __init__(self, at: int, resume: Path) -> None:
        self.at, self.resume = at, resume

    def wait(self) -> None:
        say(paused=self.at)
        while not self.resume.exists():
            time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6, help="DDP steps of each training")
    parser.add_argument("--pause-at", type=int, help="train a second time, rank 0 pausing after this step")
    parser.add_argument("--resume-file", type=Path, help="the pause ends when this file exists")
    parser.add_argument("--gloo-reference", action="store_true", help="train once more over a gloo group")
    args = parser.parse_args()
    dist.init_process_group(backend="shift")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.distributed_c10d._get_default_group()
    local_rank = int(os.environ["LOCAL_RANK"])
    backend = dist.get_backend()
    say(rank=rank, local_rank=local_rank, device=group.device, backend=backend, resilient=group.resilient)
    say(checks=check_collectives(rank, world), rank=rank)
    say(errors=check_errors(rank), rank=rank)
    say(params=train(rank, args.steps), rank=rank)
    if args.pause_at is not None:
        say(paused_params=train(rank, args.steps, pause=Pause(args.pause_at, args.resume_file)), rank=rank)
    if args.gloo_reference:
        say(gloo_params=train(rank, args.steps, group=dist.new_group(backend="gloo")), rank=rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
