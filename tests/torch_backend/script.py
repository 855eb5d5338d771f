"""An ordinary torch.distributed script on the "shift" backend, run by torchrun (tests/torch_backend).

It does not import libshift: `init_process_group(backend="shift")` must work through torch's backend
autoload alone. It prints JSON lines: {"rank", "device", "backend", "resilient"} once the group is up;
{"checks"}, each collective's outcome ("ok" or what was wrong; the calls beyond the ring's own, DDP with
no_sync and a second shift group against a gloo group's results); {"errors"}, the error of each unsupported
call and mistake; {"step"} after each DDP step and {"params"}, a SHA-256 of the parameters after training.
With --pause-at it trains the same way a second time ({"paused_params"}), rank 0 printing {"paused"} and
waiting for --resume-file after that step (the test fails a NIC meanwhile); with --gloo-reference, once more
over a gloo group ({"as_gloo"}: "ok", or how the parameters differ; see like_gloo).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable
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
    "recv without a source": lambda t: dist.recv(t),
    "monitored_barrier": lambda t: dist.monitored_barrier(),
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


def like_gloo(got: torch.Tensor, want: torch.Tensor, world: int) -> str:
    """Parameters trained over shift against those trained over gloo: the same bits with two ranks (a sum of
    two adds the same either way round); with more, gloo adds the ranks' gradients in another order than
    shift's ring, so equal to float32's rounding."""
    if torch.equal(got, want) or (world > 2 and torch.allclose(got, want, rtol=1e-5, atol=1e-7)):
        return "ok"
    return f"differ by up to {(got - want).abs().max().item():.3g}"


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


def against_gloo(rank: int, world: int) -> dict[str, str]:
    """The calls beyond the ring's own, each on the shift group and on a gloo group with the same inputs:
    the results must be the same bits. Also a second shift group (new_group) and DDP with no_sync."""
    gloo = dist.new_group(backend="gloo")
    second = dist.new_group()  # a second shift group: its own ring beside the default one
    peers = list(range(world))

    def reduce(group: object) -> list[torch.Tensor]:
        t = values(rank, torch.float64)
        dist.reduce(t, dst=world - 1, op=dist.ReduceOp.MAX, group=group)
        return [t] if rank == world - 1 else []  # elsewhere gloo leaves partial results

    def gather(group: object) -> list[torch.Tensor]:
        out = [torch.zeros(8, dtype=torch.int32) for _ in peers] if rank == 0 else None
        dist.gather(values(rank, torch.int32), out, dst=0, group=group)
        return out or []

    def scatter(group: object) -> list[torch.Tensor]:
        out = torch.zeros(8, dtype=torch.bfloat16)
        parts = [values(q, torch.bfloat16) * 3 for q in peers] if rank == world - 1 else None
        dist.scatter(out, parts, src=world - 1, group=group)
        return [out]

    def all_to_all(group: object) -> list[torch.Tensor]:
        outs = [torch.zeros(3) for _ in peers]  # gloo's all_to_all takes tensors of one size only
        dist.all_to_all(outs, [values(rank, torch.float32)[q : q + 3] for q in peers], group=group)
        return outs

    def all_to_all_single(group: object) -> list[torch.Tensor]:
        out = torch.zeros(2 * world, 3, dtype=torch.int64)
        dist.all_to_all_single(out, torch.arange(6 * world).reshape(2 * world, 3) * (rank + 1), group=group)
        return [out]

    def all_to_all_uneven(group: object) -> list[torch.Tensor]:
        sent = [rank + q + 1 for q in peers]  # rows this rank sends rank q
        taken = [q + rank + 1 for q in peers]
        out = torch.zeros(sum(taken), 2)
        rows = torch.arange(2 * sum(sent), dtype=torch.float32).reshape(-1, 2) + 100 * rank
        dist.all_to_all_single(out, rows, output_split_sizes=taken, input_split_sizes=sent, group=group)
        return [out]

    def point_to_point(group: object) -> list[torch.Tensor]:
        """Each rank's isend to the next and irecv from the one before, both posted before either is waited
        for; then a pipeline's blocking send of 1 MiB from rank 0 to the last, and an empty one back."""
        right, left = (rank + 1) % world, (rank - 1) % world
        got, big, empty = torch.zeros(8, dtype=torch.float64), torch.zeros(1 << 18), torch.zeros(0)
        ring = [
            dist.P2POp(dist.isend, values(rank, torch.float64) * 5, right, group=group, tag=7),
            dist.P2POp(dist.irecv, got, left, group=group, tag=7),
        ]
        for work in dist.batch_isend_irecv(ring):
            work.wait()
        if rank == 0:
            dist.send(torch.arange(1 << 18, dtype=torch.float32), dst=world - 1, group=group)
            dist.recv(empty, src=world - 1, group=group)
        elif rank == world - 1:
            dist.recv(big, src=0, group=group)
            dist.send(empty, dst=0, group=group)
        return [got, big, empty]

    def second_group(group: object) -> list[torch.Tensor]:
        t = values(rank, torch.float32)
        dist.all_reduce(t, group=second if group is None else group)
        return [t]

    calls = [
        reduce, gather, scatter, all_to_all, all_to_all_single, all_to_all_uneven, point_to_point,
        second_group,
    ]  # fmt: skip
    outcome = {
        "fully_shard as DDP over gloo": like_gloo(
            train_fsdp(rank, world, 3), train(rank, 3, gloo, say_steps=False), world
        ),
        "no_sync as gloo": like_gloo(
            *(train(rank, 4, group, accumulate=2, say_steps=False) for group in (None, gloo)), world
        ),
    }
    for call in calls:
        got, want = call(None), call(gloo)
        same_bits = len(got) == len(want) and all(map(torch.equal, got, want))
        outcome[f"{call.__name__} as gloo"] = "ok" if same_bits else f"got {got}, gloo {want}"
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


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 8))


def batch(data: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(32, 64, generator=data), torch.randn(32, 8, generator=data)


def flat(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    """A model's parameters, end to end."""
    return torch.cat([parameter.detach().reshape(-1) for parameter in parameters])


def digest(parameters: torch.Tensor) -> str:
    return hashlib.sha256(parameters.numpy().tobytes()).hexdigest()


def train(
    rank: int,
    steps: int,
    group: dist.ProcessGroup | None = None,
    pause: Pause | None = None,
    accumulate: int = 1,
    say_steps: bool = True,
) -> torch.Tensor:
    """A few DDP steps of a small MLP; each rank its own data. Returns the final parameters (flat).
    With `accumulate` > 1, each step's gradients sum that many batches, all but the last under no_sync."""
    torch.manual_seed(1234 + rank)  # different initial weights: DDP's broadcast from rank 0 must fix that
    model = DistributedDataParallel(
        mlp(),
        process_group=group,
        bucket_cap_mb=0.05,  # several buckets, so allreduces overlap the backward pass
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(99 + rank)
    for step in range(steps):
        optimizer.zero_grad()
        for n in range(accumulate):
            x, y = batch(data)
            with model.no_sync() if n < accumulate - 1 else contextlib.nullcontext():
                torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if say_steps:
            say(step=step, rank=rank)
        if pause and rank == 0 and step == pause.at:
            pause.wait()
    return flat(model.module.parameters())


def train_fsdp(rank: int, world: int, steps: int) -> torch.Tensor:
    """train()'s steps with the MLP sharded by FSDP2 (fully_shard) over the default group, from the initial
    weights DDP starts from (rank 0's). Its gradients are AVG-reduce-scattered, DDP's pre-divided sums: with
    two ranks the same bits."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(1234)
    model = mlp()
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(99 + rank)
    for _ in range(steps):
        optimizer.zero_grad()
        x, y = batch(data)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return flat(parameter.full_tensor() for parameter in model.parameters())


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
    # libshift's moves and warnings on stderr, which a failed test shows: what each rank saw of a failure
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank {os.environ['RANK']} %(name)s: %(message)s"
    )
    logging.getLogger("torch").setLevel(logging.WARNING)
    dist.init_process_group(backend="shift")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.distributed_c10d._get_default_group()
    local_rank = int(os.environ["LOCAL_RANK"])
    backend = dist.get_backend()
    say(rank=rank, local_rank=local_rank, device=group.device, backend=backend, resilient=group.resilient)
    say(checks=check_collectives(rank, world) | against_gloo(rank, world), rank=rank)
    say(errors=check_errors(rank), rank=rank)
    trained = train(rank, args.steps)
    say(params=digest(trained), rank=rank)
    if args.pause_at is not None:
        paused = train(rank, args.steps, pause=Pause(args.pause_at, args.resume_file))
        say(paused_params=digest(paused), rank=rank)
    if args.gloo_reference:
        gloo = train(rank, args.steps, group=dist.new_group(backend="gloo"))
        say(as_gloo=like_gloo(trained, gloo, world), rank=rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
