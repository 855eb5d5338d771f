"""Throughput over time across a failure and a failback, drawn as a PNG with each moment marked.

On a 2x2 lab, h0 streams RDMA_WRITEs (64 KiB, 16 outstanding, one shift QP) to h1, blocking on a completion
channel when the window is full. After --before seconds h0's port on the rail-0 switch goes down (the NIC
loses carrier: failover to mlx5_1); after --during more seconds it comes back (shiftd reports the NIC UP
after its hold-down and the QP fails back onto mlx5_0); the stream runs --after seconds more. The sender
times every completion (CLOCK_MONOTONIC); the plot bins them (--bin ms) and marks: the link going down (the
netlink request), traffic resuming on the backup (first completion of a WR posted after it), the link coming
back, and the QP back on mlx5_0 (the sender's QP state turning default again).

    sudo .venv/bin/python bench/failover_throughput.py [--png bench/out/failover_throughput.png]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from failover_lab import OUT, Pair, arguments, lab_for, progress, save, switch_port

SIZE = 65536
ZOOM_AFTER = 0.06  # s after the failure shown in the zoomed panel
COLOURS = {
    "link down": "tab:red",
    "resumed on backup": "tab:orange",
    "link up": "tab:green",
    "back on mlx5_0": "tab:purple",
}


def run(args: argparse.Namespace) -> dict[str, Any]:
    with lab_for(args) as lab, Pair(lab, "--mode", "write", "--size", str(SIZE), "--block") as pair:
        pair.settle()
        pair.sender.send(stream=True)
        start = time.monotonic_ns()
        progress("streaming on mlx5_0...")
        time.sleep(args.before)
        port = switch_port(lab, "h0", up=False)
        down = port.asked
        resumed = pair.sender.ask("resumed", mark=down, after=port.done)
        progress("on the backup...")
        time.sleep(max(0.0, args.during - (time.monotonic_ns() - down) / 1e9))
        up = switch_port(lab, "h0", up=True).asked
        progress("link back; failing back...")
        pair.sender.ask("settled", settled=True)
        time.sleep(args.after)
        sent, received = pair.stop(timeline=True)
    if sent["errors"] or received["errors"]:
        raise SystemExit(f"errors reached the application: {sent['errors'] + received['errors']}")
    back = next((t for t, state in sent["transitions"] if t > up and state == "default"), None)
    marks = {
        "link down": down,
        "resumed on backup": resumed["first_ns"],
        "link up": up,
        "back on mlx5_0": back,
    }
    return {
        "start_ns": start,
        "marks_s": {k: (v - start) / 1e9 for k, v in marks.items() if v is not None},
        "completions_s": [(t - start) / 1e9 for t in sent["timeline"]["ns"]],
        "bytes": sent["timeline"]["bytes"],
    }


def bins(result: dict[str, Any], width: float) -> tuple[list[float], list[float]]:
    """(bin start s, MB/s) over the whole stream."""
    end = max(result["completions_s"], default=0.0)
    totals = [0.0] * (int(end / width) + 1)
    for t, size in zip(result["completions_s"], result["bytes"], strict=True):
        if t >= 0:
            totals[int(t / width)] += size
    return [i * width for i in range(len(totals))], [b / width / 1e6 for b in totals]


def draw(result: dict[str, Any], width: float, png: Path) -> None:
    """The whole stream, and beside it the failure itself in 1 ms bins."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (whole, zoom) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [3, 1]})
    down = result["marks_s"]["link down"]
    for ax, bin_s, span in ((whole, width, None), (zoom, 1e-3, (down - 0.02, down + ZOOM_AFTER))):
        xs, ys = bins(result, bin_s)
        ax.step(xs, ys, where="post", linewidth=0.8, color="tab:blue")
        for label, at in result["marks_s"].items():
            ax.axvline(at, linestyle="--", linewidth=1, color=COLOURS[label], label=f"{label} ({at:.3f} s)")
        ax.set_ylabel(f"MB/s ({bin_s * 1e3:g} ms bins)")
        ax.set_ylim(bottom=0)
        if span:
            ax.set_xlim(*span)
    whole.set_xlabel("time since the stream started (s)")
    whole.set_title(
        "shift QP, RDMA_WRITE 64 KiB h0 -> h1: failover to mlx5_1, failback to mlx5_0", fontsize=10
    )
    zoom.set_xlabel("s (around the failure)")
    zoom.set_title("the failure, 1 ms bins", fontsize=10)
    whole.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=4, fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


def print_table(result: dict[str, Any], width: float, png: Path) -> None:
    marks = result["marks_s"]
    xs, ys = bins(result, width)

    def mean(lo: float, hi: float) -> float:
        inside = [y for x, y in zip(xs, ys, strict=True) if lo <= x and x + width <= hi]
        return sum(inside) / len(inside) if inside else 0.0

    down, up = marks["link down"], marks["link up"]
    back = marks.get("back on mlx5_0", up)
    print(f"\nThroughput across a failure and a failback (plot: {png})\n")
    print(f"{'moment':28} {'at (s)':>8}")
    print("-" * 37)
    for label, at in marks.items():
        print(f"{label:28} {at:8.3f}")
    print(f"\n{'phase':28} {'MB/s':>8}")
    print("-" * 37)
    print(f"{'before the failure':28} {mean(0.2, down):8.1f}")
    print(f"{'on the backup (mlx5_1)':28} {mean(marks['resumed on backup'], up):8.1f}")
    print(f"{'after the failback':28} {mean(back, xs[-1]):8.1f}")
    print(f"\nthroughput gap at the failure: {(marks['resumed on backup'] - down) * 1e3:.1f} ms")


def main() -> int:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--before", type=float, default=1.5, help="seconds on mlx5_0 before the failure")
    parser.add_argument("--during", type=float, default=2.0, help="seconds the link stays down")
    parser.add_argument("--after", type=float, default=1.5, help="seconds after the failback")
    parser.add_argument("--bin", type=float, default=10.0, help="bin width in ms (default 10)")
    parser.add_argument("--png", type=Path, default=OUT / "failover_throughput.png")
    args = parser.parse_args()
    result = run(args)
    print(file=sys.stderr)
    draw(result, args.bin / 1e3, args.png)
    print_table(result, args.bin / 1e3, args.png)
    save(args, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
