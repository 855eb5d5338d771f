"""libshift.reportqueue: the agent's failover reports until shiftd acknowledges them."""

import threading

from libshift.reportqueue import ReportQueue


def test_reports_are_numbered_and_leave_only_when_acknowledged():
    queue = ReportQueue()
    assert [queue.put("a"), queue.put("b"), queue.put("c")] == [1, 2, 3]
    assert queue.oldest() == [(1, "a")]
    assert queue.oldest() == [(1, "a")]  # not acknowledged: the same one again
    assert queue.oldest(2) == [(1, "a"), (2, "b")]
    queue.ack(0)  # before the oldest: nothing leaves
    assert len(queue) == 3
    queue.ack(2)  # every report up to 2
    assert queue.oldest(5) == [(3, "c")]
    queue.ack(3)
    assert len(queue) == 0 and queue.oldest(timeout=0.01) == []


def test_the_newest_report_is_known_as_the_last_of_its_burst():
    """The reporter sends where every QP runs with the last report of a burst only."""
    queue = ReportQueue()
    first, second = queue.put("a"), queue.put("b")
    assert not queue.last(first) and queue.last(second)
    queue.ack(first)
    assert queue.last(second)
    queue.ack(second)
    assert not queue.last(second)  # gone: nothing is last


def test_past_the_bound_the_oldest_goes_and_is_counted():
    queue = ReportQueue(bound=2)
    for item in "abcd":
        queue.put(item)
    assert queue.dropped == 2
    assert queue.oldest(4) == [(3, "c"), (4, "d")]
    queue.ack(1)  # the sender's ack of a report the bound dropped meanwhile: the rest stays
    assert queue.oldest() == [(3, "c")]


def test_a_waiting_sender_wakes_for_a_report_and_for_close():
    queue = ReportQueue()
    got = []
    sender = threading.Thread(target=lambda: got.append(queue.oldest(timeout=5)))
    sender.start()
    queue.put("a")
    sender.join(timeout=5)
    assert got == [[(1, "a")]]
    assert not queue.wait_empty(0.01)
    queue.ack(1)
    assert queue.wait_empty(0.01)
    closer = threading.Thread(target=lambda: got.append(queue.oldest(timeout=5)))
    closer.start()
    queue.close()
    closer.join(timeout=5)
    assert got[-1] == [] and not closer.is_alive()
