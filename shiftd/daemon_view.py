"""What the gRPC services (server.py) see of the daemon: exactly the state and operations they use.

`shiftd.daemon.Daemon` satisfies it; server.py depends on this module, never on daemon.py, so the
two do not import each other and a service test can stand in a small fake for the daemon.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from libshift.api.shift.v1 import admin_pb2, common_pb2
from shiftd.agents import AgentTable
from shiftd.events import EventBus
from shiftd.fault_spec import Fault
from shiftd.peer_nics import PeerNics
from shiftd.peercred import PeerCred


@runtime_checkable
class DaemonView(Protocol):
    host: str
    agents: AgentTable
    bus: EventBus
    peer_nics: PeerNics  # the peer hosts' NICs that are down, for a new agent stream

    @property
    def admin_group(self) -> str:
        """The group whose members may make admin calls, for the refusal's message."""
        ...

    @property
    def devices(self) -> list[str]:
        """The names of the NICs the daemon watches."""
        ...

    @property
    def pending_writes(self) -> int:
        """etcd writes still queued."""
        ...

    def caller(self, connection: str) -> PeerCred | None:
        """Who is on the other end of a gRPC connection (context.peer()); None when unknown."""
        ...

    def is_admin(self, cred: PeerCred) -> bool: ...

    def count_request(self, method: str, code: str) -> None:
        """Count one gRPC call and the status it ended with."""
        ...

    def nic_protos(self) -> list[common_pb2.Nic]: ...

    def snapshot_event(self, nic: common_pb2.Nic) -> common_pb2.NicEvent: ...

    def admit_publish(self, connection: str, mappings: int) -> None:
        """Take `mappings` from the connection's publish budget; RefusedRequest when it is spent."""
        ...

    async def lookup(self, key: str, wait: float) -> str | None: ...

    def record_failover(self, report: common_pb2.FailoverReport) -> None: ...

    def count_dropped(self, agent_id: str, cred: PeerCred, instance: str, dropped: int) -> None:
        """An agent's count of the failover reports it ever dropped (its queue was full)."""
        ...

    def status(self) -> admin_pb2.StatusResponse: ...

    async def fail_nic(self, device: str, fault: Fault, by_uid: int) -> common_pb2.Nic: ...

    async def recover_nic(self, device: str, by_uid: int) -> common_pb2.Nic: ...
