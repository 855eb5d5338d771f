"""ShiftPD and ShiftMR: protection domains and memory regions with a twin on each backup device.

A backup MR registers the same memory as the default one, so all keys address one buffer and a WR moved
to a backup path needs only its keys translated, never its addresses.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Protocol

from libshift.agent import AgentError
from libshift.shift.paths import PRIMARY
from libshift.verbs import MR, PD, Buffer

if TYPE_CHECKING:
    from libshift.shift.context import ShiftContext

log = logging.getLogger("libshift.shift")


class LkeyMap(Protocol):
    """A backup path's lkeys: the default path's lkey -> its MR's twin's on that path. The context's live in
    the core's fast path (FastContext.lkeys), which translates its posts on a backup path with them."""

    def __setitem__(self, lkey: int, path_lkey: int) -> None: ...
    def __contains__(self, lkey: int) -> bool: ...
    def get(self, lkey: int, default: int | None = None) -> int | None: ...
    def pop(self, lkey: int, default: int | None = None) -> int | None: ...


def register_twins(
    pds: dict[str, PD],
    length: int,
    access: int,
    lkeys: dict[str, LkeyMap],
    buffer: Buffer | None = None,
) -> dict[str, MR]:
    """One buffer registered in the PD of every path (path -> MR): new memory, or `buffer`, on the default
    path, and that same memory on the others, each of whose lkeys goes in `lkeys[path]` under the default
    lkey, for the WRs that a switch moves onto that path."""
    primary = MR(pds[PRIMARY], length, access, buffer)
    on = {PRIMARY: primary}
    for path, pd in pds.items():
        if path != PRIMARY:
            on[path] = MR(pd, length, access, buffer=primary.view)
            lkeys[path][primary.lkey] = on[path].lkey
    return on


def deregister_twins(on: dict[str, MR], lkeys: dict[str, LkeyMap]) -> None:
    """Undo register_twins: the lkeys forgotten, the MRs closed, the default's last."""
    lkey = on[PRIMARY].lkey
    for path, mr in reversed(on.items()):
        if path != PRIMARY:
            lkeys[path].pop(lkey, None)
        mr.close()


class ShiftPD:
    """A PD on each device: `on[path]`; `primary` is the default device's."""

    def __init__(self, ctx: ShiftContext) -> None:
        self.ctx = ctx
        self.on = {path: PD(device) for path, device in ctx.devices.items()}
        self.primary = self.on[PRIMARY]

    def close(self) -> None:
        for pd in reversed(self.on.values()):
            pd.close()


class ShiftMR:
    """One buffer registered on every device: the default keys are the application's; each backup's keys
    are published through shiftd as the backup of the keys before them (the backup's keys as those of the
    default ones, the backup's backup's as those of the backup's), so that the peer can translate its
    rkey after a switch. The buffer is new memory, or the application's own (`buffer`, as with MR)."""

    def __init__(self, pd: ShiftPD, length: int, access: int, buffer: Buffer | None = None) -> None:
        self.pd = pd
        self.on = register_twins(pd.on, length, access, pd.ctx.lkeys, buffer)
        self.primary = self.on[PRIMARY]
        if len(self.on) > 1:
            self._publish()

    def _links(self) -> list[tuple[str, str]]:
        """(path, its backup path) pairs, the deepest first: a peer that finds a link finds those after it."""
        return list(reversed(list(itertools.pairwise(self.on))))

    def _publish(self) -> None:
        ctx = self.pd.ctx
        assert ctx.agent is not None
        try:
            for path, backup in self._links():
                ctx.agent.publish_mr(
                    ctx.devices[path].query_gid(),
                    self.on[path].rkey,
                    ctx.devices[backup].query_gid(),
                    self.on[backup].rkey,
                )
        except AgentError as exc:
            log.warning(
                "MR rkey %#x: backup keys not published (%s); peers cannot fail over onto it", self.rkey, exc
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
        if len(self.on) > 1 and ctx.agent is not None:
            try:
                for path, _ in self._links():
                    ctx.agent.withdraw_mr(ctx.devices[path].query_gid(), self.on[path].rkey)
            except AgentError as exc:
                log.warning("MR rkey %#x: backup keys not withdrawn (%s)", self.rkey, exc)
        deregister_twins(self.on, ctx.lkeys)
