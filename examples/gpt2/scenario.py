"""One run of the job on a lab, with or without a NIC failure in the middle, and what came of it.

The failure is injected while the job runs, once rank 0 has finished `fail_step` (`shiftctl fail-nic`
in the host, or the same admin request from this process, see records.py). Two gates make the rest
independent of the machine's speed: before `recover_step` the job waits until shiftd has counted the
failover, then the NIC is recovered; before `settle_step` it waits until shiftd has counted the
failback. On a machine of normal speed both have happened long before the job gets there and the
gates cost nothing; on a slow one the job waits instead of ending before the fabric did what is
being shown.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import records
from job import Job, JobSpec

from shiftlab.lab import Lab

SWITCH_TIMEOUT = 60.0  # for shiftd to count a failover or failback before the job gives up on it
PROGRESS_EVERY = 2.0


@dataclass(frozen=True)
class FaultPlan:
    fail_step: int
    recover_step: int
    settle_step: int
    host: str = "h0"
    device: str = "mlx5_0"
    mode: str = "down"  # shiftctl fail-nic --mode: down, blackhole
    via: str = "shiftctl"  # or "admin": the same request from this process, within milliseconds

    def check(self, steps: int) -> None:
        if not 0 <= self.fail_step < self.recover_step < self.settle_step < steps:
            raise ValueError(
                f"need 0 <= fail step ({self.fail_step}) < recover step ({self.recover_step})"
                f" < settle step ({self.settle_step}) < steps ({steps})"
            )


@dataclass
class RunResult:
    """A finished run: exit statuses, the fault's timeline, what shiftd counted and recorded."""

    out: Path
    spec: JobSpec
    plan: FaultPlan | None
    returncodes: dict[str, int] = field(default_factory=dict)
    started: float = 0.0  # wall clock (time.time()) of the events below
    failed_at: float | None = None
    recovered_at: float | None = None
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # host -> (failovers, failbacks)
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # host -> shiftctl events --json
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(rc == 0 for rc in self.returncodes.values())

    def save(self) -> Path:
        path = self.out / "run.json"
        data = asdict(self)
        data["out"] = str(self.out)
        path.write_text(json.dumps(data, indent=1) + "\n")
        return path


def run(
    lab: Lab,
    spec: JobSpec,
    out: Path,
    plan: FaultPlan | None = None,
    *,
    show: Callable[[str], None] = lambda _: None,
    timeout: float = 600.0,
) -> RunResult:
    """Run the job on `lab` (with `plan`'s failure), wait for its end, collect; never leaves a NIC failed."""
    if plan:
        plan.check(spec.steps)
        spec = replace(spec, gates=(plan.recover_step, plan.settle_step))
    out.mkdir(parents=True, exist_ok=True)
    result = RunResult(out=out, spec=spec, plan=plan, started=time.time())
    driver = _Driver(lab, Job(lab, spec, out), plan, result, show)
    try:
        driver.job.start()
        where = f"{', '.join(lab.host_names)}, rendezvous at {driver.job.master}:{spec.port}"
        show(f"{spec.launcher} started on {where}; waiting for the first step")
        driver.follow(time.monotonic() + timeout)
        result.returncodes = driver.job.wait(timeout=60.0)
    finally:
        driver.close()
    since = int(result.started * 1e9)
    result.events = {h: records.events(lab, h, since) for h in lab.host_names}
    for host, rc in result.returncodes.items():
        if rc != 0:
            result.problems.append(f"{host}: the job exited with status {rc} (see {out / f'{host}.log'})")
    result.save()
    return result


class _Driver:
    """Follows a running job: shows progress and carries out the fault plan at its three moments."""

    def __init__(
        self, lab: Lab, job: Job, plan: FaultPlan | None, result: RunResult, show: Callable[[str], None]
    ) -> None:
        self.lab, self.job, self.plan, self.result, self.show = lab, job, plan, result, show
        self.admin = records.Admin(lab)
        self.shown_step, self.shown_at = -1, 0.0

    def follow(self, deadline: float) -> None:
        while not self.job.finished() and not self.job.failed():
            if time.monotonic() > deadline:
                self.result.problems.append("the job did not finish in time")
                return
            self.job.refresh()
            step = self.job.logs[0].last_step
            self._progress(step)
            if self.plan:
                self._advance(self.plan, step)
            time.sleep(0.05)

    def close(self) -> None:
        """Stop the job if it still runs, recover a NIC left failed, read the final counts."""
        self.job.stop()
        plan, result = self.plan, self.result
        if plan and result.failed_at is not None and result.recovered_at is None:
            self.admin.recover_nic(plan.host, plan.device)
        result.counts = {h: self.admin.delta(h) for h in self.lab.host_names}
        self.admin.close()

    def _progress(self, step: int) -> None:
        steps = self.job.spec.steps
        recent = time.monotonic() - self.shown_at < PROGRESS_EVERY
        if step == self.shown_step or (recent and step < steps - 1):
            return
        last = self.job.logs[0].steps[-1]
        self.show(f"step {step + 1}/{steps}  loss {last['loss']:.3f}  step time {last['step_time']:.3f} s")
        if step == steps - 1:
            self.show("all steps done; waiting for the ranks to exit")
        self.shown_step, self.shown_at = step, time.monotonic()

    def _advance(self, plan: FaultPlan, step: int) -> None:
        result = self.result
        if result.failed_at is None and step >= plan.fail_step:
            result.failed_at = time.time()
            self._operate(plan, step, "fail-nic", plan.device, "--mode", plan.mode)
        if result.recovered_at is None and step >= plan.recover_step - 1:
            self._await(lambda: self.admin.failed_over(plan.host), f"no failover on {plan.host}")
            result.recovered_at = time.time()
            self._operate(plan, step, "recover-nic", plan.device)
            self.job.open_gate(plan.recover_step)
        settle = plan.settle_step
        if result.recovered_at is not None and step >= settle - 1 and not self.job.gate_open(settle):
            self._await(lambda: self.admin.all_back(plan.host), "failovers without their failback")
            counts = {h: self.admin.delta(h) for h in self.lab.host_names}
            said = "; ".join(f"{h} {fo} failover(s), {fb} failback(s)" for h, (fo, fb) in counts.items())
            self.show(f"after step {step + 1}: shiftd counted: {said}")
            self.job.open_gate(settle)

    def _operate(self, plan: FaultPlan, step: int, *command: str) -> None:
        """`shiftctl COMMAND` on the plan's host, or its admin request from here (plan.via)."""
        self.show(f"after step {step + 1}: {plan.host}$ shiftctl {' '.join(command)}")
        if plan.via == "shiftctl":
            answer = records.shiftctl(self.lab, plan.host, *command)
        elif command[0] == "fail-nic":
            answer = self.admin.fail_nic(plan.host, plan.device, plan.mode)
        else:
            answer = self.admin.recover_nic(plan.host, plan.device)
        self.show(answer.strip())

    def _await(self, done: Callable[[], bool], otherwise: str) -> None:
        """Wait until shiftd's counts say `done`; a problem of the run when they do not in time."""
        if not self.admin.wait(done, SWITCH_TIMEOUT):
            self.result.problems.append(f"after {SWITCH_TIMEOUT:g}s: {otherwise}, by shiftd's counts")
