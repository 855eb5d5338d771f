"""libshift.shift: verbs objects that survive a NIC failure by moving to a backup NIC of the same host.

Use them as the plain verbs objects: `ShiftContext(name="mlx5_0")`, `ShiftPD(ctx)`,
`ShiftMR(pd, n, access)`, `ShiftCQ(ctx, cqe[, channel=ShiftCompChannel(ctx)])`,
`ShiftQP(pd, QPInitAttr(...))`, `qp.connect(peer_endpoint, attr)`. See docs/failover.md.
"""

from libshift.shift.context import ShiftContext
from libshift.shift.cq import ShiftCompChannel, ShiftCQ
from libshift.shift.memory import ShiftMR, ShiftPD
from libshift.shift.qp import ShiftQP
from libshift.shift.states import State

__all__ = ["ShiftCQ", "ShiftCompChannel", "ShiftContext", "ShiftMR", "ShiftPD", "ShiftQP", "State"]
