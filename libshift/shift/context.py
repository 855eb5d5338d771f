"""ShiftContext: a device opened with failover, and the state its shadow resources share.

The application uses it exactly like a plain Context. Behind it, the context opens the backup device the
policy names, registers with the local shiftd (NIC events, key publication), and runs a watcher thread per
device channel: the backup one wakes on the backup path's receive completions, which is how a peer's
notification is noticed even while the application is not polling. Without a backup device or a shiftd,
it is a plain context and says once why.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from libshift.agent import Agent
from libshift.api.shift.v1 import common_pb2
from libshift.device import get_device_list
from libshift.shift.keys import RemoteKeys
from libshift.shift.policy import backup_device
from libshift.shift.rewind import BACKUP, PRIMARY
from libshift.verbs import CQ, CompChannel, Context
from libshift.verbs.errors import VerbsError

if TYPE_CHECKING:
    from libshift.shift.cq import ShiftCQ
    from libshift.shift.qp import ShiftQP

log = logging.getLogger("libshift.shift")
CONTROL_CQE = 1 << 16
WATCH_PERIOD = 0.25  # the watcher also polls this often, so nothing waits on a missed wake-up
_told: set[str] = set()


def _tell_once(message: str) -> None:
    if message not in _told:
        _told.add(message)
        log.warning("%s", message)


class ShiftContext:
    """A device opened with failover: `ShiftContext(name="mlx5_0")`."""

    def __init__(self, name: str, provider: str | None = None, agent: Agent | None = None) -> None:
        self.name = name
        self.primary = Context(name, provider)
        self.lock = threading.RLock()
        self.lkeys: dict[int, int] = {}  # default lkey -> backup lkey
        self.cqs: list[ShiftCQ] = []
        self.qps: dict[tuple[str, int], ShiftQP] = {}
        self.backup: Context | None = None
        self.agent: Agent | None = None
        self.keys: RemoteKeys | None = None
        self.channels: dict[str, CompChannel] = {}  # per path: the watchers' provider channels
        self.control_cq: CQ | None = None  # receive CQ of every backup QP (notifications first)
        self._closing = threading.Event()
        self._watchers: list[threading.Thread] = []
        self._own_agent = False  # an agent handed in is the caller's to close
        why = self._open_backup(agent)
        if why:
            _tell_once(f"{name}: no failover ({why}); running as a plain context")

    def _open_backup(self, agent: Agent | None) -> str | None:
        """Open the backup side; on failure return why there is none."""
        provider = self.primary.device.provider
        names = [d.name for d in get_device_list() if d.provider == provider]
        backup = backup_device(self.name, names)
        if backup is None:
            return "the host has no other device"
        try:
            opened = Context(backup, provider)
        except VerbsError as exc:
            return f"backup device {backup} cannot be opened: {exc}"
        self.agent = agent or Agent.connect()
        if self.agent is None:
            opened.close()
            return "no shiftd to tell it about NIC failures and peers' backups"
        self._own_agent = agent is None
        self.backup = opened
        self.keys = RemoteKeys(self.agent)
        self.control_cq = CQ(self.backup, CONTROL_CQE, channel=self.watch(BACKUP))
        self.agent.add_listener(self._on_nic)
        return None

    @property
    def resilient(self) -> bool:
        return self.backup is not None

    def query_gid(self, port_num: int = 1, index: int = 0) -> str:
        return self.primary.query_gid(port_num, index)

    # -- progress ------------------------------------------------------------------------------------------

    def progress(self) -> None:
        """Take every completion out of the provider CQs and hand it to its QP."""
        with self.lock:
            for cq in self.cqs:
                self._drain(cq.primary, PRIMARY)
                if cq.backup is not None:
                    self._drain(cq.backup, BACKUP)
            if self.control_cq is not None:
                self._drain(self.control_cq, BACKUP)

    def drain(self, cq: CQ, path: str) -> None:
        with self.lock:
            self._drain(cq, path)

    def _drain(self, cq: CQ, path: str) -> None:
        while True:
            count, wcs = cq.poll(32)
            for wc in wcs:
                qp = self.qps.get((path, wc.qp_num))
                if qp is not None:
                    qp.on_wc(wc, path)
            if count < 32:
                return

    def watch(self, path: str) -> CompChannel:
        """The provider channel of `path`, with a watcher thread that makes progress whenever a CQ armed on
        it gets a completion, so that nothing waits for the application to poll: the backup path's for
        the peer's notifications and control messages, both paths' for completion channels of ShiftCQs."""
        with self.lock:
            if path not in self.channels:
                ctx = self.primary if path == PRIMARY else self.backup
                assert ctx is not None
                self.channels[path] = CompChannel(ctx)
                watcher = threading.Thread(
                    target=self._watch, args=(path,), name=f"libshift-{self.name}-{path}", daemon=True
                )
                self._watchers.append(watcher)
                watcher.start()
            return self.channels[path]

    def _watch(self, path: str) -> None:
        channel = self.channels[path]
        while not self._closing.is_set():
            try:
                with self.lock:
                    for cq in self._armable(path):
                        cq.req_notify()
                    self.progress()
                    if path == BACKUP:
                        for qp in set(self.qps.values()):
                            qp.read_messages()
            except VerbsError as exc:  # a refused control verb: say so, keep watching the other QPs
                log.warning("%s: %s", self.name, exc)
            try:
                channel.get_cq_event(timeout=WATCH_PERIOD)
            except TimeoutError:
                continue

    def _armable(self, path: str) -> list[CQ]:
        """The provider CQs of `path` that report to its watcher's channel."""
        found = [cq.primary if path == PRIMARY else cq.backup for cq in self.cqs if cq.channel is not None]
        return [cq for cq in (*found, self.control_cq if path == BACKUP else None) if cq is not None]

    def _on_nic(self, event: common_pb2.NicEvent) -> None:
        """shiftd's word on our default device: DOWN is the fastest of the three detections, UP starts
        the failback."""
        if event.device != self.name:
            return
        with self.lock:
            for qp in set(self.qps.values()):
                if event.state == common_pb2.NIC_STATE_DOWN:
                    qp.nic_down()
                elif event.state == common_pb2.NIC_STATE_UP:
                    qp.nic_up()

    def default_nic_up(self) -> bool:
        return self.agent is not None and self.agent.nic_state(self.name) == common_pb2.NIC_STATE_UP

    def report(self, report: common_pb2.FailoverReport) -> None:
        """Tell shiftd off the data path: the call may take a while and never matters to the traffic."""
        if self.agent is not None:
            threading.Thread(target=self.agent.report, args=(report,), daemon=True).start()

    def close(self) -> None:
        self._closing.set()
        for watcher in self._watchers:
            watcher.join(timeout=2)
        if self.agent is not None:
            self.agent.remove_listener(self._on_nic)
            if self._own_agent:
                self.agent.close()
        if self.keys is not None:
            self.keys.close()
        for ctx in (self.primary, self.backup):
            if ctx is not None:
                ctx.close()

    def __enter__(self) -> ShiftContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
