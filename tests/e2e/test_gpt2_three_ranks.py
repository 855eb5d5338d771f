"""The GPT-2 job with three ranks on a 3x2 lab: h0's NIC fails under a ring where h0 both sends (to h1)
and receives (from h2); the job ends with the weights of a run without a failure."""

import gpt2_checks
import pytest
from labs import running_lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]


def test_three_ranks_survive_a_failure(tmp_path):
    with running_lab("gdt", hosts=3, nics=2) as lab:
        reference = gpt2_checks.run(lab, tmp_path / "reference")
        gpt2_checks.check_reference(reference)
        result = gpt2_checks.run(lab, tmp_path / "failure", gpt2_checks.PLAN)
    gpt2_checks.check_survived(result, reference, detector="nic_event")
