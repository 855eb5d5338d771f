"""GIDs as text: the one spelling shiftd's etcd keys and libshift's endpoints share.

A publisher and a looker-up must build the same key for the same GID, whatever wrote it (sysfs and pyverbs
write eight 4-digit groups). Standard library only and no other libshift import: shiftd imports this module.
"""

from __future__ import annotations

import ipaddress


def canonical_gid(text: str) -> str:
    """`::ffff:a.b.c.d` for IPv4-mapped GIDs (RoCEv2 over IPv4), compressed IPv6 otherwise.

    Raises ValueError for text that is not an IPv6 address.
    """
    address = ipaddress.IPv6Address(text)
    if address.ipv4_mapped is not None:
        return gid_of_ipv4(str(address.ipv4_mapped))
    return address.compressed


def gid_of_ipv4(address: str) -> str:
    """The RoCEv2-style GID of an IPv4 address; ValueError if `address` is not one."""
    return f"::ffff:{ipaddress.IPv4Address(address)}"


def ipv4_of_gid(gid: str) -> str:
    """The IPv4 address inside an IPv4-mapped GID (`::ffff:198.18.0.10`); ValueError for any other GID."""
    try:
        mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    except ValueError:
        mapped = None
    if mapped is None:
        raise ValueError(f"GID {gid!r} is not an IPv4-mapped IPv6 address")
    return str(mapped)
