"""An opened tcp device over the C core (libshift.core): the context, its PDs, MRs, CQs and channels.

The device is its netdev (netdev.py); everything that moves bytes or makes completions is the core's. The
objects here hold the core's and speak the provider interface's words.
"""

from __future__ import annotations

import contextlib
import mmap
import socket

from libshift.core import _core
from libshift.gid import gid_of_ipv4
from libshift.providers import (
    DeviceInfo,
    ProviderChannel,
    ProviderContext,
    ProviderCQ,
    ProviderMR,
    ProviderPD,
)
from libshift.providers.tcp.netdev import device_socket, netdev_index, netdev_ipv4, netdev_port, rebind
from libshift.providers.tcp.qp import TcpQP
from libshift.providers.tcp.qpns import QpnSpace
from libshift.vocabulary.attrs import DeviceAttr, PortAttr, QPCap
from libshift.vocabulary.errors import CQOverflowError, VerbsError
from libshift.vocabulary.wr import WC

# The core takes any size memory allows; it answers as a large RNIC would, so that code sized by it fits one
# (64 SGEs: the most the conformance suite gathers).
LIMITS = DeviceAttr(max_cqe=(1 << 22) - 1, max_sge=64, max_qp_wr=1 << 15)
ANY_ADDRESS = "0.0.0.0"


class TcpContext(ProviderContext):
    fastpath = _core

    def __init__(self, device: DeviceInfo) -> None:
        self.device = device
        self.address = netdev_ipv4(device.netdev, device.netns)
        self.ifindex = netdev_index(device.netdev, device.netns)
        self.core = _core.Context()
        self.qpns = QpnSpace(self.listen_socket, self.core.listen)
        self.cqs: dict[int, TcpCQ] = {}  # by cookie, for the channel's events

    def gid(self) -> str:
        return gid_of_ipv4(self.refresh_address())

    def query_device(self) -> DeviceAttr:
        return LIMITS

    def query_port(self) -> PortAttr:
        return netdev_port(self.device.netdev, self.device.netns)

    def refresh_address(self) -> str:
        """The netdev's address now: a NIC re-addressed (back from repair) has another, and so another GID,
        which a QP connecting from here must use (and its peer must know: libshift/shift/readdress.py).
        A netdev with none at the moment keeps the last one known. A netdev made anew (a driver reload:
        same name, another ifindex) gets the listeners bound to it again, else no peer would reach them."""
        with contextlib.suppress(VerbsError):
            self.address = netdev_ipv4(self.device.netdev, self.device.netns)
        ifindex = netdev_index(self.device.netdev, self.device.netns)
        if ifindex is not None and ifindex != self.ifindex:
            for fd in self.qpns.listeners:
                rebind(fd, self.device.netdev)
            self.ifindex = ifindex
        return self.address

    def new_socket(self) -> socket.socket:
        """A socket for the core to connect with: in the device's namespace, bound to its netdev and
        address."""
        return device_socket(self.device, self.address)

    def listen_socket(self) -> socket.socket:
        """A socket for a listener: bound to the netdev and any address on it, so that a QPN stays reachable
        at the device's new address when the NIC is re-addressed."""
        return device_socket(self.device, ANY_ADDRESS)

    def alloc_pd(self) -> TcpPD:
        return TcpPD(self)

    def create_comp_channel(self) -> TcpChannel:
        return TcpChannel(self)

    def create_cq(self, cqe: int, channel: TcpChannel | None) -> TcpCQ:  # type: ignore[override]
        cq = TcpCQ(self, cqe, channel)
        self.cqs[id(cq)] = cq
        return cq

    def close(self) -> None:
        self.core.close()
        self.cqs.clear()


class TcpMR(ProviderMR):
    def __init__(self, pd: TcpPD, length: int, access: int, buffer: memoryview | None) -> None:
        self.length = length
        self.access = access
        self.view = memoryview(mmap.mmap(-1, length)) if buffer is None else buffer
        self.core = _core.MR(pd.core, self.view, length, access)
        self.addr, self.lkey, self.rkey = self.core.addr, self.core.lkey, self.core.rkey

    def close(self) -> None:
        self.core.close()


class TcpPD(ProviderPD):
    def __init__(self, ctx: TcpContext) -> None:
        self.ctx = ctx
        self.core = _core.PD(ctx.core)

    def reg_mr(self, length: int, access: int, buffer: memoryview | None = None) -> TcpMR:
        return TcpMR(self, length, access, buffer)

    def create_qp(  # type: ignore[override]
        self, send_cq: TcpCQ, recv_cq: TcpCQ, cap: QPCap, sq_sig_all: bool
    ) -> TcpQP:
        return TcpQP(self.ctx, self.core, send_cq.core, recv_cq.core, cap, sq_sig_all)

    def close(self) -> None:
        self.core.close()


class TcpChannel(ProviderChannel):
    def __init__(self, ctx: TcpContext) -> None:
        self._ctx = ctx
        self.core = _core.Channel(ctx.core)

    @property
    def native(self) -> _core.Channel:
        return self.core

    def fileno(self) -> int:
        """The channel's eventfd: readable while an event may be waiting."""
        return self.core.fileno()

    def get_cq_event(self, timeout: float | None) -> TcpCQ | None:
        cookie = self.core.wait(timeout)
        return None if cookie is None else self._ctx.cqs.get(cookie)

    def wake(self) -> None:
        """Make the wait under way (or else the next one) return None now."""
        self.core.wake()

    def close(self) -> None:
        self.core.close()


class TcpCQ(ProviderCQ):
    def __init__(self, ctx: TcpContext, cqe: int, channel: TcpChannel | None) -> None:
        self._ctx = ctx
        self.cqe = cqe
        self.core = _core.CQ(ctx.core, cqe, None if channel is None else channel.core, id(self))

    @property
    def native(self) -> _core.CQ:
        return self.core

    def poll(self, num_entries: int) -> list[WC]:
        wcs = self.core.poll(num_entries)
        if wcs is None:
            raise CQOverflowError(f"CQ overflow: more than {self.cqe} completions were not polled")
        return wcs

    def req_notify(self, solicited_only: bool) -> None:
        self.core.req_notify(solicited_only)

    def close(self) -> None:
        self.core.close()
        self._ctx.cqs.pop(id(self), None)
