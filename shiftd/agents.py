"""Registered libshift agents and the backup mappings each one published.

A registration lives as long as the agent's connection to shiftd: when the process dies
or closes its channel, the relay reports the connection closed and every mapping the agent
published is withdrawn from etcd. An agent may only publish under keys no other live agent
owns, and may only withdraw its own.
"""

from __future__ import annotations

import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from google.protobuf import json_format

from libshift.api.shift.v1 import common_pb2
from libshift.gid import canonical_gid
from shiftd.peercred import PeerCred
from shiftd.reports import SeenReports

MAX_MAPPINGS_PER_CALL = 4096
MAX_TEXT = 256
MAX_PROVIDER_DATA = 16


class RefusedRequest(Exception):
    """A request (an agent's or an operator's) that must be refused: `code` names the gRPC status to
    answer with, str() is the message. Not libshift.agent.AgentError, which is the client's side."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Agent:
    info: common_pb2.AgentInfo
    connection: str
    cred: PeerCred
    keys: set[str] = field(default_factory=set)
    on_backup: Counter[str] = field(default_factory=Counter)  # default device -> QPs now on a backup


class KeyStore(Protocol):
    """What AgentTable needs of the registry: desired-state put and delete."""

    def put(self, key: str, value: str) -> None: ...

    def delete(self, key: str) -> None: ...


def qp_key(gid: str, qpn: int) -> str:
    return f"qp/{canonical_gid(gid)}/{qpn}"


def mr_key(gid: str, rkey: int) -> str:
    return f"mr/{canonical_gid(gid)}/{rkey}"


def encode(message) -> str:
    return json_format.MessageToJson(message, indent=None, sort_keys=True)


class AgentTable:
    def __init__(self, store: KeyStore, on_change: Callable[[common_pb2.AgentInfo, bool], None]) -> None:
        self._store = store
        self._on_change = on_change
        self.agents: dict[str, Agent] = {}
        self._owner: dict[str, str] = {}  # etcd key -> agent id
        self._seen = SeenReports()

    def register(
        self,
        connection: str,
        cred: PeerCred,
        pid: int,
        name: str,
        job: str,
        paths: common_pb2.QpPaths | None = None,
    ) -> common_pb2.AgentInfo:
        _check_text("name", name)
        _check_text("job", job)
        if pid and pid != cred.pid:
            raise RefusedRequest("PERMISSION_DENIED", f"pid {pid} is not the caller's pid {cred.pid}")
        info = common_pb2.AgentInfo(
            agent_id=f"{cred.pid}-{secrets.token_hex(4)}",
            pid=cred.pid,
            uid=cred.uid,
            name=name,
            job=job,
            registered_unix_nanos=time.time_ns(),
        )
        agent = Agent(info, connection, cred)
        if paths is not None:  # an agent back after a daemon restart: its QPs may be on backups already
            agent.on_backup = _on_backup(paths)
        self.agents[info.agent_id] = agent
        self._on_change(info, True)
        return info

    def unregister(self, agent_id: str, cred: PeerCred) -> None:
        agent = self._own(agent_id, cred)
        self._drop(agent)

    def connection_closed(self, connection: str) -> None:
        for agent in [a for a in self.agents.values() if a.connection == connection]:
            self._drop(agent)

    def publish(self, agent_id: str, cred: PeerCred, qps, mrs) -> None:
        agent = self._own(agent_id, cred)
        if len(qps) + len(mrs) > MAX_MAPPINGS_PER_CALL:
            raise RefusedRequest("INVALID_ARGUMENT", f"at most {MAX_MAPPINGS_PER_CALL} mappings per call")
        writes: list[tuple[str, str]] = []
        for mapping in qps:
            _check_endpoint("primary", mapping.primary)
            _check_endpoint("backup", mapping.backup)
            writes.append((qp_key(mapping.primary.gid, mapping.primary.qpn), encode(mapping)))
        for mapping in mrs:
            _check_gid("gid", mapping.gid)
            _check_gid("backup_gid", mapping.backup_gid)
            writes.append((mr_key(mapping.gid, mapping.rkey), encode(mapping)))
        for key, _ in writes:
            owner = self._owner.get(key)
            if owner is not None and owner != agent_id:
                raise RefusedRequest("PERMISSION_DENIED", f"{key} is published by another agent")
        for key, value in writes:
            self._owner[key] = agent_id
            agent.keys.add(key)
            self._store.put(key, value)

    def withdraw(self, agent_id: str, cred: PeerCred, qps, mrs) -> None:
        agent = self._own(agent_id, cred)
        keys = [qp_key(_gid(e.gid), e.qpn) for e in qps] + [mr_key(_gid(m.gid), m.rkey) for m in mrs]
        for key in keys:
            if key not in agent.keys:
                raise RefusedRequest("NOT_FOUND", f"{key} is not published by this agent")
        for key in keys:
            self._forget(agent, key)

    def record_switch(
        self,
        agent_id: str,
        cred: PeerCred,
        report: common_pb2.FailoverReport,
        instance: str = "",
        seq: int = 0,
        paths: common_pb2.QpPaths | None = None,
    ) -> bool:
        """Follow the agent's QPs off and back onto their default device; whether the report is new (a
        report with the id of one already counted is a repeat, to be ignored).

        With `paths`, the agent says where its QPs run now, which is taken as it is. Without, it is
        derived from the report: a failover away from the default device puts `qps` on a backup; a
        failback (to the default device) takes them off; a move from one backup to another changes nothing.
        """
        agent = self._own(agent_id, cred)
        if not self._seen.first_time(cred.pid, instance, seq):
            return False
        if paths is not None:
            agent.on_backup = _on_backup(paths)
        elif report.kind == common_pb2.FAILOVER_KIND_FAILBACK:
            device = report.backup_device
            agent.on_backup[device] = max(0, agent.on_backup[device] - report.qps)
        elif report.device == (report.default_device or report.device):
            agent.on_backup[report.device] += report.qps
        return True

    def count_dropped(self, agent_id: str, cred: PeerCred, instance: str, dropped: int) -> int:
        """The agent says it has dropped `dropped` failover reports in all (past its queue's bound, while
        shiftd was away): kept for `shiftctl status`; how many of them this daemon had not heard of."""
        agent = self._own(agent_id, cred)
        agent.info.reports_dropped = dropped
        return self._seen.newly_dropped(cred.pid, instance, dropped)

    def qps_on_backup(self, device: str) -> int:
        """QPs whose default device is `device` and which run on a backup now, over all live agents."""
        return sum(agent.on_backup[device] for agent in self.agents.values())

    def mapping_counts(self) -> tuple[int, int]:
        """(QP, MR) mappings published by all agents; counted when asked (a scrape), not per publish."""
        return _split_counts(self._owner)

    def infos(self) -> list[common_pb2.AgentInfo]:
        return [_info(agent) for agent in self.agents.values()]

    def _own(self, agent_id: str, cred: PeerCred) -> Agent:
        agent = self.agents.get(agent_id)
        if agent is None:
            raise RefusedRequest("NOT_FOUND", f"no agent {agent_id!r} is registered (register first)")
        if agent.cred.pid != cred.pid and cred.uid != 0:
            raise RefusedRequest("PERMISSION_DENIED", f"agent {agent_id!r} belongs to another process")
        return agent

    def _drop(self, agent: Agent) -> None:
        info = _info(agent)  # what it had published when it left
        for key in list(agent.keys):
            self._forget(agent, key)
        del self.agents[agent.info.agent_id]
        self._on_change(info, False)

    def _forget(self, agent: Agent, key: str) -> None:
        agent.keys.discard(key)
        self._owner.pop(key, None)
        self._store.delete(key)


def _on_backup(paths: common_pb2.QpPaths) -> Counter[str]:
    """default device -> QPs on a backup, from an agent's picture of its QPs' paths."""
    counts: Counter[str] = Counter()
    for path in paths.paths:
        if path.device != path.default_device:
            counts[path.default_device] += path.qps
    return counts


def _split_counts(keys) -> tuple[int, int]:
    qps = sum(1 for key in keys if key.startswith("qp/"))
    return qps, len(keys) - qps


def _info(agent: Agent) -> common_pb2.AgentInfo:
    """The agent's record with its mapping counts as they are now."""
    info = common_pb2.AgentInfo()
    info.CopyFrom(agent.info)
    info.qp_mappings, info.mr_mappings = _split_counts(agent.keys)
    info.qps_on_backup = sum(agent.on_backup.values())
    return info


def _gid(text: str) -> str:
    _check_gid("gid", text)
    return text


def _check_gid(field_name: str, text: str) -> None:
    try:
        canonical_gid(text)
    except ValueError:
        raise RefusedRequest(
            "INVALID_ARGUMENT", f"{field_name}: {text[:64]!r} is not a GID (IPv6 text)"
        ) from None


def _check_text(field_name: str, text: str) -> None:
    if len(text) > MAX_TEXT:
        raise RefusedRequest("INVALID_ARGUMENT", f"{field_name}: longer than {MAX_TEXT} characters")


def _check_endpoint(field_name: str, endpoint: common_pb2.Endpoint) -> None:
    _check_gid(f"{field_name}.gid", endpoint.gid)
    if endpoint.qpn >= 1 << 24:
        raise RefusedRequest(
            "INVALID_ARGUMENT", f"{field_name}.qpn: {endpoint.qpn} is not a 24-bit QP number"
        )
    if endpoint.psn >= 1 << 24:
        raise RefusedRequest("INVALID_ARGUMENT", f"{field_name}.psn: {endpoint.psn} is not a 24-bit PSN")
    _check_text(f"{field_name}.device", endpoint.device)
    if len(endpoint.provider_data) > MAX_PROVIDER_DATA:
        raise RefusedRequest(
            "INVALID_ARGUMENT", f"{field_name}.provider_data: more than {MAX_PROVIDER_DATA} entries"
        )
    for key, value in endpoint.provider_data.items():
        _check_text(f"{field_name}.provider_data key", key)
        _check_text(f"{field_name}.provider_data[{key[:32]}]", value)
