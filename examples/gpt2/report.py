"""The end of a run: steps before, during and after the failure, what shiftd recorded, step times,
the final weights against a run without failure, and a PNG of loss and step time over steps.

"During" is by the clock: the steps that ended after `shiftctl fail-nic` was issued and before the
last failback shiftd recorded. Step times are compared by their median, which a few slow steps on a
shared machine do not move.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from job import RankLog
from scenario import RunResult

PHASES = ("before", "during", "after")
VIA = {"shiftctl": "shiftctl in the host", "admin": "shiftd's admin API, as shiftctl"}


@dataclass(frozen=True)
class Phases:
    """Rank 0's steps split by the failure and the failback; each a list of step records."""

    before: list[dict[str, Any]]
    during: list[dict[str, Any]]
    after: list[dict[str, Any]]

    def of(self, name: str) -> list[dict[str, Any]]:
        return getattr(self, name)

    def median(self, name: str) -> float | None:
        steps = self.of(name)
        return statistics.median(s["step_time"] for s in steps) if steps else None

    def span(self, name: str) -> str:
        steps = self.of(name)
        return f"{steps[0]['step']}-{steps[-1]['step']} ({len(steps)})" if steps else "none"


def switches(result: RunResult) -> list[dict[str, Any]]:
    """The failovers and failbacks shiftd recorded, all hosts, in time order, with their host; the time is
    the agent's own for the switch when it gave one, else when shiftd heard of it."""
    found = []
    for host, events in result.events.items():
        for e in (e for e in events if "failover" in e):
            nanos = e["failover"].get("time_unix_nanos", e["time_unix_nanos"])
            found.append({**e["failover"], "host": host, "time": int(nanos) / 1e9})
    return sorted(found, key=lambda s: s["time"])


def is_failback(switch: dict[str, Any]) -> bool:
    return switch.get("kind") == "FAILOVER_KIND_FAILBACK"


def phases(result: RunResult, steps: list[dict[str, Any]]) -> Phases:
    if result.failed_at is None:
        return Phases(steps, [], [])
    backs = [s["time"] for s in switches(result) if is_failback(s)]
    back = max(backs) if backs else float("inf")
    return Phases(
        [s for s in steps if s["time"] <= result.failed_at],
        [s for s in steps if result.failed_at < s["time"] <= back],
        [s for s in steps if s["time"] > back],
    )


def weight_differences(a: Path, b: Path) -> list[str]:
    """Names of the tensors whose bytes differ between two checkpoints (empty: bitwise equal)."""
    wa = torch.load(a, weights_only=True)["model"]
    wb = torch.load(b, weights_only=True)["model"]
    names = sorted(set(wa) | set(wb))

    def raw(t: torch.Tensor | None) -> bytes | None:
        return None if t is None else t.detach().contiguous().view(torch.uint8).numpy().tobytes()

    return [n for n in names if raw(wa.get(n)) != raw(wb.get(n))]


def step_of(steps: list[dict[str, Any]], when: float) -> int | None:
    """The first step that ended after `when`."""
    return next((s["step"] for s in steps if s["time"] > when), None)


def format_switch(s: dict[str, Any], steps: list[dict[str, Any]]) -> str:
    kind = "failback" if is_failback(s) else "failover"
    return (
        f"  {s['host']:<4} {kind:<8} {s.get('device', '?')} -> {s.get('backup_device', '?')}"
        f"  reason={s.get('reason', '?')}  downtime={s.get('downtime_seconds', 0.0) * 1e3:.1f} ms"
        f"  qps={s.get('qps', 0)}  reposted={s.get('reposted_work_requests', 0)}"
        f"  (during step {step_of(steps, s['time'])})"
    )


def summary(result: RunResult, reference: RunResult | None, shape: str) -> str:
    """The report, as lines of text."""
    spec, plan = result.spec, result.plan
    steps = rank_steps(result)
    ph = phases(result, steps)
    lines = [f"GPT-2 ({spec.model}) on a lab of {shape}, backend {spec.backend!r}, {spec.steps} steps"]
    if plan:
        lines.append(
            f"fault: fail-nic {plan.device} --mode {plan.mode} on {plan.host} after step {plan.fail_step},"
            f" recover-nic before step {plan.recover_step} ({VIA[plan.via]})"
        )
    lines.append("steps:      " + "   ".join(f"{p} {ph.span(p)}" for p in PHASES))
    base = ph.median("before")
    times = []
    for p in PHASES:
        m = ph.median(p)
        ratio = f" ({m / base:.2f}x)" if m is not None and base and p != "before" else ""
        times.append(f"{p} {m:.4f} s{ratio}" if m is not None else f"{p} -")
    lines.append("step time (median):  " + "   ".join(times))
    lines.append("shiftd recorded:")
    lines += [format_switch(s, steps) for s in switches(result)] or ["  no failover or failback"]
    lines.append(
        "  counts: "
        + "; ".join(f"{h} {fo} failover(s), {fb} failback(s)" for h, (fo, fb) in result.counts.items())
    )
    lines.append(f"loss: first {steps[0]['loss']:.3f}, last {steps[-1]['loss']:.3f}" if steps else "loss: -")
    errors = ", ".join(f"{h} exited {rc}" for h, rc in result.returncodes.items() if rc != 0)
    lines.append(f"errors that reached the training script: {errors or 'none (every rank exited 0)'}")
    if reference is not None:
        lines.append("final weights: " + _weights_verdict(result, reference))
    lines += [f"problem: {p}" for p in result.problems]
    return "\n".join(lines)


def weights_equal(result: RunResult, reference: RunResult) -> bool:
    ckpt, ref = result.out / "checkpoint.pt", reference.out / "checkpoint.pt"
    return ckpt.exists() and ref.exists() and not weight_differences(ckpt, ref)


def _weights_verdict(result: RunResult, reference: RunResult) -> str:
    ckpt, ref = result.out / "checkpoint.pt", reference.out / "checkpoint.pt"
    if not ckpt.exists() or not ref.exists():
        return "cannot compare: a checkpoint is missing"
    diff = weight_differences(ckpt, ref)
    if not diff:
        return "bitwise EQUAL to those of the run without failure"
    return f"DIFFER from those of the run without failure in {len(diff)} tensor(s): {', '.join(diff[:5])}"


def _log(result: RunResult, rank: int) -> RankLog:
    log = RankLog(result.out / f"rank{rank}.jsonl")
    log.refresh()
    return log


def rank_steps(result: RunResult, rank: int = 0) -> list[dict[str, Any]]:
    return _log(result, rank).steps


def digests(result: RunResult) -> list[str | None]:
    """Each rank's digest of its final weights (train.py), None for a rank that did not end."""
    ends = [_log(result, rank).event("end") for rank in range(len(result.returncodes))]
    return [end["digest"] if end else None for end in ends]


def plot(result: RunResult, reference: RunResult | None, path: Path) -> Path:
    """Loss and step time over steps, the failed-over span shaded, failure and failback marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = rank_steps(result)
    ph = phases(result, steps)
    fig, (ax_loss, ax_time) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    xs = [s["step"] for s in steps]
    if reference is not None:
        ref = rank_steps(reference)
        ref_xs = [s["step"] for s in ref]
        ax_loss.plot(ref_xs, [s["loss"] for s in ref], color="0.7", lw=3, label="no failure")
        ax_time.plot(ref_xs, [s["step_time"] * 1e3 for s in ref], color="0.7", lw=1, label="no failure")
    ax_loss.plot(xs, [s["loss"] for s in steps], color="C0", lw=1, label="with failure")
    ax_time.plot(xs, [s["step_time"] * 1e3 for s in steps], color="C0", lw=1, label="with failure")
    for ax in (ax_loss, ax_time):
        if ph.during:
            first, last = ph.during[0]["step"], ph.during[-1]["step"]
            ax.axvspan(first, last, color="C3", alpha=0.12, label="failed over")
            ax.axvline(first, color="C3", ls="--", lw=1, label="fail-nic")
        if ph.after:
            ax.axvline(ph.after[0]["step"], color="C2", ls="--", lw=1, label="failback")
    ax_loss.set_ylabel("loss (rank 0)")
    ax_time.set_ylabel("step time (ms)")
    ax_time.set_xlabel("step")
    ax_loss.legend(loc="upper right", fontsize="small")
    ax_loss.set_title(f"GPT-2 ({result.spec.model}), backend {result.spec.backend!r}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
