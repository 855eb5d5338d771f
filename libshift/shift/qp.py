"""ShiftQP: an application RC QP with connected backup QPs behind it, and the switches between them.

States: IDLE (not connected) -> DEFAULT (on the default path) <-> FALLBACK (on a backup path); PLAIN when
there is no backup (a plain QP), BROKEN once an error has gone to the application (its own error, or the
path in use failing with nothing armed to switch to). A failing path is left for the first armed path in
the policy's order (paths.py): the default one if a failback has re-armed it, else the backup, else the
backup's backup. A switch goes any way by the same steps (stop the old path, keep what completed, move the
receives, exchange receive counts, replay what the peer lacks), so a failback is a switch back onto the
default path once both sides have re-armed it and a probe went through. Completions of every provider QP
come here from the context's progress; the application's CQs get them in posting order, with the
application's wr_ids.
"""

from __future__ import annotations

import dataclasses
import enum
import errno
import logging
import time
from typing import TYPE_CHECKING

from libshift.agent import AgentError
from libshift.api.shift.v1 import common_pb2
from libshift.shift import notify, steps
from libshift.shift.cq import ShiftCQ
from libshift.shift.detect import default_path_attr
from libshift.shift.memory import ShiftPD
from libshift.shift.notify import Kind, Message
from libshift.shift.paths import BACKUP, PRIMARY, depth
from libshift.shift.rewind import REMOTE_KEYED, Entry, Ledger
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
    ibv_access_flags,
    ibv_qp_state,
    ibv_send_flags,
    ibv_wc_status,
)

if TYPE_CHECKING:
    from libshift.shift.context import ShiftContext

log = logging.getLogger("libshift.shift")
INLINE = int(ibv_send_flags.IBV_SEND_INLINE)  # plain ints: IntFlag arithmetic costs microseconds per post
SIGNALED = int(ibv_send_flags.IBV_SEND_SIGNALED)
PEER_WAIT = 10.0  # how long connect waits for the peer's backup to be published
RETRY_FIRST, RETRY_MAX = 1.0, 30.0  # how often to try the default path again when no NIC UP will come
FENCE_WAIT = 0.1  # the longest a failback waits for the backup's sends to complete before stopping them
CONTROL_ACCESS = ibv_access_flags.IBV_ACCESS_LOCAL_WRITE | ibv_access_flags.IBV_ACCESS_REMOTE_WRITE
ST = ibv_wc_status
TRANSPORT_ERRORS = frozenset(
    {
        ST.IBV_WC_RETRY_EXC_ERR,
        ST.IBV_WC_WR_FLUSH_ERR,
        ST.IBV_WC_FATAL_ERR,
        ST.IBV_WC_GENERAL_ERR,
        ST.IBV_WC_RESP_TIMEOUT_ERR,
        ST.IBV_WC_REM_ABORT_ERR,
        ST.IBV_WC_BAD_RESP_ERR,
    }
)


class State(enum.Enum):
    IDLE = "idle"
    DEFAULT = "default"
    FALLBACK = "fallback"
    PLAIN = "plain"
    BROKEN = "broken"


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
        self.qps: dict[str, QP] = {
            PRIMARY: QP(pd.primary, QPInitAttr(scq=scq.primary, rcq=rcq.primary, cap=room))
        }
        self.controls: dict[str, MR] = {}
        self.ledger = Ledger()
        self.state = State.IDLE
        self.current = PRIMARY
        self.remote: Endpoint | None = None
        paths = list(self.ctx.devices)
        self.armed = dict.fromkeys(paths, False)  # connected, control receive at the head (our side)
        self._access = 0
        self._attr = QPAttr()
        self._peers: dict[str, Endpoint] = {}  # the paths both sides have, in the policy's order
        self._targets: dict[str, tuple[int, int]] = {}
        self._peer_count: dict[str, int | None] = dict.fromkeys(paths)
        self._seen: dict[str, Message | None] = dict.fromkeys(paths)
        self._epoch = 0
        self._requested = ""  # the path our re-arm request is about, until it is armed ("": none)
        self._switching = False  # stopping the old path: its errors are expected
        self._resumed = True  # False from a switch until the peer's count has come
        self._switch: tuple[str, float, int, str] = ("", 0.0, 0, PRIMARY)  # reason, start, moved, from
        self._fence_until: float | None = None  # failing back once the backup's sends are done (see _fence)
        self._retry_at: float | None = None  # when to try the default path again (see retry_default)
        self._retry_wait = RETRY_FIRST
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
            path: QP(pd.on[path], QPInitAttr(scq=scq.on[path], rcq=ctx.control_cqs[path], cap=room))
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

    @property
    def primary(self) -> QP:
        return self.qps[PRIMARY]

    # -- the verbs surface ---------------------------------------------------------------------------------

    @property
    def qp_num(self) -> int:
        return self.primary.qp_num

    @property
    def qp_state(self) -> ibv_qp_state:
        if self.state == State.BROKEN:
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
        peers = self._peer_backups()  # may wait for the peer's publication: not under the lock
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
        with self.ctx.lock:
            if len(self.ledger.sq.entries) >= self.cap.max_send_wr:
                raise VerbsRDMAError(f"QP {self.qp_num}: send queue full", errno.ENOMEM)
            entry = self.ledger.add_send(wr, self.sig_all)
            if self._resumed and self._fence_until is None:  # else held until the switch's count, or fence
                self._post_or_drop(entry)  # (the provider checks and refuses the application's own WR)
            if int(wr.send_flags) & INLINE and self.state in (State.DEFAULT, State.FALLBACK):
                # the application may reuse the buffer once we return: a replay must send today's bytes
                pds = {path: qp.pd for path, qp in self.qps.items()}
                entry.slot = self.ctx.inline.keep(entry.wr, pds, self.primary.cap.max_inline_data)

    def post_recv(self, wr: RecvWR) -> None:
        with self.ctx.lock:
            if len(self.ledger.rq.entries) >= self.cap.max_recv_wr:
                raise VerbsRDMAError(f"QP {self.qp_num}: receive queue full", errno.ENOMEM)
            self._post_or_drop(self.ledger.add_recv(wr))

    def close(self) -> None:
        with self.ctx.lock:
            for path, qp in self.qps.items():
                self.ctx.qps.pop((path, qp.qp_num), None)
            if BACKUP in self.qps and self.ctx.agent is not None:
                try:
                    for qp in list(self.qps.values())[:-1]:  # each link of the chain, by its key
                        self.ctx.agent.withdraw_qp(qp.endpoint())
                except AgentError as exc:
                    log.warning("QP %d: backup not withdrawn (%s)", self.qp_num, exc)
            for obj in (*self.qps.values(), *self.controls.values()):
                obj.close()

    # -- paths ---------------------------------------------------------------------------------------------

    def _peer_backups(self) -> dict[str, Endpoint]:
        """The peer's backup QPs by path, looked up along its chain from the default endpoint the
        application gave us, as deep as both sides have backups."""
        found: dict[str, Endpoint] = {}
        if BACKUP not in self.qps or self.remote is None or self.ctx.agent is None:
            return found
        end, wait = self.remote, PEER_WAIT
        for path in self.ctx.backups:
            try:
                peer = self.ctx.agent.lookup_qp(end.gid, end.qpn, wait=wait)
            except AgentError as exc:
                log.warning("QP %d: peer %s lookup failed (%s)", self.qp_num, path, exc)
                break
            if peer is None:
                if path == BACKUP:
                    log.warning("QP %d: the peer published no backup QP; no failover for it", self.qp_num)
                break
            found[path], end, wait = peer, peer, 0.0  # the deeper links were published first
        return found

    def _connect_backups(self, peers: dict[str, Endpoint]) -> None:
        """Connect the backup QPs now, so that a failure finds them ready; without any, be a plain QP."""
        if not peers or self.remote is None:
            self.state = State.PLAIN
            return
        self._targets = notify.targets_of(peers[BACKUP])
        self._peers = {PRIMARY: self.remote, **peers}
        for path in peers:
            self._arm(path)
        self.state = State.DEFAULT

    def _arm(self, path: str) -> None:
        """(Re)connect `path` towards the peer's QP on it, with the control receive at the head."""
        qp = self.qps[path]
        if qp.qp_state != ibv_qp_state.IBV_QPS_RESET:
            qp.modify(QPAttr(qp_state=ibv_qp_state.IBV_QPS_RESET))
        attr = dataclasses.replace(self._attr, dest=self._peers[path])
        if path != PRIMARY:  # a backup waits for receives, and its PSNs are its own
            attr = dataclasses.replace(attr, rnr_retry=7, rq_psn=None, sq_psn=None)
        else:
            attr = default_path_attr(attr)
        qp.to_init(QPAttr(qp_access_flags=self._access))
        notify.arm(qp)
        qp.to_rtr(attr)
        qp.to_rts(attr)
        self.armed[path] = True

    def _request_rearm(self, path: str) -> None:
        """Ask the peer to re-arm `path`; we arm ours when it answers ARMED. Each side arms once per request,
        the peer first, so the connection one side makes is the one the other's armed QP takes (arming
        first here and again on a crossing request from the peer would drop a connection already made)."""
        self.armed[path] = False
        self._epoch += 1
        self._requested = path
        self._message(Message(Kind.REARM, path, self._epoch))

    def _rearm_next(self) -> None:
        """Ask for the re-arm of the first backup path that is down here while its device is UP again: one
        request at a time, as a message overwrites the one before it (each ARMED asks for the next)."""
        if self._requested or not self._resumed or self.state == State.BROKEN:
            return
        for path in self._peers:
            if path not in (PRIMARY, self.current) and not self.armed[path] and self.ctx.device_up(path):
                self._request_rearm(path)
                return

    def _message(self, message: Message) -> None:
        path = self.current
        notify.send_message(self.qps[path], self.controls[path], self._targets[path], message)

    def read_messages(self) -> None:
        """Act on the peer's latest control message on each path (the watcher calls this)."""
        with self.ctx.lock:
            if self.state not in (State.DEFAULT, State.FALLBACK):
                return
            for path, mr in self.controls.items():
                message = notify.latest(mr)
                if message is None or message == self._seen[path]:
                    continue
                self._seen[path] = message
                if message.kind == Kind.REARM and message.path != self.current:
                    if message.path not in self._peers or not self.ctx.device_up(message.path):
                        continue  # our device of that path is still down: its NIC UP will ask for the re-arm
                    self._arm(message.path)
                    if message.path == self._requested:
                        self._requested = ""  # a crossing request: armed as the peer asked
                    self._message(Message(Kind.ARMED, message.path, message.epoch))
                elif message == Message(Kind.ARMED, PRIMARY, self._epoch) and self.state == State.FALLBACK:
                    self._requested = ""
                    self._arm(PRIMARY)
                    notify.probe(self.primary, self._targets[PRIMARY])
                elif message.path != PRIMARY and message == Message(Kind.ARMED, self._requested, self._epoch):
                    self._requested = ""
                    self._arm(message.path)
                    self._rearm_next()

    def nic_down(self) -> None:
        """shiftd says the default device is down: leave it (with nowhere to go, give up at once, see
        backup_down), or stop a failback that was under way."""
        with self.ctx.lock:
            self.armed[PRIMARY] = False
            if self._fence_until is not None:  # a failback waiting for its fence: stay, post what it held
                self._end_fence()
            if self.state != State.DEFAULT:
                return
            to = self._escape()
            if to is not None:
                self._switch_to(to, "nic_event")
            else:  # every backup's device is down too
                self._give_up(PRIMARY)

    def backup_down(self, path: str) -> None:
        """shiftd says the device of backup `path` is down. Off it, the path is no longer a place to go. On
        it, leave for the default path if that is re-armed (a failback under way), else for the next armed
        backup; with nowhere left, give up at once: the application gets its errors now, not after the ack
        deadline, and a side that only receives (which no deadline would ever wake) learns of it too."""
        with self.ctx.lock:
            if self.state not in (State.DEFAULT, State.FALLBACK) or path not in self._peers:
                return
            if path != self.current:
                # stopped, not only skipped: a peer that moves there (it may not know) must not have its
                # count taken and left unanswered (a flapping link delivers it); its count meets the ack
                # deadline instead, and it moves on
                self.armed[path] = False
                self.qps[path].to_err()
                return
            to = self._escape()
            if to is not None:
                self._switch_to(to, "nic_event")
            else:
                self._give_up(path)

    def _give_up(self, path: str) -> None:
        """The device of the path in use failed with no armed path left: the error goes to the application
        now. Every provider QP goes to ERR: what is posted flushes to the application, and a switch the
        peer tries onto a path it still counts as armed fails, so that it gets its error too."""
        log.warning("QP %d: the %s path's device failed with nothing left to switch to", self.qp_num, path)
        self._break()
        for qp in self.qps.values():
            qp.to_err()

    def backup_up(self, path: str) -> None:
        """The device of backup `path` is back: re-arm the backup paths that are down (one at a time)."""
        with self.ctx.lock:
            self._rearm_next()

    def nic_up(self) -> None:
        """The default device is back: re-arm the default path on both sides, probe it, then switch back."""
        with self.ctx.lock:
            if self.state == State.FALLBACK and self._resumed and not self.armed[PRIMARY]:
                self._request_rearm(PRIMARY)

    def retry_default(self, now: float) -> None:
        """After a failure only our own completions saw (a black hole: shiftd's NIC stays UP, so no NIC UP
        will come), or a probe that failed after a NIC UP, try the default path again now and then, backing
        off: its probe moves the traffic home once the path carries traffic again, and fails harmlessly
        while it does not. The side that detected the failure (or probed) asks; the other follows its
        re-arm request."""
        if self._retry_at is None or now < self._retry_at:
            return  # the common case, on every scan of every QP: no lock for it
        with self.ctx.lock:
            if self._retry_at is None or now < self._retry_at:
                return
            if self.state != State.FALLBACK:
                self._retry_at = None
                return
            self._retry_at = now + self._retry_wait
            self._retry_wait = min(2 * self._retry_wait, RETRY_MAX)
            if self._resumed and not self.armed[PRIMARY] and self.ctx.device_up(PRIMARY):
                self._request_rearm(PRIMARY)

    def check_fence(self, now: float) -> None:
        """A fence that outlasts FENCE_WAIT (the backup stalls) fails back anyway: the receive counts settle
        what was in flight, as in any switch."""
        if self._fence_until is None or now < self._fence_until:
            return  # the common case, on every scan of every QP: no lock for it
        with self.ctx.lock:
            if self._fence_until is not None and now >= self._fence_until:
                self._end_fence()

    def _retry_later(self) -> None:
        """Have retry_default try the default path once the current wait is over."""
        self._retry_at = time.monotonic() + self._retry_wait

    # -- posting -------------------------------------------------------------------------------------------

    def _post_or_drop(self, entry: Entry) -> None:
        try:
            self._post(entry)
        except VerbsError:
            self.ledger.drop(entry)
            raise

    def _post(self, entry: Entry) -> None:
        """Post on the current path: the application's keys on the default one, translated on the backup."""
        wr = self._on_current_path(entry)
        qp = self.qps[self.current]
        if isinstance(wr, RecvWR):
            qp.post_recv(wr)
        else:
            qp.post_send(wr)

    def _on_current_path(self, entry: Entry) -> SendWR | RecvWR:
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
        if wc.wr_id in notify.CONTROL_IDS:
            self._on_control(wc, path)
            return
        entry = self.ledger.by_id.get(wc.wr_id)
        if entry is None:
            return
        ok, stale = wc.status == ST.IBV_WC_SUCCESS, entry.path != path
        if not ok and (stale or self._switching):  # a path being left: the WR is still outstanding
            entry.failed_with = entry.failed_with or wc.status
            return
        if stale:
            return
        if ok:
            if not entry.is_send:
                self.ledger.received += 1
        elif wc.status in TRANSPORT_ERRORS and (to := self._escape()) is not None:
            entry.failed_with = wc.status
            self._switch_to(to, "error_completion")
            return
        else:  # the application's own error, or nothing left to switch to: it goes to the application
            self._break()
        wc.wr_id, wc.qp_num = entry.wr.wr_id, self.qp_num  # polled, the provider's WC is ours alone
        entry.wc = wc
        self._deliver()
        if self._fence_until is not None and not self._in_flight():
            self._end_fence()

    def _on_control(self, wc: WC, path: str) -> None:
        if wc.status == ST.IBV_WC_SUCCESS:
            if wc.wr_id == notify.NOTIFY_RECV and (path != self.current or not self._resumed):
                steps.note(self.qp_num, "peer_count")
                self._peer_count[path] = wc.imm_data
                if path != self.current:
                    self._switch_to(path, "peer_notification")
                else:
                    self._resume()
            elif wc.wr_id == notify.PROBE_SEND and self.state == State.FALLBACK:
                self._fence()
            return
        if self._switching or path != self.current:
            self.armed[path] = False  # a path we left or are leaving; or a re-armed one that failed its probe
            if wc.wr_id == notify.PROBE_SEND and self.state == State.FALLBACK and self._retry_at is None:
                self._retry_later()  # the NIC UP that started this failback will not come again
            return
        log.warning("QP %d: control traffic on the %s path failed (%s)", self.qp_num, path, wc.status.name)
        to = self._escape()
        if to is not None:
            self._switch_to(to, "error_completion")
        else:
            self._break()

    def _deliver(self) -> None:
        overflowed = False
        for entry in self.ledger.finished():
            assert entry.wc is not None
            if not entry.is_send:
                overflowed |= not self.recv_cq.push(entry.wc)
            elif entry.signaled or entry.wc.status != ST.IBV_WC_SUCCESS:
                overflowed |= not self.send_cq.push(entry.wc)
        if overflowed and self.state != State.BROKEN:
            # as on an RNIC the QP goes to ERR and the rest flushes (into the lost CQ); both paths, so
            # that a switch the peer tries fails and it gets its error too
            self._break()
            for qp in self.qps.values():
                qp.to_err()

    def _break(self) -> None:
        """From now on errors reach the application as the provider reports them; held WRs flush."""
        if self.state == State.BROKEN:
            return
        self.state = State.BROKEN
        self._resumed, self._fence_until = True, None
        for entry in self.ledger.sq.pending() + self.ledger.rq.pending():
            if entry.path is None:
                entry.wc = WC(
                    wr_id=entry.wr.wr_id,
                    status=ST.IBV_WC_WR_FLUSH_ERR,
                    opcode=0,  # type: ignore[arg-type]  # ibverbs leaves it undefined on a flush
                    qp_num=self.qp_num,
                )
        self._deliver()

    # -- the switch ----------------------------------------------------------------------------------------

    def _fence(self) -> None:
        """The probe went through: fail back once the sends posted on the backup have completed, holding the
        application's new ones meanwhile (DESIGN's WAIT_SIGNALED: every provider WR is signaled, so the
        last one posted is the fence), so that a failback stops nothing in flight and sends nothing twice;
        at once when nothing is out. check_fence bounds the wait."""
        if self._in_flight():
            self._fence_until = time.monotonic() + FENCE_WAIT
        else:
            self._switch_to(PRIMARY, "nic_recovered")

    def _in_flight(self) -> bool:
        """Whether a send posted on the current path has not completed yet."""
        current = self.current
        return any(e.path == current and e.wc is None for e in self.ledger.sq.entries)

    def _end_fence(self) -> None:
        """The fence is over (its sends completed, or it timed out): fail back; or, when the default path
        is no longer armed (its NIC went down meanwhile), stay and post the held sends here, in order."""
        self._fence_until = None
        if self.armed[PRIMARY]:
            self._switch_to(PRIMARY, "nic_recovered")
            return
        held = [e for e in self.ledger.sq.pending() if e.path is None]
        if held:
            self.qps[self.current].post_send_list([self._on_current_path(e) for e in held])

    def _escape(self) -> str | None:
        """Where the current path is left for when it fails: the first armed path in the policy's order
        (the default one when a failback has re-armed it), also in the middle of a switch (before the
        peer's count came): each side's count is its total received, final once the path it left is
        stopped, so a second switch settles by the count sent on the path it ends on."""
        if self.state not in (State.DEFAULT, State.FALLBACK):
            return None
        return next((path for path in self._peers if path != self.current and self.armed[path]), None)

    def _switch_to(self, to: str, reason: str) -> None:
        """Leave the current path: stop it, keep what completed, move the receives, send our count."""
        if to == self.current or self.state not in (State.DEFAULT, State.FALLBACK) or not self.armed[to]:
            return
        started, left, resumed = time.monotonic(), self.current, self._resumed
        steps.note(self.qp_num, "switch")
        self._fence_until = None  # the fence's held sends go with the rest, after the peer's count
        self._switching = True
        self.qps[left].to_err()  # nothing more lands on the old path: our receive count is final
        for cq in {self.send_cq, self.recv_cq}:
            self.ctx.drain(cq.on[left], left)
        if left != PRIMARY:
            self.ctx.drain(self.ctx.control_cqs[left], left)
        self._switching = False
        steps.note(self.qp_num, "old_path_stopped")
        self.current, self.armed[left] = to, False
        self._peer_count[left] = None  # a count on the path left belongs to a handshake that is over
        self._requested = ""  # a re-arm request in flight may be lost with the path: ask again on resume
        self.state = State.DEFAULT if to == PRIMARY else State.FALLBACK
        if to == PRIMARY and self.ctx.device_up(left):
            # a failback re-arms the backup it leaves now, before the handshake: both sides do it once here,
            # so that a failure of the default path in the middle of the handshake (the peer's count never
            # comes; the peer moves to the backup) finds somewhere to go
            self._arm(left)
        self._resumed = False
        moved = self.ledger.rq.pending()
        if moved:  # together: one hold of the provider's lock, not one per receive
            self.qps[to].post_recv_list([self._on_current_path(entry) for entry in moved])
        for entry in self.ledger.sq.pending():
            entry.path = None
        previous, self._switch = self._switch, (reason, started, len(moved), left)
        if not resumed:  # leaving a switch that never resumed: report the two as one move
            self._merge_switch(previous, to)
        notify.send_count(self.qps[to], self._targets[to], self.ledger.received)
        steps.note(self.qp_num, "count_sent")
        log.info("QP %d: switching to the %s path (%s)", self.qp_num, to, reason)
        if self._peer_count[to] is not None:
            self._resume()

    def _merge_switch(self, previous: tuple[str, float, int, str], to: str) -> None:
        """The switch before this one never resumed: report a single move from where that one started
        (with its detection time, and its reason when it was a failover too) unless it comes back there."""
        reason, _, moved, left = self._switch
        prior_reason, prior_started, _, prior_from = previous
        if prior_from != to:
            self._switch = (prior_reason if left != PRIMARY else reason, prior_started, moved, prior_from)

    def _resume(self) -> None:
        """The peer's count is in: settle the sends it has, post the rest on the new path, in order."""
        count, self._peer_count[self.current] = self._peer_count[self.current], None
        assert count is not None
        replay = self.ledger.settle(self.ledger.unwrap(count), self.qp_num)
        rewound = sum(entry.posted for entry in replay)  # posted before, on a path since stopped
        if replay:  # together: one lock and one socket write in the tcp provider, not one per WR
            self.qps[self.current].post_send_list([self._on_current_path(entry) for entry in replay])
        steps.note(self.qp_num, "replay_posted")
        self._resumed = True
        self._deliver()
        reason, started, moved, left = self._switch
        failback = self.current == PRIMARY
        if failback:
            self._retry_at, self._retry_wait = None, RETRY_FIRST
        elif reason == "nic_event" and self.ctx.device_up(PRIMARY):
            self._request_rearm(PRIMARY)  # the NIC came back while we were switching (away from it)
        elif reason == "error_completion":  # shiftd will not say when a silent failure ends: ask the path
            self._retry_later()
        self._rearm_next()  # backups left behind whose NIC UP came while another request was out
        self.ctx.report(
            common_pb2.FailoverReport(
                kind=common_pb2.FAILOVER_KIND_FAILBACK if failback else common_pb2.FAILOVER_KIND_FAILOVER,
                device=self.ctx.devices[left].name,
                backup_device=self.ctx.devices[self.current].name,
                default_device=self.ctx.name,
                reason=reason,
                downtime_seconds=time.monotonic() - started,
                reposted_work_requests=moved + rewound,
                qps=1,
                time_unix_nanos=time.time_ns(),
            )
        )
