"""GPT-2 trained with DDP over the "shift" backend on a 2x2 lab survives a NIC failure: the job sees no
error, shiftd counts the failover and the failback, and the final weights are bitwise those of a run
without a failure. One lab and one reference run serve the module; every run recovers its NIC.

In the ring each rank writes to the next and hears credits back, so with two ranks both hosts send
and receive; "sender side" is the failure on h0, where shiftd's NIC event reaches the agent, and
"receiving side" the failure on h1, of which h0 learns only by its peer's notification.
"""

from dataclasses import replace

import gpt2_checks
import pytest
from labs import running_lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def lab():
    with running_lab("gd", hosts=2, nics=2) as lab:
        yield lab


@pytest.fixture(scope="module")
def reference(lab, tmp_path_factory):
    result = gpt2_checks.run(lab, tmp_path_factory.mktemp("reference"))
    gpt2_checks.check_reference(result)
    return result


@pytest.mark.parametrize(
    ("host", "mode"),
    [("h0", "down"), ("h1", "down"), ("h0", "blackhole")],
    ids=["sender-side", "receiving-side", "blackhole"],
)
def test_failure_changes_nothing_the_job_computes(lab, reference, tmp_path, host, mode):
    plan = replace(gpt2_checks.PLAN, host=host, mode=mode)
    result = gpt2_checks.run(lab, tmp_path, plan)
    gpt2_checks.check_survived(result, reference, detector="nic_event")
