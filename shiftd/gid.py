"""GIDs as text: one canonical spelling, so a publisher and a looker-up build the same etcd key."""

from __future__ import annotations

import ipaddress


def canonical_gid(text: str) -> str:
    """`::ffff:a.b.c.d` for IPv4-mapped GIDs (RoCEv2 over IPv4), compressed IPv6 otherwise.

    Raises ValueError for text that is not an IPv6 address.
    """
    address = ipaddress.IPv6Address(text)
    if address.ipv4_mapped is not None:
        return f"::ffff:{address.ipv4_mapped}"
    return address.compressed


def gid_of_ipv4(address: str) -> str:
    """The RoCEv2-style GID of an IPv4 address."""
    return f"::ffff:{ipaddress.IPv4Address(address)}"
