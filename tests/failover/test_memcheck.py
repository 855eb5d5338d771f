"""A failover over the C core is clean under valgrind's memcheck: the sender of a stream (peer.py) runs
under memcheck on h0, its NIC fails in the middle, the stream goes on over the backup and arrives intact.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from memcheck import clean, memcheck
from stream_harness import PEER, Peer, assert_intact, nic_fault, wait_all_up

from shiftlab.lab import Lab
from shiftlab.labproc import LabProcess

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(240)]

PATIENCE = 100.0  # seconds a memcheck'd step may take: the interpreter runs some 30 times slower under it


def test_a_failover_is_memcheck_clean(lab: Lab, tmp_path: Path) -> None:
    log = tmp_path / "memcheck.log"
    wait_all_up(lab)
    stream = ("sender", "--mode", "send", "--rate", "200", "--progress", "20")  # slow enough for memcheck
    sender = LabProcess(lab, "h0", [*memcheck(log), sys.executable, PEER, *stream], timeout=PATIENCE)
    receiver = Peer(lab, "h1", "receiver", "--mode", "send")
    fault = nic_fault("h0")
    injected = False
    try:
        ends = sender.read("endpoints"), receiver.read("endpoints", timeout=PATIENCE)
        sender.send(**ends[1])
        receiver.send(**ends[0])
        for peer in (sender, receiver):
            assert peer.read("connected", timeout=PATIENCE)["resilient"] is True
        receiver.send(go=True)
        sender.send(go=True)
        sender.read("progress")
        fault.inject(lab)
        injected = True
        assert sender.read("state")["state"] == "fallback"
        time.sleep(2)  # traffic on the backup path
        sender.send(stop=True)
        sent = sender.read("done")
        receiver.send(stop=True, expect=sent["completed"])
        received = receiver.read("done")
        assert_intact(sent, received)
        assert receiver.end() == 0, receiver.stderr()
        assert sender.end(grace=PATIENCE) == 0, sender.stderr() + log.read_text()
        assert clean(log), log.read_text()
    finally:
        sender.end(grace=0)
        receiver.end(grace=0)
        if injected:
            fault.recover(lab)
