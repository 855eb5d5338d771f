"""Closing an object while another thread is inside a call on it: refused or ended, never a crash.

On rxe (the verbs provider over pyverbs) a QP closed under a post_recv crashed the process, and a channel
closed under get_cq_event had its wake-up pipe closed under the waiter (EBADF). ibverbs leaves the overlap
to the application; the provider serializes it: the call in progress finishes first, a later one is
refused with a VerbsError, and a wait on a closed channel ends at once (tcp: at its timeout).
"""

from __future__ import annotations

import errno
import threading
import time

from libshift.verbs import SGE, RecvWR, VerbsError


def test_closing_a_qp_while_another_thread_posts_receives(pair):
    b = pair.b
    outcome: list[BaseException] = []
    stop = threading.Event()

    def poster() -> None:
        while not stop.is_set():
            try:
                b.qp.post_recv(RecvWR(wr_id=1, sg=[SGE(b.mr.buf, 64, b.mr.lkey)]))
            except VerbsError as exc:  # a full queue (ENOMEM) is retried; the closed QP ends the loop
                if exc.error_code != errno.ENOMEM:
                    outcome.append(exc)
                    return
                b.cq.poll(16)

    thread = threading.Thread(target=poster)
    thread.start()
    time.sleep(0.2)
    b.qp.close()
    thread.join(timeout=2)
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert all(isinstance(exc, VerbsError) for exc in outcome), outcome


def test_closing_a_channel_while_another_thread_waits_on_it(pair):
    b = pair.b
    b.cq.req_notify()
    ended: list[BaseException | None] = []

    def waiter() -> None:
        try:
            b.channel.get_cq_event(timeout=3)
            ended.append(None)
        except (TimeoutError, VerbsError) as exc:
            ended.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.2)
    b.qp.close()
    b.cq.close()
    b.channel.close()
    thread.join(timeout=10)
    assert not thread.is_alive() and len(ended) == 1
