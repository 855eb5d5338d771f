"""The GPT-2 example's parts that need no lab: data order, model, log reader, phases, weights check."""

import json
from pathlib import Path

import corpus
import report
import scenario
import torch
from job import JobSpec, RankLog
from model import GPT, PRESETS


def test_batches_depend_only_on_seed_step_and_rank():
    data = corpus.load()
    shape = {"world": 2, "per_rank": 3, "block": 16}
    x0, y0 = corpus.batch(data, seed=1, step=5, rank=0, **shape)
    again, _ = corpus.batch(data, seed=1, step=5, rank=0, **shape)
    other_rank, _ = corpus.batch(data, seed=1, step=5, rank=1, **shape)
    next_step, _ = corpus.batch(data, seed=1, step=6, rank=0, **shape)
    assert torch.equal(x0, again)
    assert not torch.equal(x0, other_rank) and not torch.equal(x0, next_step)
    assert torch.equal(x0[:, 1:], y0[:, :-1])  # targets are the inputs shifted by one byte
    assert x0.shape == (3, 16)


def test_model_loss_starts_near_uniform_over_bytes():
    torch.manual_seed(0)
    cfg = PRESETS["tiny"]
    x, y = corpus.batch(corpus.load(), seed=0, step=0, rank=0, world=1, per_rank=2, block=cfg.block_size)
    loss = GPT(cfg)(x, y)
    assert abs(loss.item() - torch.log(torch.tensor(256.0)).item()) < 0.3


def test_rank_log_reads_complete_lines_only(tmp_path):
    path = tmp_path / "rank0.jsonl"
    log = RankLog(path)
    assert log.refresh() == [] and log.last_step == -1  # not written yet
    path.write_text(json.dumps({"step": 0, "loss": 5.0}) + "\n" + '{"step": 1, "lo')
    log.refresh()
    assert log.last_step == 0
    with open(path, "a") as f:
        f.write('ss": 4.0}\n{"event": "end", "digest": "d"}\n')
    log.refresh()
    assert [s["step"] for s in log.steps] == [0, 1] and log.event("end") == {"event": "end", "digest": "d"}


def switch(kind: str, when: float) -> dict:
    return {"time_unix_nanos": str(int(when * 1e9)), "failover": {"kind": f"FAILOVER_KIND_{kind}"}}


def test_phases_split_by_the_failure_and_the_last_failback(tmp_path):
    plan = scenario.FaultPlan(fail_step=1, recover_step=3, settle_step=4)
    result = scenario.RunResult(out=tmp_path, spec=JobSpec(steps=6), plan=plan, failed_at=10.5)
    result.events = {
        "h0": [switch("FAILOVER", 10.6), switch("FAILBACK", 12.2)],
        "h1": [switch("FAILBACK", 13.5), {"time_unix_nanos": "14000000000", "nic": {}}],
    }
    steps = [{"step": i, "time": 9.0 + i, "step_time": 0.1} for i in range(6)]  # ends at 9, 10, ... 14
    phases = report.phases(result, steps)
    assert [[s["step"] for s in phases.of(p)] for p in report.PHASES] == [[0, 1], [2, 3, 4], [5]]


def save(path: Path, model: torch.nn.Module) -> Path:
    torch.save({"model": model.state_dict()}, path)
    return path


def test_weight_differences_sees_one_changed_bit(tmp_path):
    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"])
    a = save(tmp_path / "a.pt", model)
    assert report.weight_differences(a, save(tmp_path / "same.pt", model)) == []
    with torch.no_grad():
        w = model.ln_f.weight
        w.view(torch.int32)[0] ^= 1  # the lowest mantissa bit of one parameter
    assert report.weight_differences(a, save(tmp_path / "b.pt", model)) == ["ln_f.weight"]
