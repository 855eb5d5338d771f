"""torch.distributed collectives on the "shift" backend against gloo, side by side in one run on one lab NIC.

Builds a lab (2 hosts x 2 NICs; prefix `tg`) and runs one rank per host (this file with --rank). Each rank
makes the default group on the shift backend and a gloo group beside it (`new_group(backend="gloo")`), gloo
on the netdev shift's mlx5_0 uses (GLOO_SOCKET_IFNAME), so the two move their bytes over the same link.
For every call and size the two backends take turns, ROUNDS times each, every turn a timed loop between
barriers of its own group; each rank takes its median turn, and a row is the slower rank's (a broadcast's
root may return before its bytes have arrived, gloo's does; the receiver's time is what a job waits for).
Sizes are the whole buffer as nccl-tests count them (all_gather's output, reduce_scatter's input),
float32. Bus bandwidth as nccl-tests: all_reduce size x 2(n-1)/n, all_gather and reduce_scatter
size x (n-1)/n, broadcast size, each over the time. send_recv is point to point: every rank isends the size
to the next rank and irecvs the one before's (batch_isend_irecv) into one tensor per size, as a pipeline
stage receives into buffers it made once (torch.distributed.pipelining); bus bandwidth the size over the
time.

Then the GPT-2 example trains the same steps under each backend (examples/gpt2, 2 ranks, gloo on the
same NIC), and the median step time after WARMUP steps is compared.

Prints the table (time per call for each backend, shift/gloo, and both bus bandwidths) and writes
bench/out/torch_vs_gloo.json and .png. Needs root.

Usage: .venv/bin/python bench/torch_vs_gloo.py [--sizes 8,65536,...] [--calls all_reduce,...]
       [--gpt2-steps 40] [--no-gpt2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "gpt2"))

from lab_ranks import on_hosts  # noqa: E402

from shiftlab.fabric import Shape  # noqa: E402
from shiftlab.lab import Lab  # noqa: E402

OUT = ROOT / "bench" / "out"
SIZES = [8, 256, 8 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
CALLS = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "send_recv"]
ROUNDS = 5  # turns per backend, alternating
TURN_BYTES = 128 << 20  # calls per turn: about this many bytes ...
TURN_CALLS = (3, 300)  # ... within these bounds
PORT = 29530
GPT2_STEPS = 40
WARMUP = 5  # GPT-2 steps left out (first-iteration allocations)
BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "send_recv": lambda n: 1.0,  # every rank sends the size to the next
}


# -- one rank -------------------------------------------------------------------------------------------


def rank_main(args: argparse.Namespace) -> None:
    """Both groups, then every call and size in turns; one JSON line per row (this rank's medians)."""
    import torch
    import torch.distributed as dist

    world = args.world
    dist.init_process_group(
        "shift", init_method=f"tcp://{args.master}:{args.port}", rank=args.rank, world_size=world
    )
    groups = {"shift": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}

    def operation(call: str, size: int) -> Callable[[object], None]:
        count = max(size // 4 // world, 1) * world  # float32 elements, a whole number per rank
        whole, part = torch.ones(count), torch.ones(count // world)
        if call == "all_reduce":
            return lambda g: dist.all_reduce(whole.fill_(0), group=g)  # stays finite
        if call == "broadcast":
            return lambda g: dist.broadcast(whole, src=0, group=g)
        if call == "all_gather":
            return lambda g: dist.all_gather_into_tensor(whole, part, group=g)
        if call == "send_recv":
            theirs = torch.empty_like(whole)  # made once: a fresh one per call was the rule before session 28
            return lambda g: exchange(whole, theirs, g)
        return lambda g: dist.reduce_scatter_tensor(part, whole, group=g)

    def exchange(mine: object, theirs: object, group: object) -> None:
        """isend to the next rank, irecv from the one before, both posted before either is waited for."""
        right, left = (args.rank + 1) % world, (args.rank - 1) % world
        pair = [
            dist.P2POp(dist.isend, mine, right, group=group),
            dist.P2POp(dist.irecv, theirs, left, group=group),
        ]
        for work in dist.batch_isend_irecv(pair):
            work.wait()

    for call in args.calls:
        for size in args.sizes:
            op = operation(call, size)
            calls = max(TURN_CALLS[0], min(TURN_CALLS[1], TURN_BYTES // max(size, 1)))
            turns: dict[str, list[float] | str] = {}
            for name, group in groups.items():
                try:
                    op(group)  # warm-up: first-call allocations, direct placement's registration
                    turns[name] = []
                except (RuntimeError, NotImplementedError) as exc:
                    turns[name] = str(exc).splitlines()[0]
            for turn in range(ROUNDS):
                order = list(groups.items())
                for name, group in order if turn % 2 == 0 else order[::-1]:
                    if isinstance(turns[name], str):
                        continue
                    dist.barrier(group=group)
                    start = time.perf_counter()
                    for _ in range(calls):
                        op(group)
                    turns[name].append((time.perf_counter() - start) / calls)
            row = {"call": call, "size": size, "calls": calls}
            for name, got in turns.items():
                row[name] = statistics.median(got) if isinstance(got, list) else got
            print(json.dumps(row), flush=True)
    dist.destroy_process_group()


# -- the run ---------------------------------------------------------------------------------------------


def collectives(lab: Lab, args: argparse.Namespace) -> list[dict]:
    me = [sys.executable, __file__, "--world", "2", "--master", lab.shape.mgmt_address(0)]
    me += ["--port", str(PORT), "--sizes", ",".join(map(str, args.sizes)), "--calls", ",".join(args.calls)]
    argvs = [[*me, "--rank", str(rank)] for rank in range(2)]
    outputs = on_hosts(lab, "torch_vs_gloo", "the collectives", argvs)
    ranks = [[json.loads(line) for line in out.splitlines() if line.startswith("{")] for out in outputs]
    return [slower(*rows) for rows in zip(*ranks, strict=True)]


def slower(*rows: dict) -> dict:
    """One row of every rank's: each backend's time is the slower rank's (a broadcast's root returns once
    its bytes are on their way, gloo's before they have arrived; what the job waits for is the receiver)."""
    merged = dict(rows[0])
    for backend in ("shift", "gloo"):
        times = [row[backend] for row in rows]
        if all(isinstance(t, float) for t in times):
            merged[backend] = max(times)
    return merged


def gpt2(lab: Lab, steps: int) -> dict[str, float | None]:
    """The median step time of the GPT-2 example under each backend (the same steps, one after the other)."""
    import report
    import scenario
    from job import JobSpec

    medians: dict[str, float | None] = {}
    for offset, backend in enumerate(("shift", "gloo")):
        spec = JobSpec(backend=backend, steps=steps, port=PORT + 1 + offset, launcher="direct")
        result = scenario.run(lab, spec, OUT / "torch_vs_gloo" / backend, show=progress)
        if not result.ok:
            raise SystemExit(f"torch_vs_gloo: GPT-2 on {backend} failed: {'; '.join(result.problems)}")
        times = [s["step_time"] for s in report.rank_steps(result) if s["step"] >= WARMUP]
        medians[backend] = statistics.median(times) if times else None
    return medians


def bus_bw(row: dict, backend: str) -> float | None:
    seconds = row.get(backend)
    if not isinstance(seconds, float):
        return None
    return row["size"] * BUS_FACTOR[row["call"]](2) / seconds


def table(rows: list[dict]) -> str:
    def cell(value: object, fmt: Callable[[float], str]) -> str:
        return fmt(value) if isinstance(value, float) else "-"

    lines = [f"{'call':<15} {'bytes':>9} {'gloo':>11} {'shift':>11} {'shift/gloo':>10} {'bus bw gloo':>12} "
             f"{'bus bw shift':>12}"]  # fmt: skip
    for row in rows:
        gloo, shift = row.get("gloo"), row.get("shift")
        ratio = shift / gloo if isinstance(gloo, float) and isinstance(shift, float) else None
        lines.append(
            f"{row['call']:<15} {row['size']:>9} {cell(gloo, lambda v: f'{v * 1e6:.0f} us'):>11} "
            f"{cell(shift, lambda v: f'{v * 1e6:.0f} us'):>11} {cell(ratio, lambda v: f'{v:.2f}x'):>10} "
            f"{cell(bus_bw(row, 'gloo'), lambda v: f'{v / 1e6:.0f} MB/s'):>12} "
            f"{cell(bus_bw(row, 'shift'), lambda v: f'{v / 1e6:.0f} MB/s'):>12}"
        )
    unsupported = {f"{row['call']} on {b}: {row[b]}" for row in rows for b in ("gloo", "shift")
                   if isinstance(row.get(b), str)}  # fmt: skip
    return "\n".join([*lines, *sorted(unsupported)])


def plot(rows: list[dict], path: Path) -> None:
    """shift/gloo time ratio per call over the sizes (below 1: shift is faster)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for call in dict.fromkeys(row["call"] for row in rows):
        mine = [r for r in rows if r["call"] == call and isinstance(r.get("gloo"), float)
                and isinstance(r.get("shift"), float)]  # fmt: skip
        ax.plot([r["size"] for r in mine], [r["shift"] / r["gloo"] for r in mine], marker="o", label=call)
    ax.axhline(1.0, color="black", linestyle=":", label="as fast as gloo")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes (nccl-tests' size: the whole buffer)")
    ax.set_ylabel("shift time / gloo time")
    ax.set_title("torch.distributed on the shift backend against gloo, 2 ranks, one lab NIC")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def parse_args() -> argparse.Namespace:
    def sizes(text: str) -> list[int]:
        try:
            found = [int(x) for x in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"sizes are byte counts separated by commas: {text!r}") from None
        if any(size < 1 for size in found):
            raise argparse.ArgumentTypeError("sizes must be positive")
        return found

    def calls(text: str) -> list[str]:
        found = text.split(",")
        if unknown := [c for c in found if c not in CALLS]:
            raise argparse.ArgumentTypeError(
                f"unknown call(s) {', '.join(unknown)}; known: {', '.join(CALLS)}"
            )
        return found

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--sizes", type=sizes, default=SIZES, help="bytes, comma-separated (default 8 B .. 64 MiB)"
    )
    p.add_argument("--calls", type=calls, default=CALLS, help=f"comma-separated, of {', '.join(CALLS)}")
    p.add_argument("--gpt2-steps", type=int, default=GPT2_STEPS, help=f"(default {GPT2_STEPS})")
    p.add_argument("--no-gpt2", action="store_true", help="skip the GPT-2 step times")
    p.add_argument("--name", default="tg", help="lab name (default tg)")
    for hidden in ("--rank", "--world", "--port"):
        p.add_argument(hidden, type=int, help=argparse.SUPPRESS)
    p.add_argument("--master", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is None and not args.no_gpt2 and args.gpt2_steps <= WARMUP:
        p.error(f"--gpt2-steps must be more than {WARMUP}")
    return args


def main() -> int:
    args = parse_args()
    if args.rank is not None:
        rank_main(args)
        return 0
    os.environ["GLOO_SOCKET_IFNAME"] = Shape.netdev(0)  # the lab hosts inherit it: gloo on mlx5_0's netdev
    lab = Lab(args.name, hosts=2, nics=2)
    lab.up()
    try:
        progress("collectives: shift and gloo taking turns")
        rows = collectives(lab, args)
        steps = None if args.no_gpt2 else gpt2(lab, args.gpt2_steps)
    finally:
        lab.down()
    print("torch.distributed, 2 ranks (one per lab host), float32; time per call, the slower rank's median "
          f"of {ROUNDS} turns; gloo on {Shape.netdev(0)}, the netdev of shift's mlx5_0")  # fmt: skip
    print(table(rows))
    if steps is not None:
        shift, gloo = steps["shift"], steps["gloo"]
        ratio = f"{shift / gloo:.2f}x" if shift and gloo else "-"
        print(f"GPT-2 (small) median step time over {args.gpt2_steps - WARMUP} steps: "
              f"gloo {gloo * 1e3:.1f} ms, shift {shift * 1e3:.1f} ms, shift/gloo {ratio}")  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "torch_vs_gloo.json").write_text(json.dumps({"rows": rows, "gpt2": steps}, indent=1) + "\n")
    plot(rows, OUT / "torch_vs_gloo.png")
    print(f"plot: {OUT / 'torch_vs_gloo.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
