"""ShiftPD and ShiftMR: protection domains and memory regions with a twin on the backup device.

The backup MR registers the same memory as the default one, so both keys address one buffer and a WR moved
to the backup path needs only its keys translated, never its addresses.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from libshift.agent import AgentError
from libshift.verbs import MR, PD
from libshift.verbs.objects import Buffer

if TYPE_CHECKING:
    from libshift.shift.context import ShiftContext

log = logging.getLogger("libshift.shift")


class ShiftPD:
    """A PD on each device."""

    def __init__(self, ctx: ShiftContext) -> None:
        self.ctx = ctx
        self.primary = PD(ctx.primary)
        self.backup = PD(ctx.backup) if ctx.backup is not None else None

    def close(self) -> None:
        for obj in (self.backup, self.primary):
            if obj is not None:
                obj.close()


class ShiftMR:
    """One buffer registered on both devices: the default keys are the application's, the backup keys are
    published through shiftd so the peer can translate its rkey after a switch. The buffer is new memory, or
    the application's own (`buffer`, as with MR)."""

    def __init__(self, pd: ShiftPD, length: int, access: int, buffer: Buffer | None = None) -> None:
        self.pd = pd
        self.primary = MR(pd.primary, length, access, buffer)
        self.backup: MR | None = None
        if pd.backup is not None:
            self.backup = MR(pd.backup, length, access, buffer=self.primary.view)
            self._publish()

    def _publish(self) -> None:
        ctx, backup = self.pd.ctx, self.backup
        assert ctx.agent is not None and ctx.backup is not None and backup is not None
        ctx.lkeys[self.primary.lkey] = backup.lkey
        try:
            ctx.agent.publish_mr(
                ctx.primary.query_gid(), self.primary.rkey, ctx.backup.query_gid(), backup.rkey
            )
        except AgentError as exc:
            log.warning(
                "MR rkey %#x: backup key not published (%s); peers cannot fail over onto it", self.rkey, exc
            )

    buf = property(lambda self: self.primary.buf)
    length = property(lambda self: self.primary.length)
    lkey = property(lambda self: self.primary.lkey)
    rkey = property(lambda self: self.primary.rkey)
    access = property(lambda self: self.primary.access)
    view = property(lambda self: self.primary.view)

    def read(self, length: int, offset: int = 0) -> bytes:
        return self.primary.read(length, offset)

    def write(self, data: bytes, length: int | None = None, offset: int = 0) -> None:
        self.primary.write(data, length, offset)

    def close(self) -> None:
        ctx = self.pd.ctx
        if self.backup is not None and ctx.agent is not None:
            ctx.lkeys.pop(self.primary.lkey, None)
            try:
                ctx.agent.withdraw_mr(ctx.primary.query_gid(), self.primary.rkey)
            except AgentError as exc:
                log.warning("MR rkey %#x: backup key not withdrawn (%s)", self.rkey, exc)
            self.backup.close()
        self.primary.close()
