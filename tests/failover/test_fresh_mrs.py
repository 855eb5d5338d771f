"""An application that registers memory per message fails over as one with fixed buffers does.

The receiver registers a fresh MR for every message and deregisters it once the sender's write has landed
(fresh_mr_peer.py), so the sender writes to ever new rkeys, most of them withdrawn by the time a background
lookup of their backup key runs. h0's NIC fails midway. Before keys.py bounded and shortened those lookups,
they queued up 5 s apiece, the switch's own lookup of a live key timed out behind them, and its write went
to the backup with the default path's rkey (IBV_WC_REM_ACCESS_ERR or RETRY_EXC_ERR), seconds later.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from stream_harness import nic_fault, wait_all_up

from shiftlab.lab import Lab
from shiftlab.labproc import LabProcess

pytestmark = [pytest.mark.lab, pytest.mark.timeout(360)]

PEER = str(Path(__file__).with_name("fresh_mr_peer.py"))
# The switch is what the test is for: it meets the lookups queued by the messages before it, whatever
# their number. The messages after it, each a gRPC lookup, publication and withdrawal on the backup, cost
# the time (3000 with the fault at 1000 took 122 s of CI's run; 1000 at 500, a third of it).
COUNT = 1000
FAIL_AT = 500  # the receiver's progress line after which h0's NIC fails
# beyond a peer's own GIVE_UP (60 s without a completion), so that it reports what it saw; and beyond the
# messages after the fault in CI's slowest hours: speed is the benchmarks' business, a hang this test's
READ_WAIT = 150
SHIFTD_TAIL = 6000


def test_a_fresh_mr_per_message_survives_fail_nic(lab: Lab, tmp_path: Path) -> None:
    wait_all_up(lab)
    logs = {host: tmp_path / f"{host}.stderr" for host in ("h0", "h1")}  # whole: a hung peer's stacks
    receiver = LabProcess(lab, "h1", [sys.executable, PEER, "receiver", str(COUNT)], stderr_file=logs["h1"])
    sender = LabProcess(lab, "h0", [sys.executable, PEER, "sender", str(COUNT)], stderr_file=logs["h0"])
    fault = nic_fault("h0")
    injected = failed = False
    try:
        ends = sender.read("endpoints"), receiver.read("endpoints")
        sender.send(**ends[1])
        receiver.send(**ends[0])
        for peer in (sender, receiver):
            assert peer.read("connected")["resilient"] is True
        receiver.send(go=True)
        sender.send(go=True)
        while receiver.read("progress")["progress"] < FAIL_AT:
            pass
        fault.inject(lab)
        injected = True
        # the sender first: it ends at an error completion, which would leave the receiver waiting
        sent, received = sender.read("done", timeout=READ_WAIT), receiver.read("done", timeout=READ_WAIT)
        assert sent == {"done": True, "errors": [], "failed": []}
        assert received == {"done": True, "errors": [], "failed": []}
    except BaseException:
        failed = True
        raise
    finally:
        for peer in (sender, receiver):
            peer.end(grace=0)
        if failed:  # shown by pytest with the failure: both sides' steps, and their shiftds'
            for host, log in logs.items():
                print(f"--- {host} stderr:\n{log.read_text()}")
            for host in ("h0", "h1"):
                print(f"--- {host} shiftd.log (tail):\n{lab.log_path(host).read_text()[-SHIFTD_TAIL:]}")
        if injected:
            fault.recover(lab)
