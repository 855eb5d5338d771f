"""An agent's published mappings (libshift/published.py): what a NIC's new GID makes it publish again, and
what a withdrawal takes with it."""

from __future__ import annotations

from libshift.api.shift.v1 import common_pb2
from libshift.published import published_mrs, published_qps

A, B, C = "::ffff:198.18.0.10", "::ffff:198.18.1.10", "::ffff:198.18.0.99"
D = "::ffff:198.18.0.100"


def qp(primary_gid: str, qpn: int, backup_gid: str) -> common_pb2.QpMapping:
    return common_pb2.QpMapping(
        primary=common_pb2.Endpoint(gid=primary_gid, qpn=qpn, device="mlx5_0"),
        backup=common_pb2.Endpoint(gid=backup_gid, qpn=qpn + 1, device="mlx5_1"),
    )


def test_a_qp_mapping_under_a_new_gid_is_published_under_both_and_withdrawn_with_both() -> None:
    book = published_qps()
    book.put(qp(A, 256, B))
    book.put(qp(B, 512, A))  # a deeper link: its backup is on the NIC that changes
    # the GID as sysfs spells it is the same GID
    assert book.readdress("0:0:0:0:0:ffff:c612:a", C) == [qp(C, 256, B), qp(B, 512, C)]
    by_key = {(m.primary.gid, m.primary.qpn): m for m in book.values()}
    assert by_key == {(A, 256): qp(A, 256, B), (C, 256): qp(C, 256, B), (B, 512): qp(B, 512, C)}
    # a second change: the mapping is under each GID its NIC has had
    book.readdress(C, D)
    assert sorted((m.primary.gid, m.backup.gid) for m in book.values()) == sorted(
        [(A, B), (C, B), (D, B), (B, D)]
    )
    withdrawn = book.pop((D, 256))  # the QP's endpoint as it names itself now
    assert sorted(m.primary.gid for m in withdrawn) == sorted([A, C, D])
    assert [(m.primary.gid, m.primary.qpn) for m in book.values()] == [(B, 512)]
    assert book.pop((A, 256)) == []


def test_an_mr_mapping_follows_both_its_gids() -> None:
    book = published_mrs()
    book.put(common_pb2.MrMapping(gid=A, rkey=0x51, backup_gid=B, backup_rkey=0x52))
    book.put(common_pb2.MrMapping(gid=B, rkey=0x61, backup_gid=A, backup_rkey=0x62))
    changed = book.readdress(A, C)
    assert sorted((m.gid, m.rkey, m.backup_gid) for m in changed) == [
        (C, 0x51, B),  # under the new GID too
        (B, 0x61, C),  # pointing at the new GID
    ]
    assert len(book) == 3
    assert book.readdress(A, C) == []  # told twice: nothing more to publish
    assert {m.gid for m in book.pop((A, 0x51))} == {A, C}
