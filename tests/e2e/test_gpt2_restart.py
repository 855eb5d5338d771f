"""When a host loses every path, no failover can save the job: both ranks raise NoPathLeft, torchrun
(`--max-restarts`) restarts them once the NICs are back, and the job resumes from its last checkpoint
(train.py --checkpoint-every) to end with the weights of a run that was never stopped, bit for bit."""

import pytest
from job import Job, JobSpec
from labs import running_lab
from records import shiftctl
from waiting import wait_until

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]

# steps enough to be running through both faults (at step 300, then 50 steps on) and the ranks' restart;
# each one is paid twice (the reference too): 1500 took 106 s of CI's run
SPEC = JobSpec(model="tiny", steps=900, checkpoint_every=100, max_restarts=1)
JOB_TIMEOUT = 300.0


def progressed(job: Job, steps: int) -> bool:
    job.refresh()
    return job.logs[0].last_step >= steps


def said(job: Job, words: str) -> bool:
    return all(words in (job.out / f"{host}.log").read_text(errors="replace") for host in job.lab.host_names)


def test_a_job_that_lost_every_path_is_restarted_from_its_checkpoint(tmp_path):
    with running_lab("gr", hosts=2, nics=2) as lab:
        reference = Job(lab, SPEC, tmp_path / "reference")
        reference.start()
        assert reference.wait(JOB_TIMEOUT) == {"h0": 0, "h1": 0}
        job = Job(lab, SPEC, tmp_path / "restarted")
        job.start()
        try:
            assert wait_until(lambda: progressed(job, 300), timeout=JOB_TIMEOUT)
            shiftctl(lab, "h0", "fail-nic", "mlx5_0")
            at = job.logs[0].last_step
            assert wait_until(lambda: progressed(job, at + 50), timeout=60)  # on mlx5_1
            shiftctl(lab, "h0", "fail-nic", "mlx5_1")
            assert wait_until(lambda: said(job, "NoPathLeft"), timeout=30), "the ranks did not hear it"
        finally:
            shiftctl(lab, "h0", "recover-nic", "mlx5_0")
            shiftctl(lab, "h0", "recover-nic", "mlx5_1")
        assert job.wait(JOB_TIMEOUT) == {"h0": 0, "h1": 0}
    assert said(job, "h0's mlx5_0 is down") and said(job, "h0's mlx5_1 is down")
    for rank, (log, ref) in enumerate(zip(job.logs, reference.logs, strict=True)):
        starts = [r for r in log.records if r.get("event") == "start"]
        assert len(starts) == 2 and starts[0]["from"] == 0, starts
        resumed, every = starts[1]["from"], SPEC.checkpoint_every  # the last checkpoint before the loss
        assert at // every * every <= resumed < SPEC.steps and resumed % every == 0, (rank, at, resumed)
        assert log.event("end")["digest"] == ref.event("end")["digest"], f"rank {rank}: the weights differ"
