"""Which failover reports shiftd has counted, so that a report sent again counts once; and how many an
agent dropped, so that the drops are counted once too.

An agent numbers its reports (instance id + a sequence number that only grows) and sends them one at a time,
in order, until shiftd acknowledges each; after a lost answer or a reconnect it sends the unacknowledged
ones again. So the highest number seen per agent instance is all there is to keep: anything at or below it
is a repeat. Reports the agent had to drop (its queue was full while shiftd was away) never come; the agent
says how many it ever dropped with each register and report, and the increase is what is new. The instance
outlives the agent's registrations (a registration ends with its connection), so the record is kept per
instance, for the most recent MAX_INSTANCES of them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

MAX_INSTANCES = 4096


@dataclass
class _Heard:
    seq: int = 0  # the highest report number counted
    dropped: int = 0  # the highest drop count told


class SeenReports:
    def __init__(self, limit: int = MAX_INSTANCES) -> None:
        self._limit = limit
        self._heard: OrderedDict[tuple[int, str], _Heard] = OrderedDict()  # (pid, instance) ->

    def first_time(self, pid: int, instance: str, seq: int) -> bool:
        """Whether report `seq` of the agent instance is new (and remember it); seq 0 has no id: always new.

        The caller's pid is part of the key: another process cannot silence an agent's reports."""
        if seq == 0:
            return True
        heard = self._heard_from(pid, instance)
        new = seq > heard.seq
        heard.seq = max(heard.seq, seq)
        return new

    def newly_dropped(self, pid: int, instance: str, dropped: int) -> int:
        """The agent instance has dropped `dropped` reports in all: how many of them were not told before."""
        heard = self._heard_from(pid, instance)
        new = max(0, dropped - heard.dropped)
        heard.dropped = max(heard.dropped, dropped)
        return new

    def _heard_from(self, pid: int, instance: str) -> _Heard:
        key = (pid, instance)
        heard = self._heard.setdefault(key, _Heard())
        self._heard.move_to_end(key)  # a repeat, too, says the instance is alive
        while len(self._heard) > self._limit:
            self._heard.popitem(last=False)
        return heard
