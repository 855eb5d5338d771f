"""The error completion in doubt of one ShiftQP: one that may be the transport's or the application's.

detect.py says which status can be either (rxe's LOC_QP_OP_ERR) and why. On a device that still looks usable
the QP holds such an error, and the error completions of its path behind it (the flushes), until the
context's scan settles it: the transport's once the device fails (the QP moves, and what it held is rewound
with the rest), the application's after EITHER_GRACE (the QP breaks, and what it held surfaces in order, as
the provider reported it). Nothing waits under the context's lock meanwhile: its other QPs go on.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from libshift.shift.detect import EITHER_GRACE, Verdict, reconsider, surfaces
from libshift.verbs import WC

if TYPE_CHECKING:
    from libshift.shift.qp import ShiftQP
    from libshift.shift.rewind import Entry

log = logging.getLogger("libshift.shift")


class Doubt:
    """The doubt of one QP: on `path` until `until`, with the provider's completions it holds."""

    def __init__(self, qp: ShiftQP) -> None:
        self.qp = qp
        self.path: str | None = None  # None: no doubt
        self.until = 0.0
        self._held: list[tuple[Entry, WC]] = []

    def on(self, path: str) -> bool:
        return self.path == path

    def hold(self, entry: Entry, wc: WC, path: str) -> None:
        """Hold an error completion of `path`; the first opens the doubt, for the context's scan."""
        if self.path is None:
            self.path, self.until = path, time.monotonic() + EITHER_GRACE
            self.qp.ctx.doubtful.add(self.qp)
        entry.failed_with = wc.status
        self._held.append((entry, wc))

    def settle(self, now: float) -> None:
        """The context's scan: a device that has failed meanwhile moves the QP; a doubt that has lasted
        EITHER_GRACE on a device still usable is the application's error."""
        qp = self.qp
        with qp.ctx.lock:
            path = self.path
            if path is None:
                return
            verdict = reconsider(now, self.until, lambda: qp.ctx.usable(path))
            if verdict is Verdict.DOUBT:
                return
            to = qp.switcher.escape() if verdict is Verdict.TRANSPORT else None
            if to is not None:
                qp.switcher.switch_to(to, "error_completion")  # which ends the doubt
            else:
                log.warning("QP %d: the error in doubt on %s: %s", qp.qp_num, path, surfaces(verdict))
                qp.break_off()

    def end(self, surface: bool) -> None:
        """No more doubt: the QP has left its path (the switch settles what was held), breaks (what was held
        goes to the application, surface=True) or closes."""
        if self.path is None:
            return
        self.path = None
        self.qp.ctx.doubtful.discard(self.qp)
        held, self._held = self._held, []
        if surface:
            for entry, wc in held:
                wc.wr_id, wc.qp_num = entry.wr.wr_id, self.qp.qp_num
                entry.wc = wc
