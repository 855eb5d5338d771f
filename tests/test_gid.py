"""libshift.gid: the one GID spelling that shiftd's etcd keys and libshift's endpoints share."""

from __future__ import annotations

import pytest

from libshift.gid import canonical_gid, gid_of_ipv4, ipv4_of_gid


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("::ffff:198.18.0.10", "::ffff:198.18.0.10"),
        ("0:0:0:0:0:ffff:c612:a", "::ffff:198.18.0.10"),  # how pyverbs and sysfs write it
        ("0000:0000:0000:0000:0000:ffff:c612:000a", "::ffff:198.18.0.10"),
        ("::FFFF:C612:A", "::ffff:198.18.0.10"),
        ("fe80:0000:0000:0000:0000:0000:0000:0001", "fe80::1"),
        ("FD00::1", "fd00::1"),
        ("::1", "::1"),
    ],
)
def test_one_spelling_whatever_wrote_it(text: str, canonical: str) -> None:
    assert canonical_gid(text) == canonical


@pytest.mark.parametrize("text", ["not-a-gid", "", "198.18.0.10", "::ffff:198.18.0.300", " ::1"])
def test_text_that_is_no_ipv6_address_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        canonical_gid(text)


def test_the_gid_of_an_ipv4_address_is_ipv4_mapped_and_canonical() -> None:
    assert gid_of_ipv4("198.18.0.10") == "::ffff:198.18.0.10"
    assert canonical_gid(gid_of_ipv4("198.18.0.10")) == gid_of_ipv4("198.18.0.10")
    with pytest.raises(ValueError):
        gid_of_ipv4("fe80::1")


@pytest.mark.parametrize("gid", ["::ffff:198.18.0.10", "0:0:0:0:0:ffff:c612:a"])
def test_the_ipv4_address_inside_a_mapped_gid(gid: str) -> None:
    assert ipv4_of_gid(gid) == "198.18.0.10"


@pytest.mark.parametrize("gid", ["fe80::1", "::1", "not-a-gid", "198.18.0.10"])
def test_a_gid_that_is_not_ipv4_mapped_has_no_ipv4_address(gid: str) -> None:
    with pytest.raises(ValueError, match=r"^GID '.*' is not an IPv4-mapped IPv6 address$"):
        ipv4_of_gid(gid)
