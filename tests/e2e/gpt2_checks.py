"""What every failure scenario of the GPT-2 job must show, against the run without a failure."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import report
import scenario
from job import JobSpec

from shiftlab.lab import Lab

# a tiny model and few steps: seconds of training; "direct" spares a torch import per host (job.py)
SPEC = JobSpec(backend="shift", model="tiny", steps=24, batch=4, launcher="direct")
# the failure right after step 4, recovered before step 12, the failback settled before step 20:
# steps 5-11 run failed over, 20-23 on the default NICs again (the gates make it so on any machine)
PLAN = scenario.FaultPlan(fail_step=4, recover_step=12, settle_step=20, via="admin")
RUN_TIMEOUT = 240.0
_ports = itertools.count(29500)


def run(lab: Lab, out: Path, plan: scenario.FaultPlan | None = None) -> scenario.RunResult:
    return scenario.run(lab, replace(SPEC, port=next(_ports)), out, plan, timeout=RUN_TIMEOUT)


def check_reference(result: scenario.RunResult) -> None:
    assert result.ok, result.problems or result.returncodes
    assert all(counts == (0, 0) for counts in result.counts.values()), result.counts


def check_survived(result: scenario.RunResult, reference: scenario.RunResult, detector: str) -> None:
    """No error reached the script, shiftd counted the failover and the failback on every host (the
    failed host's agent by the NIC event, `detector`), steps ran on each side, and the final weights of
    every rank are bitwise those of the run without failure."""
    text = report.summary(result, reference, "the lab")
    assert result.ok, text
    for host in result.returncodes:
        assert "Traceback" not in (result.out / f"{host}.log").read_text(errors="replace"), host
    for host, (failovers, failbacks) in result.counts.items():
        assert failovers >= 1 and failbacks >= 1, f"{host}: {result.counts}\n{text}"
    switches = report.switches(result)
    failed_host = [s for s in switches if s["host"] == result.plan.host and not report.is_failback(s)]
    assert detector in {s["reason"] for s in failed_host}, text
    assert all(s["device"] == result.plan.device for s in switches if not report.is_failback(s)), text
    phases = report.phases(result, report.rank_steps(result))
    assert phases.during and phases.after, text
    assert report.weights_equal(result, reference), text
    assert report.digests(result) == report.digests(reference), text
    assert len(set(report.digests(result))) == 1, "the ranks ended with different weights"
