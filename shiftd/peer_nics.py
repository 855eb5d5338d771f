"""Peer hosts' NICs as their own shiftd published them in etcd (`nics/<host>/<device>`), followed by a watch.

A QP whose peer has lost every NIC the QP could use has no path left, but from this side only its ack
deadline would say so: seconds late, and never on a side that only receives. The peer's shiftd has said it
already, in its NIC records. Following them, this daemon tells its agents when a peer's NIC goes down or
comes back, as a NicEvent with the peer's host and the NIC's GID; each agent judges its own QPs
(libshift/shift/lost.py). A NIC whose GID changed (re-addressed, as after a repair) is told too, with the
GID it had: the agents' QPs reconnect their paths to it at the new one (libshift/shift/readdress.py). A
record deleted (its shiftd stopped, or its lease lapsed) says nothing of the links: it is forgotten, not
taken for a failure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from google.protobuf import json_format

from libshift.api.shift.v1 import common_pb2
from shiftd.nic import gid_replaced
from shiftd.registry import Registry
from shiftd.registry_watch import PUT

log = logging.getLogger("shiftd.peer_nics")
PREFIX = "nics/"


class PeerNics:
    """The peers' NIC records; `run()` follows them and calls `tell` with each change of a NIC's state."""

    def __init__(self, registry: Registry, host: str, tell: Callable[[common_pb2.NicEvent], None]) -> None:
        self.registry, self.host, self.tell = registry, host, tell
        self.records: dict[tuple[str, str], common_pb2.Nic] = {}  # (host, device) -> its record
        # (host, device) -> its last GID: kept while it has none (between an address deleted and the next)
        # and across its record's deletion (a shiftd restarted), to tell what a new GID replaces
        self.gids: dict[tuple[str, str], str] = {}

    def down(self) -> list[common_pb2.NicEvent]:
        """The peers' NICs that are not UP now: what a new agent stream hears after our own NICs."""
        return [
            event(host, nic, nic.state)
            for (host, _), nic in sorted(self.records.items())
            if nic.state != common_pb2.NIC_STATE_UP
        ]

    async def run(self) -> None:
        """Follow the records until cancelled (the watch resumes across etcd's outages by itself)."""
        async for change in self.registry.watch_prefix(PREFIX, resync=True):
            host, _, device = change.key[len(PREFIX) :].partition("/")
            if host == self.host or not device:
                continue
            if change.type != PUT or change.value is None:
                self.records.pop((host, device), None)
                continue
            try:
                nic = json_format.Parse(change.value, common_pb2.Nic(), ignore_unknown_fields=True)
            except json_format.ParseError:
                log.warning("the record of %s's NIC %s in etcd is not readable; ignored", host, device)
                continue
            known = self.records.get((host, device))
            self.records[host, device] = nic
            previous = known.state if known is not None else common_pb2.NIC_STATE_UP
            previous_gid = self._gid_replaced(host, device, nic.gid)
            if nic.state != previous or previous_gid:
                self.tell(event(host, nic, previous, previous_gid))

    def _gid_replaced(self, host: str, device: str, gid: str) -> str:
        """The GID that `gid` replaces on the peer's NIC, or "" when it replaces none."""
        last = self.gids.get((host, device), "")
        self.gids[host, device] = gid or last
        return gid_replaced(last, gid)


def event(host: str, nic: common_pb2.Nic, previous: int, previous_gid: str = "") -> common_pb2.NicEvent:
    """A peer's NIC record as the event agents hear (with the GID it had, when that changed: a QP's
    path to the NIC must go to its new GID)."""
    return common_pb2.NicEvent(
        host=host,
        device=nic.device,
        netdev=nic.netdev,
        state=nic.state,
        previous_state=previous,
        reason=nic.reason,
        time_unix_nanos=nic.last_change_unix_nanos,
        gid=nic.gid,
        previous_gid=previous_gid,
    )
