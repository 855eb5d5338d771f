"""ShiftQP: an application RC QP with connected backup QPs behind it.

The QP itself: the verbs surface, its backup QPs (made, published, connected, re-armed), posting on the path
in use with that path's keys, and the completions of every provider QP, which come here from the context's
progress and reach the application's CQs in posting order, with the application's wr_ids. Its states are
states.py's (`qp.state` is their public view); the switches between paths are switch.py's `Switcher`, the
re-arm protocol rearm.py's `Rearm`.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
from typing import TYPE_CHECKING

from libshift.agent import AgentError
from libshift.core._core import FAST_NOT_FAST as NOT_FAST
from libshift.shift import handover, notify
from libshift.shift.armed import Armed
from libshift.shift.cq import ShiftCQ
from libshift.shift.detect import Verdict, default_path_attr, judge, surfaces
from libshift.shift.doubt import Doubt
from libshift.shift.memory import ShiftPD
from libshift.shift.pathqp import PathQP
from libshift.shift.paths import BACKUP, PRIMARY, depth
from libshift.shift.peers import peer_backups
from libshift.shift.rearm import Rearm
from libshift.shift.rewind import REMOTE_KEYED, WC_OPCODE, Entry, Ledger
from libshift.shift.states import HELD, Send, State, States, Transition
from libshift.shift.switch import Switcher
from libshift.verbs import (
    MR,
    QP,
    SGE,
    WC,
    Endpoint,
    QPAttr,
    QPCap,
    QPInitAttr,
    RecvWR,
    SendWR,
    VerbsError,
    VerbsRDMAError,
    enums,
)

if TYPE_CHECKING:
    from libshift.shift.context import ShiftContext

log = logging.getLogger("libshift.shift")
ibv_qp_state, ACCESS, FLAGS = enums.ibv_qp_state, enums.ibv_access_flags, enums.ibv_send_flags
INLINE = int(FLAGS.IBV_SEND_INLINE)  # plain ints: IntFlag arithmetic costs microseconds per post
SIGNALED = int(FLAGS.IBV_SEND_SIGNALED)
CONTROL_ACCESS = ACCESS.IBV_ACCESS_LOCAL_WRITE | ACCESS.IBV_ACCESS_REMOTE_WRITE
ST = enums.ibv_wc_status
RECV = enums.ibv_wc_opcode.IBV_WC_RECV


class ShiftQP:
    """`ShiftQP(pd, QPInitAttr(scq=cq, rcq=cq, cap=...))`, then `connect(peer_endpoint, attr)` as with QP."""

    def __init__(self, pd: ShiftPD, init_attr: QPInitAttr) -> None:
        scq, rcq = init_attr.scq, init_attr.rcq
        if not isinstance(scq, ShiftCQ) or not isinstance(rcq, ShiftCQ):
            raise VerbsError("a ShiftQP needs ShiftCQs as scq and rcq")
        self.ctx: ShiftContext = pd.ctx
        self.send_cq, self.recv_cq = scq, rcq
        self.cap = init_attr.cap
        self.sig_all = init_attr.sq_sig_all
        cap = init_attr.cap  # room for the control WRs (count, message, probe; the control receive):
        room = dataclasses.replace(cap, max_send_wr=cap.max_send_wr + 3, max_recv_wr=cap.max_recv_wr + 1)
        primary = QP(pd.primary, QPInitAttr(scq=scq.primary, rcq=rcq.primary, cap=room))
        sizes = (cap.max_send_wr, cap.max_recv_wr, max(cap.max_send_sge, cap.max_recv_sge))
        self.fast = self.ctx.fastpath.FastQP(
            self.ctx.fast, scq.fast, rcq.fast, (*sizes, primary.cap.max_inline_data), bool(self.sig_all)
        )
        self.fast_owned = False  # whether the fast path holds the ledger (handover.py)
        self.fast.add_path(0, primary.impl.native, primary.qp_num)
        self.qps: dict[str, PathQP] = {PRIMARY: PathQP(primary, self.fast, 0)}
        self.controls: dict[str, MR] = {}
        self.ledger = Ledger()
        self.states = States()
        self.current = PRIMARY
        self.remote: Endpoint | None = None
        self.armed = Armed(self.fast, self.ctx.devices)  # connected, control receive at its head (ours)
        self.peers: dict[str, Endpoint] = {}  # the paths both sides have, in the policy's order
        self.targets: dict[str, tuple[int, int]] = {}  # path -> the peer's control MR on it (addr, rkey)
        self.lost_paths: str | None = None  # why the QP gave up, with no path left (lost.py)
        self._access = 0
        self._attr = QPAttr()
        self.doubt = Doubt(self)  # an error completion not yet known to be the transport's or ours
        self.switcher = Switcher(self)
        self.rearm = Rearm(self)
        with self.ctx.lock:
            self.ctx.qps[(PRIMARY, self.primary.qp_num)] = self
            if self.ctx.backups:
                self._make_backups(pd, scq, room)

    def _make_backups(self, pd: ShiftPD, scq: ShiftCQ, room: QPCap) -> None:
        """A QP and a control MR on each backup path, published as a chain (the backup QP of the default
        one, the backup's backup of the backup, ...), the deepest link first: a peer that finds a link
        finds every one after it."""
        ctx = self.ctx
        assert ctx.agent is not None
        backups = {
            path: PathQP(
                QP(pd.on[path], QPInitAttr(scq=scq.on[path], rcq=ctx.control_cqs[path], cap=room)),
                self.fast,
                depth(path),
            )
            for path in ctx.backups
        }
        controls = {path: MR(pd.on[path], notify.CONTROL_BYTES, CONTROL_ACCESS) for path in pd.on}
        ends = [self.primary.endpoint(), *(qp.endpoint() for qp in backups.values())]
        ends[1] = notify.advertise(ends[1], controls)
        try:
            for i in reversed(range(1, len(ends))):
                ctx.agent.publish_qp(ends[i - 1], ends[i])
        except AgentError as exc:
            log.warning("QP %d: backups not published (%s); no failover for it", self.qp_num, exc)
            for obj in (*backups.values(), *controls.values()):
                obj.close()
            return
        self.qps.update(backups)
        self.controls = controls
        for path, qp in backups.items():
            ctx.qps[(path, qp.qp_num)] = self
            self.fast.add_path(depth(path), qp.impl.native, qp.qp_num)

    @property
    def primary(self) -> PathQP:
        return self.qps[PRIMARY]

    # -- the verbs surface ---------------------------------------------------------------------------------

    @property
    def qp_num(self) -> int:
        return self.primary.qp_num

    @property
    def state(self) -> State:
        return self.states.public

    @property
    def qp_state(self) -> ibv_qp_state:
        if self.states.send is Send.BROKEN:
            return ibv_qp_state.IBV_QPS_ERR
        return self.qps[self.current].qp_state

    def endpoint(self) -> Endpoint:
        return self.primary.endpoint()

    def to_init(self, attr: QPAttr | None = None) -> None:
        attr = attr or QPAttr()
        self.primary.to_init(attr)
        self._access = int(attr.qp_access_flags)

    def to_rtr(self, attr: QPAttr) -> None:
        self.primary.to_rtr(attr)
        self.remote = attr.dest

    def to_rts(self, attr: QPAttr | None = None) -> None:
        attr = attr or QPAttr()
        self._attr = dataclasses.replace(attr, qp_access_flags=self._access, dest=self.remote)
        peers = peer_backups(self)  # may wait for the peer's publication: not under the lock
        self.primary.to_rts(default_path_attr(attr) if peers else attr)
        with self.ctx.lock:
            self._connect_backups(peers)

    def connect(self, remote: Endpoint, attr: QPAttr | None = None) -> None:
        """RESET -> INIT -> RTR -> RTS towards `remote`; each backup QP is connected to the peer's."""
        attr = attr or QPAttr()
        attr.dest = remote
        self.to_init(attr)
        self.to_rtr(attr)
        self.to_rts(attr)

    def post_send(self, wr: SendWR) -> None:
        got = self.fast.post_send(wr)
        if got != NOT_FAST:  # taken by the fast path: posted (0, the common case, costs no call) or said why
            return handover.posted(self, got, wr, send=True) if got else None
        with self.ctx.lock:
            handover.take(self)
            if len(self.ledger.sq.entries) >= self.cap.max_send_wr:
                raise VerbsRDMAError(f"QP {self.qp_num}: send queue full", errno.ENOMEM)
            entry = self.ledger.add_send(wr, self.sig_all)
            if self.states.send not in HELD:  # else held until the switch's count, or the fence
                self._post_or_drop(entry)  # (the provider checks and refuses the application's own WR)
            if int(wr.send_flags) & INLINE and self.states.live:
                # the application may reuse the buffer once we return: a replay must send today's bytes
                pds = {path: qp.pd for path, qp in self.qps.items()}
                entry.slot = self.ctx.inline.keep(entry.wr, pds, self.primary.cap.max_inline_data)
            handover.give(self)

    def post_recv(self, wr: RecvWR) -> None:
        got = self.fast.post_recv(wr)
        if got != NOT_FAST:
            return handover.posted(self, got, wr, send=False) if got else None
        with self.ctx.lock:
            handover.take(self)
            if len(self.ledger.rq.entries) >= self.cap.max_recv_wr:
                raise VerbsRDMAError(f"QP {self.qp_num}: receive queue full", errno.ENOMEM)
            self._post_or_drop(self.ledger.add_recv(wr))
            handover.give(self)

    def close(self) -> None:
        with self.ctx.lock:
            self.fast.close()  # before the provider QPs it posts on
            for path, qp in self.qps.items():
                self.ctx.qps.pop((path, qp.qp_num), None)
            self.doubt.end(surface=False)  # a closed QP's completions go nowhere
            if BACKUP in self.qps and self.ctx.agent is not None:
                try:
                    for qp in list(self.qps.values())[:-1]:  # each link of the chain, by its key
                        self.ctx.agent.withdraw_qp(qp.endpoint())
                except AgentError as exc:
                    log.warning("QP %d: backup not withdrawn (%s)", self.qp_num, exc)
            for obj in (*self.qps.values(), *self.controls.values()):
                obj.close()

    # -- paths ---------------------------------------------------------------------------------------------

    def _connect_backups(self, peers: dict[str, Endpoint]) -> None:
        """Connect the backup QPs now, so that a failure finds them ready; without any, be a plain QP."""
        if not peers or self.remote is None:
            self.states.step(Transition.NO_BACKUP)
            handover.give(self)
            return
        self.targets = notify.targets_of(peers[BACKUP])
        for path, (addr, rkey) in self.targets.items():
            self.fast.set_target(depth(path), addr, rkey)
        self.peers = {PRIMARY: self.remote, **peers}
        handover.follow_keys(self)
        for path in peers:
            self.arm(path)
        self.states.step(Transition.CONNECT)
        handover.give(self)

    def arm(self, path: str) -> None:
        """(Re)connect `path` towards the peer's QP on it, with the control receive at the head."""
        qp = self.qps[path]
        if qp.qp_state != ibv_qp_state.IBV_QPS_RESET:
            qp.modify(QPAttr(qp_state=ibv_qp_state.IBV_QPS_RESET))
        attr = dataclasses.replace(self._attr, dest=self.peers[path])
        if path != PRIMARY:  # a backup waits for receives, and its PSNs are its own
            attr = dataclasses.replace(attr, rnr_retry=7, rq_psn=None, sq_psn=None)
        else:
            attr = default_path_attr(attr)
        qp.to_init(QPAttr(qp_access_flags=self._access))
        notify.arm(qp)
        qp.to_rtr(attr)
        qp.to_rts(attr)
        self.armed[path] = True

    # -- posting -------------------------------------------------------------------------------------------

    def _post_or_drop(self, entry: Entry) -> None:
        try:
            self._post(entry)
        except VerbsError:
            self.ledger.drop(entry)
            raise

    def _post(self, entry: Entry) -> None:
        """Post on the current path: the application's keys on the default one, translated on the backup."""
        wr = self.provider_wr(entry)
        qp = self.qps[self.current]
        if isinstance(wr, RecvWR):
            qp.post_recv(wr)
        else:
            qp.post_send(wr)

    def provider_wr(self, entry: Entry) -> SendWR | RecvWR:
        """The provider's WR for `entry` on the current path (our wr_id, the path's keys, always signaled)."""
        on_backup = self.current != PRIMARY
        wr = entry.wr
        sg = wr.sg
        if on_backup:
            lkeys = self.ctx.lkeys[self.current]
            sg = [SGE(s.addr, s.length, lkeys.get(s.lkey, s.lkey)) for s in wr.sg]
        entry.path, entry.posted = self.current, True
        if isinstance(wr, RecvWR):
            return RecvWR(wr_id=entry.wr_id, sg=sg)
        rkey = wr.rkey
        if wr.opcode in REMOTE_KEYED and self.ctx.keys is not None and self.remote is not None:
            if on_backup:
                rkey = self.ctx.keys.backup(self.remote.gid, wr.rkey, depth(self.current)) or wr.rkey
            else:
                self.ctx.keys.prefetch(self.remote.gid, wr.rkey)
        flags = int(wr.send_flags) | SIGNALED  # every WR's fate must be known here
        return wr.copy_with(entry.wr_id, sg, flags, rkey)

    # -- completions ---------------------------------------------------------------------------------------

    def on_wc(self, wc: WC, path: str) -> None:
        """A provider completion of one of our QPs (called with the context lock held)."""
        handover.take(self)
        if wc.wr_id in notify.CONTROL_IDS:
            self._on_control(wc, path)
            return
        entry = self.ledger.by_id.get(wc.wr_id)
        if entry is None:
            return
        ok, stale = wc.status == ST.IBV_WC_SUCCESS, entry.path != path
        if not ok:  # ibverbs leaves an error completion's opcode undefined: the WR's stands in
            wc.opcode = WC_OPCODE[entry.wr.opcode] if isinstance(entry.wr, SendWR) else RECV
        if not ok and (stale or self.states.send is Send.STOPPING):  # a path being left: still outstanding
            entry.failed_with = entry.failed_with or wc.status
            return
        if stale:
            return
        if ok:
            if not entry.is_send:
                self.ledger.received += 1
        elif self._taken(entry, wc, path):
            return
        wc.wr_id, wc.qp_num = entry.wr.wr_id, self.qp_num  # polled, the provider's WC is ours alone
        entry.wc = wc
        self.deliver()
        self.switcher.completed()

    def _taken(self, entry: Entry, wc: WC, path: str) -> bool:
        """An error completion on the path in use: taken here (held in doubt, or the QP moves) or, when it
        is the application's error or there is nothing left to switch to, not (the QP breaks, it surfaces)."""
        if self.doubt.on(path):  # behind the doubtful one: its fate is the same
            self.doubt.hold(entry, wc, path)
            return True
        verdict = judge(wc.status, lambda: self.ctx.usable(path))
        to = self.switcher.escape() if verdict is not Verdict.APPLICATION else None
        if to is None:
            log.warning("QP %d: %s on the %s path: %s", self.qp_num, wc.status.name, path, surfaces(verdict))
            self.break_off()
            return False
        if verdict is Verdict.DOUBT:
            self.doubt.hold(entry, wc, path)
        else:
            entry.failed_with = wc.status
            self.switcher.switch_to(to, "error_completion")
        return True

    def _on_control(self, wc: WC, path: str) -> None:
        if wc.status == ST.IBV_WC_SUCCESS:
            if wc.wr_id == notify.NOTIFY_RECV:
                self.switcher.on_count(path, wc.imm_data)
            elif wc.wr_id == notify.PROBE_SEND and self.state is State.FALLBACK:
                log.debug("QP %d: the probe of the %s path went through", self.qp_num, path)
                self.switcher.probed()
            return
        if self.states.send is Send.STOPPING or path != self.current:
            self.armed[path] = False  # a path we left or are leaving; or a re-armed one that failed its probe
            if wc.wr_id == notify.PROBE_SEND and self.state is State.FALLBACK:
                self.rearm.probe_failed()
            return
        if self.doubt.on(path):
            return  # flushed behind the error in doubt, whose verdict decides the path's fate
        log.warning("QP %d: control traffic on the %s path failed (%s)", self.qp_num, path, wc.status.name)
        to = self.switcher.escape()
        if to is not None:
            self.switcher.switch_to(to, "error_completion")
        else:
            self.break_off()

    def deliver(self) -> None:
        overflowed = False
        for entry in self.ledger.finished():
            assert entry.wc is not None
            if not entry.is_send:
                overflowed |= not self.recv_cq.push(entry.wc)
            elif entry.signaled or entry.wc.status != ST.IBV_WC_SUCCESS:
                overflowed |= not self.send_cq.push(entry.wc)
        if overflowed and self.states.send is not Send.BROKEN:
            # as on an RNIC the QP goes to ERR and the rest flushes (into the lost CQ)
            self.fail()

    def fail(self) -> None:
        """Break, and every provider QP to ERR: what is posted flushes to the application, and a switch the
        peer tries fails, so that it gets its error too."""
        self.break_off()
        for qp in self.qps.values():
            qp.to_err()

    def break_off(self) -> None:
        """From now on errors reach the application as the provider reports them; held WRs flush."""
        handover.take(self)
        if self.states.send is Send.BROKEN:
            return
        self.states.step(Transition.BREAK)
        self.doubt.end(surface=True)
        for entry in self.ledger.sq.pending() + self.ledger.rq.pending():
            if entry.path is None:
                entry.wc = WC(
                    wr_id=entry.wr.wr_id,
                    status=ST.IBV_WC_WR_FLUSH_ERR,
                    opcode=0,  # type: ignore[arg-type]  # ibverbs leaves it undefined on a flush
                    qp_num=self.qp_num,
                )
        self.deliver()
