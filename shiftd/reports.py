"""Which failover reports shiftd has counted, so that a report sent again counts once.

An agent numbers its reports (instance id + a sequence number that only grows) and sends them one at a time,
in order, until shiftd acknowledges each; after a lost answer or a reconnect it sends the unacknowledged
ones again. So the highest number seen per agent instance is all there is to keep: anything at or below it
is a repeat. The instance outlives the agent's registrations (a registration ends with its connection),
so the record is kept per instance, for the most recent MAX_INSTANCES of them.
"""

from __future__ import annotations

from collections import OrderedDict

MAX_INSTANCES = 4096


class SeenReports:
    def __init__(self, limit: int = MAX_INSTANCES) -> None:
        self._limit = limit
        self._highest: OrderedDict[tuple[int, str], int] = OrderedDict()  # (pid, instance) -> seq

    def first_time(self, pid: int, instance: str, seq: int) -> bool:
        """Whether report `seq` of the agent instance is new (and remember it); seq 0 has no id: always new.

        The caller's pid is part of the key: another process cannot silence an agent's reports."""
        if seq == 0:
            return True
        key = (pid, instance)
        highest = self._highest.get(key, 0)
        self._highest[key] = max(highest, seq)
        self._highest.move_to_end(key)  # a repeat, too, says the instance is alive
        while len(self._highest) > self._limit:
            self._highest.popitem(last=False)
        return seq > highest
