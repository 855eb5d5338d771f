"""The provider interface: what the verbs objects delegate to, and the list of providers available.

A provider moves the bytes (tcp: kernel TCP on one netdev; verbs: an RNIC through pyverbs). It knows nothing
of failover; libshift.shift wraps the public verbs objects, which wrap these. Every method that can be refused
raises libshift.vocabulary.errors.VerbsError with a one-line reason.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

from libshift.vocabulary.attrs import DeviceAttr, Endpoint, PortAttr, QPAttr, QPCap
from libshift.vocabulary.enums import ibv_qp_state
from libshift.vocabulary.errors import VerbsRDMAError
from libshift.vocabulary.wr import WC, RecvWR, SendWR


@dataclass(frozen=True)
class DeviceInfo:
    """A device as a provider sees it; netns is the network namespace its sockets live in (tcp only)."""

    name: str
    provider: str
    netdev: str = ""
    netns: str | None = None


class ProviderMR(ABC):
    """Registered memory: `view` is a writable memoryview of it, `addr` its address for SGEs and RDMA."""

    addr: int
    length: int
    lkey: int
    rkey: int
    access: int
    view: memoryview

    @abstractmethod
    def close(self) -> None: ...


class ProviderChannel(ABC):
    """A completion channel: CQs armed with req_notify report here once per arming."""

    native: object  # the core's channel behind it

    @abstractmethod
    def get_cq_event(self, timeout: float | None) -> ProviderCQ | None: ...

    @abstractmethod
    def close(self) -> None: ...


class ProviderCQ(ABC):
    """A completion queue; `owner` is set by the verbs layer so a channel event can name the public CQ."""

    owner: object = None
    native: object  # the core's CQ behind it

    @abstractmethod
    def poll(self, num_entries: int) -> list[WC]: ...

    @abstractmethod
    def req_notify(self, solicited_only: bool) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


class ProviderQP(ABC):
    """An RC queue pair; `refused` is the error for a post the core refused (POST_* `err`)."""

    qp_num: int
    cap: QPCap
    native: object  # the core's QP behind it

    @abstractmethod
    def refused(self, err: int, wr: SendWR | RecvWR | None, send: bool) -> VerbsRDMAError: ...

    @property
    @abstractmethod
    def state(self) -> ibv_qp_state: ...

    @abstractmethod
    def endpoint(self) -> Endpoint: ...

    @abstractmethod
    def modify(self, attr: QPAttr) -> None:
        """Move to attr.qp_state, taking the attributes that transition needs."""

    @abstractmethod
    def post_send(self, wr: SendWR) -> None: ...

    def post_send_list(self, wrs: Sequence[SendWR]) -> None:
        """Post `wrs` in order, as ibv_post_send posts a chained list: those before a refused WR stay
        posted, the refusal is raised, the rest are not posted. A provider may send them together."""
        for wr in wrs:
            self.post_send(wr)

    @abstractmethod
    def post_recv(self, wr: RecvWR) -> None: ...

    def post_recv_list(self, wrs: Sequence[RecvWR]) -> None:
        """Post `wrs` in order, as ibv_post_recv posts a chained list: those before a refused WR stay
        posted, the refusal is raised, the rest are not posted."""
        for wr in wrs:
            self.post_recv(wr)

    @abstractmethod
    def close(self) -> None: ...


class ProviderPD(ABC):
    """A protection domain: MRs and QPs of one PD may work together, no others."""

    @abstractmethod
    def reg_mr(self, length: int, access: int, buffer: memoryview | None = None) -> ProviderMR:
        """Register `length` bytes: new memory, or the caller's `buffer` (bytes, writable, at least `length`
        long), which RDMA then reads and writes in place; the MR keeps it alive."""

    @abstractmethod
    def create_qp(
        self, send_cq: ProviderCQ, recv_cq: ProviderCQ, cap: QPCap, sq_sig_all: bool
    ) -> ProviderQP: ...

    @abstractmethod
    def close(self) -> None: ...


class ProviderContext(ABC):
    """An opened device; `fastpath` is the core's module whose FastContext, FastCQ and FastQP run shift QPs
    over this provider's CQs and QPs (their `native` objects)."""

    device: DeviceInfo
    fastpath: ModuleType

    @abstractmethod
    def gid(self) -> str: ...

    @abstractmethod
    def query_device(self) -> DeviceAttr: ...

    @abstractmethod
    def query_port(self) -> PortAttr:
        """The port the device's QPs use (tcp: its netdev, ACTIVE while up and running)."""

    @abstractmethod
    def alloc_pd(self) -> ProviderPD: ...

    @abstractmethod
    def create_comp_channel(self) -> ProviderChannel: ...

    @abstractmethod
    def create_cq(self, cqe: int, channel: ProviderChannel | None) -> ProviderCQ: ...

    @abstractmethod
    def close(self) -> None: ...


class Provider(ABC):
    """A transport: lists its devices and opens them; `unavailable` says why it has none, if it knows."""

    name: str
    unavailable: str = ""

    @abstractmethod
    def devices(self) -> list[DeviceInfo]: ...

    @abstractmethod
    def open(self, device: DeviceInfo) -> ProviderContext: ...
