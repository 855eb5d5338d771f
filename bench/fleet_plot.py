"""The PNG of bench/fleet_scale.py: the prober's lookup latency over the whole run, the phases shaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PHASES = (  # (start mark, end mark, label, colour)
    ("burst", "burst_end", "job start", "tab:blue"),
    ("storm", "storm_end", "rail storm", "tab:orange"),
    ("member_killed", "member_back", "etcd member down", "tab:red"),
    ("turnover", "turnover_end", "second job", "tab:purple"),
)


def draw(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    marks = result["marks"]  # seconds since the fleet started, as the samples' times
    samples = result["probe_samples"]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    kinds = ((0, "lookup as shiftd answers it", "tab:green"), (1, "plain etcd read (Range)", "tab:blue"))
    for kind, label, colour in kinds:
        mine = [s for s in samples if s[3] == kind]
        ax.scatter([s[0] for s in mine if s[2]], [s[1] * 1000 for s in mine if s[2]], s=4, c=colour,
                   linewidths=0, label=label)  # fmt: skip
        ax.scatter([s[0] for s in mine if not s[2]], [s[1] * 1000 for s in mine if not s[2]], s=4,
                   c="tab:gray", linewidths=0)  # fmt: skip
    for begin, end, label, colour in PHASES:
        if begin in marks and end in marks:
            ax.axvspan(marks[begin], marks[end], color=colour, alpha=0.15, label=label)
    if "lapse" in marks:
        ax.axvline(marks["lapse"], color="black", linestyle=":", label="a host dies (lease lapses)")
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the fleet started")
    ax.set_ylabel("lookup latency (ms), prober")
    ax.set_title(
        f"{result['hosts']} simulated hosts x {result['qps_per_host']} QPs on a 3-member etcd "
        "(grey: key not published yet)"
    )
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
