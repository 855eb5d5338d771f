"""The peer's backup QPs of a ShiftQP, looked up through the agent along the chain the peer published."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from libshift.agent import AgentError
from libshift.shift.paths import BACKUP
from libshift.verbs import Endpoint

if TYPE_CHECKING:
    from libshift.shift.qp import ShiftQP

log = logging.getLogger("libshift.shift")
PEER_WAIT = 10.0  # how long connect waits for the peer's backup to be published


def peer_backups(qp: ShiftQP) -> dict[str, Endpoint]:
    """The peer's backup QPs by path, looked up along its chain from the default endpoint the application
    gave us, as deep as both sides have backups."""
    found: dict[str, Endpoint] = {}
    agent = qp.ctx.agent
    if BACKUP not in qp.qps or qp.remote is None or agent is None:
        return found
    end, wait = qp.remote, PEER_WAIT
    for path in qp.ctx.backups:
        try:
            peer = agent.lookup_qp(end.gid, end.qpn, wait=wait)
        except AgentError as exc:
            log.warning("QP %d: peer %s lookup failed (%s)", qp.qp_num, path, exc)
            break
        if peer is None:
            if path == BACKUP:
                log.warning("QP %d: the peer published no backup QP; no failover for it", qp.qp_num)
            break
        found[path], end, wait = peer, peer, 0.0  # the deeper links were published first
    return found
