"""A QP with no path left: the judgment, and the words that reach the application.

A path can carry a QP's traffic while its device here is usable and the peer's NIC on it is not down. The
peer's NICs are known from shiftd, which follows the peer hosts' own records in etcd (shiftd/peer_nics.py)
and tells the agent when one goes down or comes back. When a QP has no path left, it gives up at once
(Switcher.give_up): its work requests flush to the application, and `qp.lost_paths` says which host lost
which NICs and why. Without this, the side whose own NICs are fine learnt it only from its ack deadline:
seconds later, as a retry error that names no host; and a side that only receives never did.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from libshift.notices import NicChange, NicState

if TYPE_CHECKING:
    from libshift.shift.context import ShiftContext
    from libshift.shift.qp import ShiftQP

log = logging.getLogger("libshift.shift")


def why_no_path(qp: ShiftQP, usable: Mapping[str, bool] | None = None) -> str | None:
    """Why none of the QP's paths can carry its traffic, naming each path's failed NIC; None while one can.
    `usable`: whether each path's device here can carry traffic, when known already (ShiftContext.usable
    asks the device's port)."""
    ctx = qp.ctx
    agent = ctx.agent
    here = (agent.host if agent is not None else "") or "this host"
    failed = []
    for path, peer in qp.peers.items():
        device = ctx.devices[path].name
        theirs = agent.peer_nic(peer.gid) if agent is not None else None
        if theirs is not None and theirs.state is NicState.DOWN:
            failed.append(f"{theirs.host}'s {theirs.device} is down ({theirs.reason or 'no reason given'})")
        elif not (usable[path] if usable is not None else ctx.usable(path)):
            mine = agent.nic(device) if agent is not None else None
            reason = mine.reason if mine is not None and mine.state is NicState.DOWN else "link lost"
            failed.append(f"{here}'s {device} is down ({reason})")
        else:
            return None
    return f"QP {qp.qp_num} has no path left to its peer: " + "; ".join(failed)


class PeerLoss:
    """The context's listener for peer hosts' NICs: a QP whose last path went with one gives up."""

    def __init__(self, ctx: ShiftContext) -> None:
        self.ctx = ctx

    def on_peer_nic(self, change: NicChange) -> None:
        """The agent's stream thread: a peer's NIC changed. Only a DOWN can leave a QP with no path.

        Each QP is judged first without the context's lock, with each device's usability asked once for
        all: a NIC of a peer host with 1,000 QPs to it is 1,000 judgments, nearly all "a path is left", and
        a lock taken and a port queried for each held the data path up for tens of milliseconds."""
        if change.state is not NicState.DOWN:
            return
        ctx = self.ctx
        with ctx.lock:
            qps = set(ctx.qps.values())
        usable = {path: ctx.usable(path) for path in ctx.devices}
        for qp in qps:
            if change.gid not in {peer.gid for peer in qp.peers.values()} or why_no_path(qp, usable) is None:
                continue
            with ctx.lock:  # one QP at a time, as the context's own NIC events go; judged again in there
                if not qp.states.live:
                    continue
                qp.switcher.follow_core()
                why = why_no_path(qp)
                if why is not None:
                    qp.switcher.give_up(why)
