"""Property: whatever the fault schedule, every message of a stream arrives exactly once and in order.

Hypothesis draws a schedule (one or two faults on mlx5_0: which host, which mode, recovered before the
next fault, after the last one or never, and how far into the stream the first one lands) and runs it
against a short SEND/RECV stream on the lab fabric. A handful of examples, and one written out (each
host's NIC fails, then they recover one after the other); no shrinking (each draw is a real stream of
a few seconds): a failing draw is printed as it was.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from stream_harness import (
    FEW_REAL_EXAMPLES,
    HOSTS,
    Step,
    Stream,
    assert_intact,
    fault_steps,
    nic_fault,
    recover_everything,
    switches,
    wait_nic_state,
)

from shiftlab.lab import Lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(400)]


schedules = st.tuples(st.sampled_from([50, 300, 800]), st.lists(fault_steps(), min_size=1, max_size=2))


class Schedule:
    """Carries out a drawn plan against a running stream, following which hosts' mlx5_0 is failed, and
    waits for the sender's QP to switch whenever the plan makes it (first failure, last recovery)."""

    def __init__(self, lab: Lab, stream: Stream) -> None:
        self.lab, self.stream = lab, stream
        self.down: set[str] = set()
        self.since = time.time()
        self.switches = 0  # switches of the stream so far: each shiftd is told of each

    def fail(self, step: Step) -> None:
        nic_fault(step.host, step.mode, period=0.4 if step.mode == "flap" else 0.0).inject(self.lab)
        if not self.down:
            assert self.stream.sender.read("state")["state"] == "fallback"
            self.switches += 1
        self.down.add(step.host)
        time.sleep(0.3)  # traffic on the backup

    def recover(self, step: Step) -> None:
        nic_fault(step.host).recover(self.lab)
        self.down.discard(step.host)
        if not self.down:  # both sides' default NIC is back: the stream fails back
            assert self.stream.sender.read("state", timeout=15)["state"] == "default"
            self.switches += 1
            for host in HOSTS:  # both sides finished it, so both re-armed the backup
                switches(self.lab, host, self.since, wait_for=self.switches)
            time.sleep(0.3)
            return
        wait_nic_state(self.lab, step.host, "mlx5_0", "NIC_STATE_UP")
        time.sleep(1.0)  # the recovered side tries the default path while the peer's is still down

    def run(self, plan: list[Step]) -> None:
        for step in plan:
            self.fail(step)
            if step.recover == "next":
                self.recover(step)
        for step in plan:
            if step.recover == "end" and step.host in self.down:
                self.recover(step)


@FEW_REAL_EXAMPLES
@example(schedule=(300, [Step("h0", "down", "end"), Step("h1", "blackhole", "end")]))
@given(schedule=schedules)
def test_every_fault_schedule_keeps_the_stream_exactly_once_in_order(
    lab: Lab, schedule: tuple[int, list[Step]]
) -> None:
    at, plan = schedule
    try:
        with Stream(lab, "send", sender_args=("--progress", str(at))) as stream:
            state = Schedule(lab, stream)
            state.run(plan)
            sent, received = stream.finish()
    finally:
        recover_everything(lab)
    assert_intact(sent, received)
    final = "fallback" if state.down else "default"
    assert sent["finals"] == [final] and received["finals"] == [final], (sent, received)
    assert len(sent["states"]) <= 2 * len(plan), sent  # no ping-pong between the NICs
