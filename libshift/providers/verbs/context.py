"""An opened RNIC: its port and addressing, its objects, its QPs by number, and its async events.

The device is opened twice: by pyverbs for its attributes (the ports, the limits) and by the core's verbs
backend (libshift.core._verbs) for every object the data path uses. The port is the first ACTIVE one
(ConnectX functions have one port each). The GID index is chosen from the sysfs GID table (gid.py) at open
and again whenever an async event says addresses may have moved (GID_CHANGE, PORT_ACTIVE, LID_CHANGE): new
QPs then use the current index. That second read waits for the next use of the addressing, not the event:
rxe's table has 1024 entries, slow to read under emulation, and a reader that only wants the event (shiftd)
must hear it at once. Async events are read by one thread per context, which waits on the
backend's async event file with poll() and hands each event, with its meaning, to the listeners: the
resilience layer subscribes with add_event_listener.

Objects close what was made on them first (libibverbs refuses to free a PD, CQ or channel still in use),
and closing the context closes whatever is still open, the newest first.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from libshift.core import _verbs
from libshift.providers import DeviceInfo, ProviderContext
from libshift.providers.verbs import fds
from libshift.providers.verbs.binding import load, mapped, native
from libshift.providers.verbs.convert import LINK_LAYER, Port, work_completion
from libshift.providers.verbs.cq import VerbsChannel, VerbsCQ
from libshift.providers.verbs.events import AsyncEvent, EventType, Listener, Listeners, describe, meaning_of
from libshift.providers.verbs.gid import choose_gid, read_gid_table
from libshift.providers.verbs.memory import VerbsPD
from libshift.providers.verbs.qp import VerbsQP
from libshift.vocabulary.attrs import DeviceAttr, PortAttr
from libshift.vocabulary.enums import ibv_port_state, ibv_qp_state, ibv_wc_opcode
from libshift.vocabulary.errors import VerbsError
from libshift.vocabulary.wr import WC

log = logging.getLogger("libshift.providers.verbs")


class VerbsContext(ProviderContext):
    fastpath = _verbs

    def __init__(self, device: DeviceInfo, sysfs_root: Path = Path("/sys")) -> None:
        self.device = device
        self.sysfs_root = sysfs_root
        self.qps: dict[int, VerbsQP] = {}
        self.cqs: dict[int, VerbsCQ] = {}  # by the cookie their channel's events carry
        self._cookies = 0
        self._objects: dict[int, tuple[Any, tuple[Any, ...]]] = {}  # id -> (object, what it was made on)
        self._listeners = Listeners()
        self._lock = threading.Lock()
        self._stale = False  # an event said the addressing may have moved: read it again at its next use
        with mapped(f"{device.name}: open_device"):
            self.context = load().device.Context(name=device.name)
        try:
            self._port, self._gid = self._address(self._active_port())
            with native(f"{device.name}: open_device"):
                self.native = _verbs.Context(device.name, self._port.num)
        except BaseException:
            self.context.close()
            raise
        self._waker = fds.Waker()
        self._reader: threading.Thread | None = threading.Thread(
            target=self._read_events, args=(self.native.event_fd(),), name=f"verbs-async-{device.name}",
            daemon=True,
        )  # fmt: skip
        self._reader.start()

    # -- addressing ---------------------------------------------------------------------------------------

    def _active_port(self) -> int:
        with mapped(f"{self.device.name}: query_device"):
            count = self.context.query_device().phys_port_cnt
        for num in range(1, count + 1):
            with mapped(f"{self.device.name}: query_port {num}"):
                if self.context.query_port(num).state == ibv_port_state.IBV_PORT_ACTIVE:
                    return num
        return 1

    def _address(self, num: int) -> tuple[Port, str]:
        """The port's attributes and the GID its QPs use now."""
        with mapped(f"{self.device.name}: query_port {num}"):
            attr = self.context.query_port(num)
        link_layer = LINK_LAYER.get(attr.link_layer, "InfiniBand")
        table = read_gid_table(self.sysfs_root, self.device.name, num)
        try:
            entry = choose_gid(table, link_layer, self.device.netdev)
        except VerbsError as exc:
            raise VerbsError(f"{self.device.name} port {num}: {exc}") from None
        return Port(num, link_layer, attr.lid, attr.active_mtu, entry.index), entry.gid

    def _addressing(self) -> tuple[Port, str]:
        """The port and the GID its QPs use, chosen again first if an event said they may have moved (after
        a flap or a GID change the index or the LID may differ)."""
        with self._lock:
            stale, before, gid = self._stale, self._port, self._gid
            self._stale = False  # an event during the read below makes the next use read again
        if not stale:
            return before, gid
        name = self.device.name
        try:
            port, gid = self._address(before.num)
        except VerbsError as exc:
            log.warning("%s: addressing not re-read (%s); GID index stays %d", name, exc, before.gid_index)
            return before, gid
        with self._lock:
            if port.gid_index != before.gid_index:
                log.info("%s: GID index %d -> %d (%s)", name, before.gid_index, port.gid_index, gid)
            self._port, self._gid = port, gid
        return port, gid

    def port(self) -> Port:
        return self._addressing()[0]

    def gid(self) -> str:
        return self._addressing()[1]

    def query_device(self) -> DeviceAttr:
        with mapped(f"{self.device.name}: query_device"):
            attr = self.context.query_device()
        return DeviceAttr(max_cqe=attr.max_cqe, max_sge=attr.max_sge, max_qp_wr=attr.max_qp_wr)

    def query_port(self) -> PortAttr:
        num = self._port.num  # fixed at open
        with mapped(f"{self.device.name}: query_port {num}"):
            return PortAttr(ibv_port_state(self.context.query_port(num).state))

    # -- async events -------------------------------------------------------------------------------------

    def add_event_listener(self, listener: Listener) -> None:
        """Call `listener(event)` on the reader thread for every async event of this device."""
        self._listeners.add(listener)

    def _read_events(self, fd: int) -> None:
        while True:
            ready = fds.wait_readable([fd, self._waker.fd], None)
            if self._waker.fd in ready:
                return
            while (raw := self.native.event()) is not None:  # acknowledged already
                event_type, _qp_num, _port, cq_cookie = raw
                try:
                    self.dispatch(event_type, cq_cookie)
                except Exception:  # the reader must outlive any one event
                    log.exception("%s: async event %d not handled", self.device.name, event_type)

    def dispatch(self, event_type: int, cq_cookie: int = 0) -> AsyncEvent:
        """Act on an event (choose the GID again when addresses may have moved) and surface it."""
        if meaning_of(event_type).readdress:
            with self._lock:
                self._stale = True
        if event_type == EventType.CQ_ERR:
            self._overrun(cq_cookie)
        event = describe(self.device.name, event_type, self._port.num, self._failed_qps)
        log.info("%s: async event %s", self.device.name, event.name)
        self._listeners.emit(event)
        return event

    def _overrun(self, cq_cookie: int) -> None:
        """The CQ the device names overran: its QPs go to ERR (IB's rule; rxe leaves them)."""
        cq = self.cqs.get(cq_cookie)
        if cq is None:
            return
        cq.overrun = True
        for qp in list(self.qps.values()):
            if cq in qp.cqs:
                log.warning("%s: CQ overrun: QP %d goes to ERR", self.device.name, qp.qp_num)
                qp.to_error()

    def _failed_qps(self) -> tuple[int, ...]:
        return tuple(num for num, qp in list(self.qps.items()) if _in_error(qp))

    # -- objects ------------------------------------------------------------------------------------------

    def next_cookie(self) -> int:
        with self._lock:
            self._cookies += 1
            return self._cookies

    def adopt(self, obj: Any, *parents: Any) -> None:
        """Track `obj`, made on `parents`, so that closing one of them (or the context) closes it first."""
        with self._lock:
            self._objects[id(obj)] = (obj, parents)

    def release(self, obj: Any) -> None:
        """Close what was made on `obj` (the newest first) and stop tracking it: `obj` closes next."""
        with self._lock:
            self._objects.pop(id(obj), None)
            made_on = [other for other, parents in self._objects.values() if obj in parents]
        for other in reversed(made_on):
            other.close()

    def completion(self, wc: WC) -> WC:
        qp = self.qps.get(wc.qp_num)
        return qp.completed(wc) if qp is not None else work_completion(wc, ibv_wc_opcode.IBV_WC_SEND)

    def alloc_pd(self) -> VerbsPD:
        return VerbsPD(self)

    def create_comp_channel(self) -> VerbsChannel:
        return VerbsChannel(self)

    def create_cq(self, cqe: int, channel: VerbsChannel | None) -> VerbsCQ:  # type: ignore[override]
        return VerbsCQ(self, cqe, channel)

    def close(self) -> None:
        if self._reader is not None:
            self._waker.wake()
            self._reader.join()
            self._reader = None
        self._waker.close()
        with self._lock:
            still_open = [obj for obj, _parents in self._objects.values()]
        for obj in reversed(still_open):  # the newest first: nothing is made before what it is made on
            if id(obj) in self._objects:
                obj.close()
        with native(f"{self.device.name}: close_device"):
            self.native.close()
        with mapped(f"{self.device.name}: close_device"):
            self.context.close()


def _in_error(qp: VerbsQP) -> bool:
    try:
        return qp.state == ibv_qp_state.IBV_QPS_ERR
    except VerbsError:
        return True  # a QP that cannot be queried is of no use either
