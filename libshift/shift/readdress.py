"""A peer's NIC back with another GID: the paths of our QPs to it reconnect to the new one.

A NIC repaired or replaced often comes back with another address, and on RoCE its GID follows the address.
A QP's path to it still names the old GID, so re-arming the path (the failback, a backup's re-arm) would
connect to an address that is gone, and the traffic would never come home. shiftd follows the peer's own
record in etcd and tells the agent the GID the NIC had and the one it has now (shiftd/peer_nics.py); each
path to the old GID is then pointed at the new one, for its next arm. The application's own view of the
peer (`qp.remote`) is left as it connected: it names the peer, not a route to it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from libshift.notices import NicChange

if TYPE_CHECKING:
    from libshift.shift.context import ShiftContext

log = logging.getLogger("libshift.shift")


def follow_peer_readdress(ctx: ShiftContext, change: NicChange) -> None:
    """The agent's stream thread: a peer's NIC changed; when its GID did, our paths to it follow."""
    if not change.previous_gid or change.previous_gid == change.gid:
        return
    with ctx.lock:
        qps = set(ctx.qps.values())
    moved = 0
    for qp in qps:
        with ctx.lock:
            for path, peer in qp.peers.items():
                if peer.gid == change.previous_gid:
                    qp.peers[path] = dataclasses.replace(peer, gid=change.gid)
                    moved += 1
    if moved:
        log.info("%s's %s now has GID %s (was %s): %d path(s) of our QPs to it follow", change.host,
                 change.device, change.gid, change.previous_gid, moved)  # fmt: skip
