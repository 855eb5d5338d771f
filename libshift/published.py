"""The backup mappings an agent has published, kept to publish again and to follow a NIC's new GID.

A restarted shiftd knows nothing of an agent's mappings: the agent publishes them all again when it
registers. A NIC of this host that comes back with another address has another GID: a peer that connects
from then on names the new GID in its lookups, and one connected before still names the old one. So each
mapping under the old GID is also published under the new one (an alias, withdrawn with it), and each that
points at the old GID points at the new one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from libshift.api.shift.v1 import common_pb2
from libshift.gid import canonical_gid

M = TypeVar("M", common_pb2.QpMapping, common_pb2.MrMapping)
Key = tuple[str, int]


class Published(Generic[M]):
    """Mappings by their key (GID, QPN or rkey); each key's aliases under the other GIDs of its NIC."""

    def __init__(self, key_of: Callable[[M], Key], readdress: Callable[[M, str, str, bool], M]) -> None:
        self._key_of = key_of
        # a copy of the mapping with the GID `old` made `new` where it points, and in its key if told
        self._readdress = readdress
        self._mappings: dict[Key, M] = {}
        self._aliases: dict[Key, set[Key]] = {}  # key -> every key of the same mapping (itself included)

    def __len__(self) -> int:
        return len(self._mappings)

    def values(self) -> list[M]:
        return list(self._mappings.values())

    def put(self, mapping: M) -> None:
        key = self._key_of(mapping)
        self._mappings[key] = mapping
        self._aliases.setdefault(key, {key})

    def pop(self, key: Key) -> list[M]:
        """The mapping under `key` and its aliases, forgotten: all to withdraw."""
        keys = self._aliases.pop(key, {key})
        for alias in keys - {key}:
            self._aliases.pop(alias, None)
        return [m for m in (self._mappings.pop(k, None) for k in keys) if m is not None]

    def readdress(self, old: str, new: str) -> list[M]:
        """Our NIC's GID `old` is `new` now: the mappings to publish (again) for it."""
        old, new = canonical_gid(old), canonical_gid(new)
        changed: list[M] = []
        for key, mapping in list(self._mappings.items()):
            kept = self._readdress(mapping, old, new, False)  # what it points at, under the key it had
            if kept != mapping:
                self._mappings[key] = kept
                changed.append(kept)
            alias = self._readdress(mapping, old, new, True)  # and under the new GID too
            alias_key = self._key_of(alias)
            if alias_key != key and alias_key not in self._mappings:
                self._mappings[alias_key] = alias
                changed.append(alias)
                group = self._aliases.setdefault(key, {key})
                group.add(alias_key)
                self._aliases[alias_key] = group
        return changed


def _same(gid: str, old: str) -> bool:
    return gid_key(gid) == old


def _moved_endpoint(endpoint: common_pb2.Endpoint, old: str, new: str) -> common_pb2.Endpoint:
    moved = common_pb2.Endpoint()
    moved.CopyFrom(endpoint)
    if _same(endpoint.gid, old):
        moved.gid = new
    return moved


def readdress_qp(mapping: common_pb2.QpMapping, old: str, new: str, key: bool) -> common_pb2.QpMapping:
    primary = _moved_endpoint(mapping.primary, old, new) if key else mapping.primary
    return common_pb2.QpMapping(primary=primary, backup=_moved_endpoint(mapping.backup, old, new))


def readdress_mr(mapping: common_pb2.MrMapping, old: str, new: str, key: bool) -> common_pb2.MrMapping:
    gid = new if key and _same(mapping.gid, old) else mapping.gid
    backup_gid = new if _same(mapping.backup_gid, old) else mapping.backup_gid
    return common_pb2.MrMapping(
        gid=gid, rkey=mapping.rkey, backup_gid=backup_gid, backup_rkey=mapping.backup_rkey
    )


def gid_key(gid: str) -> str:
    """A GID as a key: canonical, or as written when it is not one (shiftd refuses it on publication)."""
    try:
        return canonical_gid(gid)
    except ValueError:
        return gid


def qp_key(mapping: common_pb2.QpMapping) -> Key:
    return (gid_key(mapping.primary.gid), mapping.primary.qpn)


def mr_key(mapping: common_pb2.MrMapping) -> Key:
    return (gid_key(mapping.gid), mapping.rkey)


def published_qps() -> Published[common_pb2.QpMapping]:
    return Published(qp_key, readdress_qp)


def published_mrs() -> Published[common_pb2.MrMapping]:
    return Published(mr_key, readdress_mr)
