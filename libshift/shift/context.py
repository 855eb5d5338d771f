"""ShiftContext: a device opened with failover, and the state its shadow resources share.

The application uses it exactly like a plain Context. Behind it, the context opens the backup devices the
policy names (paths.py: the backup, then the backup's backup), registers with the local shiftd (NIC events,
key publication), and runs a watcher thread per device channel (watchers.py): a backup path's wakes on its
receive completions, which is how a peer's notification is noticed even while the application is not polling.
Without a backup device or a shiftd, it is a plain context and says once why.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import TYPE_CHECKING

from libshift.agent import Agent
from libshift.notices import NicChange, NicState, SwitchReport
from libshift.shift import steps
from libshift.shift.detect import device_usable
from libshift.shift.inline import InlinePool
from libshift.shift.keys import RemoteKeys
from libshift.shift.links import LinkWatch
from libshift.shift.lost import PeerLoss
from libshift.shift.memory import LkeyMap
from libshift.shift.paths import PATHS, PRIMARY, depth
from libshift.shift.policy import backup_count, backup_devices
from libshift.shift.readdress import follow_peer_readdress
from libshift.shift.settings import env_int
from libshift.shift.watchers import Watchers
from libshift.verbs import CQ, WC, Context, VerbsError, get_device_list, ibv_wc_status

if TYPE_CHECKING:
    from libshift.shift.cq import ShiftCQ
    from libshift.shift.qp import ShiftQP

log = logging.getLogger("libshift.shift")
CONTROL_CQE = 1 << 16
_told: set[str] = set()


def _tell_once(message: str) -> None:
    if message not in _told:
        _told.add(message)
        log.warning("%s", message)


def control_cqe(device: Context) -> int:
    """The size of a backup path's control CQ: CONTROL_CQE, or less where the device allows less (rxe's
    max_cqe is 32767)."""
    return min(CONTROL_CQE, device.query_device().max_cqe)


class ShiftContext:
    """A device opened with failover: `ShiftContext(name="mlx5_0")`."""

    def __init__(self, name: str, provider: str | None = None, agent: Agent | None = None) -> None:
        self.name = name
        self.primary = Context(name, provider)
        self.devices: dict[str, Context] = {PRIMARY: self.primary}  # path -> its device, the default first
        self.backups: list[str] = []  # the backup paths, in the order a QP moves along them
        self.path_of: dict[str, str] = {name: PRIMARY}  # device name -> path
        self.lock = threading.RLock()
        self.lkeys: dict[str, LkeyMap] = {}  # backup path -> (default lkey -> lkey on that path)
        self.inline = InlinePool(self.lkeys)  # copies of inline sends in flight on resilient QPs
        self.cqs: dict[int, ShiftCQ] = {}  # by id, the cookie the fast path names a CQ by
        # the fast path (handover.py): it takes every provider completion, and hands what is not its own here
        self.fastpath = self.primary.impl.fastpath
        self.fast = self.fastpath.FastContext(1 + backup_count(), self.lock, self._deferred)
        self.qps: dict[tuple[str, int], ShiftQP] = {}
        self.doubtful: set[ShiftQP] = set()  # QPs holding an error completion in doubt (doubt.py)
        self.agent: Agent | None = None
        self.keys: RemoteKeys | None = None
        self.control_cqs: dict[str, CQ] = {}  # per backup path: the receive CQ of its QPs (notifications)
        self.watchers = Watchers(self)  # a thread per device channel, and the application's waits
        self.peer_loss = PeerLoss(self)  # the peer's NICs, for a QP's last path
        self._own_agent = False  # an agent handed in is the caller's to close
        self.links: LinkWatch | None = None
        self._links_down: set[str] = set()  # paths whose link the link watch saw fail, until shiftd's UP
        why = self._open_backups(agent)
        if why:
            _tell_once(f"{name}: no failover ({why}); running as a plain context")

    def _open_backups(self, agent: Agent | None) -> str | None:
        """Open the backup devices (one that cannot be opened is skipped); without any, return why."""
        provider = self.primary.device.provider
        names = [d.name for d in get_device_list() if d.provider == provider]
        wanted = backup_devices(self.name, names, backup_count())
        if not wanted:
            return "the host has no other device"
        opened: list[Context] = []
        why = ""
        for backup in wanted:
            try:
                opened.append(Context(backup, provider))
            except VerbsError as exc:
                why = f"backup device {backup} cannot be opened: {exc}"
                _tell_once(f"{self.name}: {why}; it backs up nothing")
        if not opened:
            return why
        self.agent = agent or Agent.connect()
        if self.agent is None:
            for ctx in opened:
                ctx.close()
            return "no shiftd to tell it about NIC failures and peers' backups"
        self._own_agent = agent is None
        control_cqs = {}
        for path, ctx in zip(PATHS[1:], opened, strict=False):
            self.devices[path] = ctx
            self.backups.append(path)
            self.path_of[ctx.name] = path
            self.lkeys[path] = self.fast.lkeys(depth(path))  # in the core: its posts on the path use them
            control_cqs[path] = CQ(ctx, control_cqe(ctx), channel=self.watchers.watch(path))
            self.fast.set_control(depth(path), control_cqs[path].impl.native)
        self.control_cqs = control_cqs  # whole: the watchers started above read it
        self.keys = RemoteKeys(self.agent, len(self.backups))
        self.agent.add_listener(self._on_nic)
        self.agent.add_listener(self._on_peer_nic, peers=True)
        self.agent.add_path_source(self.paths)
        if env_int("SHIFT_LINK_WATCH", 1, 0, 1):
            netdevs = {path: (ctx.device.netdev, ctx.device.netns) for path, ctx in self.devices.items()}
            marks = {path: self.fast.link_mark(depth(path)) for path in netdevs}
            watched = {p: n for p, n in netdevs.items() if n[0]}
            self.links = LinkWatch(watched, self._link_down, self.name, marks)
        return None

    @property
    def resilient(self) -> bool:
        return bool(self.backups)

    def query_gid(self, port_num: int = 1, index: int = 0) -> str:
        return self.primary.query_gid(port_num, index)

    # -- progress ------------------------------------------------------------------------------------------

    def progress(self, everything: bool = False) -> None:
        """Take the completions out of the provider CQs: the fast path's pass (fast_ctx.c).

        A provider CQ found empty costs a pass of its device's engine; the backup path's CQs (the twins and
        the control CQ) made a busy poll cost three passes where a bare CQ costs one. So, unless told to look
        at `everything` (the watchers, woken by the backup path), a pass drives the backup path only while
        it carries traffic (it moved in the last 50 ms), and otherwise only takes what its engine's own
        thread has made: a drive would park that thread, which makes a peer's count the moment it comes.
        What is not the fast path's own comes to _deferred, under the lock."""
        self.fast.progress(everything)

    def drain(self, cq: ShiftCQ | None, path: str, qp_num: int) -> None:
        """Take the completions of one path of `cq` (None: the path's control CQ), and act on those of the
        provider QP `qp_num` there at once (the others wait for the hand-over under way)."""
        self.fast.drain(None if cq is None else cq.fast, depth(path), qp_num)

    def _deferred(self, kind: int, path: int, cookie: int, wc: WC) -> None:
        """What the fast path hands over (under the lock): a completion for the failover layer, or a QP that
        overflowed its CQ (or could not go on after a switch)."""
        qp = self.qps.get((PATHS[path], wc.qp_num))
        if qp is None:
            return
        if kind == self.fastpath.DEFER_OVERFLOW:
            qp.fail()  # as on an RNIC: the QP goes to ERR and the rest flushes (into the lost CQ)
            return
        if not isinstance(wc.status, ibv_wc_status):
            wc.status = ibv_wc_status.IBV_WC_GENERAL_ERR
        qp.on_wc(wc, PATHS[path])

    def _on_nic(self, change: NicChange) -> None:
        """shiftd's word on our devices: a DOWN moves the traffic off the device (unless the link watch
        was faster); a DEGRADED that shiftd says to leave (lossy or slow, a healthy NIC beside it) moves
        the traffic that has somewhere else to go; its UP starts the failback or re-arms the backup."""
        down, up = change.state is NicState.DOWN, change.state is NicState.UP
        leave = change.move_off and not down
        path = self.path_of.get(change.device)
        if path is None or not (down or up or leave) or change.previous_gid:
            return  # a new GID, the state as it was: the agent publishes our mappings under it
        log.debug("shiftd: %s (the %s path) is %s", change.device, path, change.state.name)
        if up:
            self._links_down.discard(path)
            self.fast.link_up(depth(path))
        elif path in self._links_down:
            return  # the link watch was first: its move is made
        if leave:
            self._leave(path)
        else:
            self._device_event(path, down, "nic_event")

    def _leave(self, path: str) -> None:
        """The device of `path` still carries traffic, badly. shiftd judges only its own host's NICs, so a
        QP on it whose other paths are not armed (the peer's NIC of them failed) stays: a degraded path is
        better than none, and giving up there would end a job a NIC failure elsewhere had already moved."""
        with self.lock:
            qps = set(self.qps.values())
        for qp in qps:
            with self.lock:
                qp.switcher.follow_core()
                qp.switcher.leave(path)

    def _on_peer_nic(self, change: NicChange) -> None:
        """shiftd's word on a peer host's NIC: our paths to it follow a new GID, then a DOWN may leave a QP
        with no path."""
        follow_peer_readdress(self, change)
        self.peer_loss.on_peer_nic(change)

    def _link_down(self, path: str, seen_ns: int) -> None:
        """The link watch's word (its thread): the link of `path`'s netdev stopped carrying traffic, as it
        read at seen_ns (the core moved the QPs it could then). It counts as down until shiftd says UP,
        which its flap damping holds back until the link is stable."""
        if path in self._links_down:
            return  # a later message of the same failure (the operstate follows the carrier)
        log.debug("link watch: %s (the %s path) lost its link", self.devices[path].name, path)
        self._links_down.add(path)
        self._device_event(path, True, "link_event", seen_ns)

    def _device_event(self, path: str, down: bool, source: str, seen_ns: int | None = None) -> None:
        """The default's DOWN is the fastest detection (the link watch's or shiftd's, before any error
        completion), its UP starts the failback; a backup's DOWN moves the traffic on it along, its UP
        re-arms it. A second DOWN finds nothing left to move. A DOWN is the core's first: its pass moves the
        QPs in their steady state (fast_switch.c); what it leaves is moved here."""
        if path == PRIMARY and down:
            steps.note(0, source, seen_ns)
        if down:
            self.fast.link_down(depth(path))
            self.progress()
        with self.lock:
            qps = set(self.qps.values())
        for qp in qps:  # the lock per QP: with a thousand QPs the first moves at once, not after the last
            if source == "link_event" and qp.fast.moved_off(depth(path)):
                # the core moved it on this thread a moment ago: the watchers follow its news, off the
                # interpreter's critical moments (this follow-up held the interpreter lock for 0.2-0.8 ms
                # while the application waited to poll its first completions on the backup)
                continue
            with self.lock:
                qp.switcher.follow_core()
                if path != PRIMARY and down:
                    qp.switcher.backup_down(path)
                elif path != PRIMARY:
                    qp.rearm.backup_up()
                elif down:
                    qp.switcher.nic_down()
                else:
                    qp.rearm.nic_up()

    def _nic_state(self, path: str) -> NicState:
        """shiftd's word on the device of `path`, DOWN while the link watch saw its link fail since."""
        if path in self._links_down or self.fast.link_is_down(depth(path)):
            return NicState.DOWN
        return self.agent.nic_state(self.devices[path].name) if self.agent is not None else NicState.UNKNOWN

    def device_up(self, path: str) -> bool:
        """Whether shiftd says the device of `path` is UP (and the link watch has not seen it fail since)."""
        return self._nic_state(path) is NicState.UP

    def usable(self, path: str) -> bool:
        """Whether the device of `path` can carry traffic: its port is ACTIVE and it is not DOWN."""
        return device_usable(self.devices[path], self._nic_state(path))

    def report(self, report: SwitchReport) -> None:
        """Tell shiftd off the data path: the agent queues it (never blocking, under the context lock) and
        its reporter thread sends it, again after a reconnect if need be."""
        if self.agent is not None:
            self.agent.report(report)

    def paths(self) -> Counter[tuple[str, str]]:
        """(our device, the device in use) -> QPs: where our QPs run now, for shiftd (the agent asks)."""
        with self.lock:
            qps = set(self.qps.values())
            for qp in qps:
                qp.switcher.follow_core()
            return Counter((self.name, self.devices[qp.current].name) for qp in qps)

    def close(self) -> None:
        self.watchers.close()
        if self.links is not None:
            self.links.close()
        self.fast.close()
        if self.keys is not None:  # before the agent: its lookups in flight end quietly
            self.keys.close()
        if self.agent is not None:
            self.agent.remove_listener(self._on_nic)
            self.agent.remove_listener(self._on_peer_nic)
            self.agent.remove_path_source(self.paths)
            if self._own_agent:
                self.agent.close()
        self.inline.close()
        for ctx in reversed(self.devices.values()):
            ctx.close()

    def __enter__(self) -> ShiftContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
