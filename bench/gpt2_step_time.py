"""GPT-2 step time before, during and after a failover, on a 2x2 lab with the "shift" DDP backend.

Runs the example job (examples/gpt2) with `fail-nic mlx5_0` on h0 at 1/3 of the run and `recover-nic` at
2/3, and, in the same session, the same job without a failure as the control: on a shared machine the
control's step times over the same steps say how much of a difference is the failover and how much the
neighbours. Prints one table (median and mean step time per phase, ratio to the phase before, the
control's median over the same steps), the failovers shiftd recorded, and writes bench/out/
gpt2_step_time.json and .png. Target: the median step time while failed over within 10% of the one
before. The first WARMUP steps are left out (first-iteration allocations). Needs root.

Usage: .venv/bin/python bench/gpt2_step_time.py [--steps 150] [--model small] [--no-control]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "gpt2"))

import report  # noqa: E402
import scenario  # noqa: E402
from job import JobSpec  # noqa: E402

from shiftlab.lab import Lab  # noqa: E402

OUT = ROOT / "bench" / "out"
WARMUP = 5
TARGET = 1.10  # during / before, at most


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150, help="training steps per run (default 150)")
    p.add_argument("--model", default="small", help="model preset of examples/gpt2/model.py (default small)")
    p.add_argument("--no-control", action="store_true", help="skip the run without a failure")
    p.add_argument("--name", default="gdbench", help="lab name (default gdbench)")
    args = p.parse_args()
    if args.steps < 60:
        p.error("--steps must be at least 60")
    return args


def stats(steps: list[dict]) -> dict[str, float | int | None]:
    times = [s["step_time"] for s in steps]
    return {
        "steps": len(times),
        "first": steps[0]["step"] if steps else None,
        "last": steps[-1]["step"] if steps else None,
        "median": statistics.median(times) if times else None,
        "mean": statistics.fmean(times) if times else None,
    }


def measure(result: scenario.RunResult, control: scenario.RunResult | None) -> dict[str, dict]:
    """Per phase: step span, median and mean, ratio of the median to the one before, the control's median."""
    phases = report.phases(result, [s for s in report.rank_steps(result) if s["step"] >= WARMUP])
    by_step = {s["step"]: s for s in report.rank_steps(control)} if control else {}
    data = {name: stats(phases.of(name)) for name in report.PHASES}
    base = data["before"]["median"]
    for name, st in data.items():
        same = [by_step[s["step"]] for s in phases.of(name) if s["step"] in by_step]
        st["control_median"] = statistics.median(s["step_time"] for s in same) if same else None
        st["ratio"] = st["median"] / base if st["median"] is not None and base else None
    return data


def table(data: dict[str, dict]) -> str:
    def ms(v: float | None) -> str:
        return f"{v * 1e3:.2f}" if v is not None else "-"

    lines = [
        f"{'phase':<8} {'steps':>9} {'median ms':>10} {'mean ms':>9} {'vs before':>10} {'control ms':>11}"
    ]
    for name, st in data.items():
        span = f"{st['first']}-{st['last']}" if st["steps"] else "-"
        ratio = f"{st['ratio']:.3f}x" if st["ratio"] is not None else "-"
        cells = [
            f"{name:<8}",
            f"{span:>9}",
            f"{ms(st['median']):>10}",
            f"{ms(st['mean']):>9}",
            f"{ratio:>10}",
        ]
        lines.append(" ".join([*cells, f"{ms(st['control_median']):>11}"]))
    return "\n".join(lines)


def progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def main() -> int:
    args = parse_args()
    spec = JobSpec(backend="shift", model=args.model, steps=args.steps)
    plan = scenario.FaultPlan(
        fail_step=args.steps // 3, recover_step=2 * args.steps // 3, settle_step=args.steps - 5, via="admin"
    )
    lab = Lab(args.name, hosts=2, nics=2)
    lab.up()
    try:
        result = scenario.run(lab, spec, OUT / "gpt2_step_time" / "failure", plan, show=progress)
        control = None
        if not args.no_control:
            control_spec = replace(spec, port=spec.port + 1)
            control = scenario.run(lab, control_spec, OUT / "gpt2_step_time" / "control", show=progress)
    finally:
        lab.down()
    data = measure(result, control)
    during = data["during"]["ratio"]
    verdict = "n/a" if during is None else ("ok" if during <= TARGET else "MISSED")
    print(f"GPT-2 ({args.model}), 2 ranks on a 2x2 lab, backend shift, {args.steps} steps, h0 mlx5_0 fails")
    print(table(data))
    print(f"target: during/before <= {TARGET:.2f}: {verdict}")
    for s in report.switches(result):
        print(report.format_switch(s, report.rank_steps(result)))
    for problem in result.problems:
        print(f"problem: {problem}")
    OUT.mkdir(parents=True, exist_ok=True)
    record = {"spec": asdict(spec), "phases": data, "target": TARGET, "verdict": verdict}
    (OUT / "gpt2_step_time.json").write_text(json.dumps(record, indent=1) + "\n")
    png = report.plot(result, control, OUT / "gpt2_step_time.png")
    print(f"plot: {png}")
    return 0 if result.ok and verdict != "MISSED" else 1


if __name__ == "__main__":
    sys.exit(main())
