"""Train the small GPT-2 with DistributedDataParallel; launch with torchrun, one rank per host.

    torchrun --nnodes 2 --nproc-per-node 1 --node-rank I --master-addr ADDR --master-port 29500 \\
        examples/gpt2/train.py --backend shift --out OUT

Deterministic: seeded initialisation, a data order fixed by (seed, step, rank) (corpus.py), no dropout,
deterministic kernels, one thread. Each rank writes OUT/rank<R>.jsonl: one line per step (loss, step
time, wall-clock end) and a last line with a digest of its final parameters; rank 0 writes
OUT/checkpoint.pt. `--gate-at S` makes every rank wait before step S until the file OUT/gates/go-S
exists: an orchestrator uses it to hold the job while it checks on the fabric, without the wait
showing up in a step time or in a collective's timeout.

With `--checkpoint-every N`, rank 0 also writes OUT/checkpoint.pt every N steps (model, optimizer, the
next step), and a start that finds one resumes from it: what `torchrun --max-restarts` needs to bring a job
back after shift raised NoPathLeft (a host lost every NIC; docs/torch.md). OUT must be shared by the ranks.
The resumed run ends with the same weights, bit for bit, as one never stopped.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import TextIO

import corpus
import torch
import torch.distributed as dist
from model import GPT, PRESETS
from torch.nn.parallel import DistributedDataParallel as DDP

TIMEOUT = 300.0  # for a gate to open, and for a collective to make progress


class UsageError(Exception):
    """A mistake in how the script was started; one line for the user."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a small byte-level GPT-2 with DDP (launch with torchrun).")
    p.add_argument("--backend", default="shift", help="torch.distributed backend (default shift; or gloo)")
    p.add_argument("--model", choices=sorted(PRESETS), default="small", help="model size (default small)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step (default 8)")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    p.add_argument("--seed", type=int, default=1234, help="seed of initialisation and data order")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank (default 1)")
    p.add_argument("--out", type=Path, required=True, help="directory for the logs and the checkpoint")
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="N",
        help="rank 0 also saves OUT/checkpoint.pt every N steps, and a start resumes from it",
    )
    p.add_argument(
        "--gate-at",
        type=int,
        action="append",
        default=[],
        metavar="STEP",
        help="before STEP, wait for the file OUT/gates/go-STEP (repeatable)",
    )
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.threads < 1:
        p.error("--steps, --batch and --threads must be at least 1")
    if args.checkpoint_every < 0:
        p.error("--checkpoint-every must not be negative")
    return args


def load_backend(name: str) -> None:
    """`shift` is registered with torch.distributed by importing libshift.torch."""
    if name != "shift":
        return
    try:
        import libshift.torch  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"backend 'shift' needs libshift.torch, which does not import: {exc}") from None


def init_group(backend: str) -> tuple[int, int]:
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise UsageError(f"{', '.join(missing)} not set: launch with torchrun")
    load_backend(backend)
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=TIMEOUT))
    except ValueError as exc:  # the backend's word on this host, e.g. no RDMA device
        raise UsageError(f"backend {backend!r}: {exc}") from None
    return dist.get_rank(), dist.get_world_size()


def wait_gate(gates: Path, step: int) -> None:
    go = gates / f"go-{step}"
    deadline = time.monotonic() + TIMEOUT
    while not go.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {go} within {TIMEOUT:g}s")
        time.sleep(0.01)


def digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter's bytes, in order: equal digests mean bitwise-equal weights."""
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save(path: Path, ckpt: dict) -> None:
    """Whole or not at all: a rank killed while writing leaves the previous checkpoint."""
    partial = path.with_name(path.name + ".partial")
    torch.save(ckpt, partial)
    partial.replace(path)


def resume(args: argparse.Namespace, model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """The step to start from: that of the checkpoint found (its state loaded), or 0."""
    path = args.out / "checkpoint.pt"
    if not args.checkpoint_every or not path.exists():
        return 0
    ckpt = torch.load(path, weights_only=True)
    if ckpt.get("seed") != args.seed or ckpt.get("config") != PRESETS[args.model].as_dict():
        raise UsageError(f"{path} is of another run (seed or model); start with another --out")
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    return int(ckpt["next_step"])


def emit(log: TextIO, record: dict) -> None:
    log.write(json.dumps(record) + "\n")
    log.flush()


def train(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    rank, world = init_group(args.backend)
    cfg = PRESETS[args.model]
    data = corpus.load()
    torch.manual_seed(args.seed)
    model = GPT(cfg)
    ddp = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    args.out.mkdir(parents=True, exist_ok=True)
    gates = set(args.gate_at)
    first = resume(args, model, opt)

    def checkpoint(next_step: int) -> dict:
        state = {"model": model.state_dict(), "config": cfg.as_dict(), "steps": args.steps, "seed": args.seed}
        return {**state, "optimizer": opt.state_dict(), "next_step": next_step}

    with open(args.out / f"rank{rank}.jsonl", "a" if first else "w") as log:
        start = {"event": "start", "rank": rank, "world": world, "backend": args.backend, "model": args.model}
        emit(log, {**start, "config": cfg.as_dict(), "steps": args.steps, "from": first, "time": time.time()})
        for step in range(first, args.steps):
            if step in gates:
                wait_gate(args.out / "gates", step)
            shape = {"rank": rank, "world": world, "per_rank": args.batch, "block": cfg.block_size}
            x, y = corpus.batch(data, seed=args.seed, step=step, **shape)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = ddp(x, y)
            loss.backward()
            opt.step()
            elapsed = time.perf_counter() - t0
            emit(log, {"step": step, "loss": loss.item(), "step_time": elapsed, "time": time.time()})
            done = step + 1
            due = args.checkpoint_every and done % args.checkpoint_every == 0 and done < args.steps
            if rank == 0 and due:
                save(args.out / "checkpoint.pt", checkpoint(done))
        emit(log, {"event": "end", "digest": digest(model), "time": time.time()})
    if rank == 0:
        save(args.out / "checkpoint.pt", checkpoint(args.steps))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        train(args)
    except UsageError as exc:
        print(f"train.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
