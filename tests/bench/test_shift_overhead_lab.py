"""A blocking wait on a ShiftCompChannel makes its completion on the waiting thread, as a bare channel does.

Before, the completion went provider channel -> watcher thread -> shift channel -> application: two thread
hops per completion. Now the waiting thread leads: it waits on the default path's provider channel itself
and makes the pass there, in C (fast_chan.c); the watcher keeps off while it does.

The probe (this file run as a script inside lab host h0, with its shiftd) connects two shift QPs of one
context to each other, so that both ends are real shift QPs with backups, and records which receive
completions another thread made ready on the waiting side's ShiftCQ: a watcher's pass of progress (the
context's, in Python, seen by wrapping it) that released one there. The waiter's own passes are in C and
not seen; every completion no other thread released was the waiter's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.lab, pytest.mark.timeout(180)]
ROUNDS = 10


@pytest.fixture(scope="module")
def lab() -> Iterator:
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from labs import running_lab

    with running_lab("ov", hosts=2, nics=2) as lab:
        yield lab


def test_a_blocking_wait_makes_its_completion_on_the_waiting_thread(lab) -> None:
    argv, env = lab.exec_command("h0", [sys.executable, __file__])
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["resilient"] and result["received"] == ROUNDS
    # a round may still meet the watcher on its way off the channel; before, none was made by the waiter
    assert result["on_waiter"] >= ROUNDS * 0.8, result


def probe() -> dict[str, object]:
    from libshift.shift import ShiftCompChannel, ShiftContext, ShiftCQ, ShiftMR, ShiftPD, ShiftQP
    from libshift.verbs import SGE, QPAttr, QPCap, QPInitAttr, RecvWR, SendWR
    from libshift.verbs import enums as e

    access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
    ctx = ShiftContext(name="mlx5_0")
    pd = ShiftPD(ctx)
    mr = ShiftMR(pd, 64, access)
    sg = [SGE(mr.buf, 8, mr.lkey)]
    channel = ShiftCompChannel(ctx)
    send_cq, recv_cq = ShiftCQ(ctx, 64), ShiftCQ(ctx, 64, channel=channel)
    cap = QPCap(max_send_wr=64, max_recv_wr=64)
    a, b = (ShiftQP(pd, QPInitAttr(scq=cq, rcq=cq, cap=cap)) for cq in (send_cq, recv_cq))
    attr = {"qp_access_flags": access, "timeout": 15, "retry_cnt": 3}  # connect() fills in a QPAttr: one each
    connecting = threading.Thread(target=a.connect, args=(b.endpoint(), QPAttr(**attr)))
    connecting.start()
    b.connect(a.endpoint(), QPAttr(**attr))
    connecting.join()
    makers: list[int] = []
    progress = ctx.progress

    def noted_progress(everything: bool = False) -> None:
        before = recv_cq.fast.ready
        progress(everything)
        if recv_cq.fast.ready > before:
            makers.append(threading.get_ident())

    ctx.progress = noted_progress  # type: ignore[method-assign]
    received: list[int] = []

    def waiter() -> None:
        while len(received) < ROUNDS:
            got = recv_cq.poll(1)[1]
            if got:
                received.append(got[0].wr_id)
                continue
            recv_cq.req_notify()
            if not recv_cq.poll(1)[0]:
                try:
                    channel.get_cq_event(timeout=1.0)
                except TimeoutError:
                    continue
            else:
                received.append(-1)  # one came between the poll and the arming: not a wait's

    for n in range(ROUNDS):
        b.post_recv(RecvWR(wr_id=n, sg=sg))
    thread = threading.Thread(target=waiter)
    thread.start()
    for n in range(ROUNDS):
        time.sleep(0.05)  # the waiter is in get_cq_event by now
        a.post_send(SendWR(wr_id=n, opcode=e.IBV_WR_SEND, sg=sg))
    thread.join(timeout=30)
    while send_cq.poll(ROUNDS)[0]:
        pass
    ctx.close()
    on_waiter = len(received) - sum(ident != thread.ident for ident in makers)
    return {"resilient": ctx.resilient, "received": len(received), "on_waiter": on_waiter}


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[2]))
    print(json.dumps(probe()), flush=True)
