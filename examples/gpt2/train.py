"""Train the small GPT-2 with DistributedDataParallel; launch with torchrun, one rank per host.

    torchrun --nnodes 2 --nproc-per-node 1 --node-rank I --master-addr ADDR --master-port 29500 \\
        examples/gpt2/train.py --backend shift --out OUT

Deterministic: seeded initialisation, a data order fixed by (seed, step, rank) (corpus.py), no dropout,
deterministic kernels, one thread. Each rank writes OUT/rank<R>.jsonl: one line per step (loss, step
time, wall-clock end) and a last line with a digest of its final parameters; rank 0 writes
OUT/checkpoint.pt. `--gate-at S` makes every rank wait before step S until the file OUT/gates/go-S
exists: an orchestrator uses it to hold the job while it checks on the fabric, without the wait
showing up in a step time or in a collective's timeout.
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
    with open(args.out / f"rank{rank}.jsonl", "w") as log:
        start = {"event": "start", "rank": rank, "world": world, "backend": args.backend, "model": args.model}
        emit(log, {**start, "config": cfg.as_dict(), "steps": args.steps, "time": time.time()})
        for step in range(args.steps):
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
        emit(log, {"event": "end", "digest": digest(model), "time": time.time()})
    if rank == 0:
        ckpt = {"model": model.state_dict(), "config": cfg.as_dict(), "steps": args.steps, "seed": args.seed}
        torch.save(ckpt, args.out / "checkpoint.pt")
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
