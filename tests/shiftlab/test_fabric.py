"""The lab fabric on real namespaces, veths and bridges: shape, addresses, reachability, isolation.

Lab names start with `lbt` plus the test process id, so parallel runs and other suites never
collide; every test removes what it built.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pyroute2 import IPRoute

from shiftlab import fabric, netns, routekeeper, spine
from shiftlab.fabric import FabricError, Shape
from shiftlab.veth import VethPair

pytestmark = pytest.mark.lab


def root_links() -> set[str]:
    with IPRoute() as ipr:
        return {link.get("ifname") for link in ipr.get_links()}


def links(ns: str) -> dict[str, dict]:
    with IPRoute(netns=ns, flags=0) as ipr:
        return {link.get("ifname"): link for link in ipr.get_links()}


def addresses(ns: str) -> dict[str, set[str]]:
    """netdev -> {"a.b.c.d/len"} of the IPv4 addresses in `ns`."""
    with IPRoute(netns=ns, flags=0) as ipr:
        names = {link["index"]: link.get("ifname") for link in ipr.get_links()}
        found: dict[str, set[str]] = {}
        for addr in ipr.get_addr(family=2):
            found.setdefault(names[addr["index"]], set()).add(f"{addr.get('address')}/{addr['prefixlen']}")
    return found


@pytest.fixture(scope="module")
def lab() -> Iterator[Shape]:
    shape = Shape(f"lbt{os.getpid()}", hosts=2, nics=2)
    before = root_links()
    fabric.build(shape)
    try:
        yield shape
    finally:
        fabric.destroy(shape.name)
    assert root_links() == before


def test_every_namespace_exists(lab: Shape) -> None:
    expected = [
        f"{lab.name}-h0",
        f"{lab.name}-h1",
        f"{lab.name}-rail0",
        f"{lab.name}-rail1",
        f"{lab.name}-spine",
        f"{lab.name}-mgmt",
    ]
    assert lab.namespaces == expected
    assert sorted(fabric.present(lab.name)) == sorted(expected)


def test_hosts_have_named_nics_with_their_addresses(lab: Shape) -> None:
    for i in range(2):
        found = addresses(lab.host_ns(i))
        assert found["ens1f0np0"] == {f"198.18.0.{10 + i}/24"}
        assert found["ens2f0np0"] == {f"198.18.1.{10 + i}/24"}
        assert found["mgmt0"] == {f"198.19.0.{10 + i}/24"}
        assert found["lo"] == {"127.0.0.1/8"}
        host_links = links(lab.host_ns(i))
        assert set(host_links) == {"lo", "ens1f0np0", "ens2f0np0", "mgmt0"}
        assert all(link["flags"] & 1 for link in host_links.values()), "every link, lo included, is up"
        assert host_links["ens2f0np0"].get("address") == f"02:53:48:01:00:{i:02x}", "fixed MACs"
    assert lab.devices() == {"mlx5_0": "ens1f0np0", "mlx5_1": "ens2f0np0"}
    assert addresses(lab.mgmt_ns)["br0"] == {"198.19.0.1/24"}


def test_each_rail_switch_is_a_bridge_with_one_port_per_host_and_the_spine(lab: Shape) -> None:
    for ns, expected in [(lab.rail_ns(0), {"spine"}), (lab.rail_ns(1), {"spine"}), (lab.mgmt_ns, set())]:
        switch = links(ns)
        bridge = switch["br0"]["index"]
        ports = {name for name, link in switch.items() if link.get("master") == bridge}
        assert ports == {"h0", "h1"} | expected
        assert "lo" in switch and all(link["flags"] & 1 for link in switch.values())
    assert lab.spine_ns is not None
    assert addresses(lab.spine_ns) == {
        "lo": {"127.0.0.1/8"},
        "rail0": {"198.18.0.1/24"},
        "rail1": {"198.18.1.1/24"},
    }


def test_hosts_reach_each_other_on_every_rail_and_over_management(lab: Shape) -> None:
    for r in range(2):
        device = lab.netdev(r)
        assert fabric.ping(lab.host_ns(0), lab.rail_address(r, 1), device=device, timeout=2.0)
        assert fabric.ping(lab.host_ns(1), lab.rail_address(r, 0), device=device, timeout=2.0)
    assert fabric.ping(lab.host_ns(0), lab.mgmt_address(1), timeout=2.0)
    assert fabric.ping(lab.host_ns(1), fabric.MGMT_GATEWAY, timeout=2.0)


def rx_packets(ns: str, ifname: str) -> int:
    return links(ns)[ifname].get("IFLA_STATS64")["rx_packets"]


def test_rails_meet_only_at_the_spine(lab: Shape) -> None:
    assert lab.spine_ns is not None
    for i, j in ((0, 1), (1, 0), (0, 0)):  # to another host's NIC on the other rail, and to its own
        seen = rx_packets(lab.spine_ns, spine.leg(0))
        assert fabric.ping(lab.host_ns(i), lab.rail_address(1, j), device=lab.netdev(0), timeout=2.0)
        assert rx_packets(lab.spine_ns, spine.leg(0)) > seen  # through the spine, also within a host
    # The management network is no path between rails.
    assert not fabric.ping(lab.host_ns(0), lab.rail_address(0, 1), device="mgmt0", timeout=0.5)


def test_a_nic_set_up_again_gets_its_route_to_the_spine_back(lab: Shape) -> None:
    netdev = lab.netdev(1)
    with IPRoute(netns=lab.host_ns(0), flags=0) as ipr:
        netdevs = {r: lab.netdev(r) for r in range(lab.nics)}
        assert spine.missing(ipr, netdevs) == []
        index = ipr.link_lookup(ifname=netdev)[0]
        ipr.link("set", index=index, state="down")
        ipr.link("set", index=index, state="up")
        fabric.wait_operational(lab.host_ns(0), netdev)
        assert spine.missing(ipr, netdevs) == [1]  # the route went with the link
        assert not fabric.ping(lab.host_ns(0), lab.rail_address(0, 1), device=netdev, timeout=0.5)
        assert routekeeper.restore(lab, {0: ipr}) == [(0, 1)]
        assert spine.missing(ipr, netdevs) == []
    assert fabric.ping(lab.host_ns(0), lab.rail_address(0, 1), device=netdev, timeout=2.0)


def test_nothing_of_the_lab_is_in_the_root_namespace(lab: Shape) -> None:
    ours = {"ens1f0np0", "ens2f0np0", "mgmt0", "br0", "h0", "h1"}
    assert not ours & root_links()


def test_build_again_reuses_the_fabric_and_repairs_what_is_missing(lab: Shape) -> None:
    before = {ns: {name: link["index"] for name, link in links(ns).items()} for ns in lab.namespaces}
    fabric.build(lab)
    after = {ns: {name: link["index"] for name, link in links(ns).items()} for ns in lab.namespaces}
    assert after == before, "a second build must not recreate anything"

    with IPRoute(netns=lab.host_ns(1), flags=0) as ipr:
        ipr.link("del", index=ipr.link_lookup(ifname="ens2f0np0")[0])
    assert not fabric.ping(lab.host_ns(0), lab.rail_address(1, 1), timeout=0.5)
    fabric.build(lab)
    assert addresses(lab.host_ns(1))["ens2f0np0"] == {"198.18.1.11/24"}
    assert fabric.ping(lab.host_ns(0), lab.rail_address(1, 1), timeout=2.0)


def test_destroy_removes_everything_and_is_safe_twice() -> None:
    shape = Shape(f"lbt{os.getpid()}d", hosts=2, nics=1)
    before = root_links()
    fabric.build(shape)
    assert len(fabric.present(shape.name)) == 5  # a host each, a rail, the spine, management
    assert sorted(fabric.destroy(shape.name)) == sorted(shape.namespaces)
    assert fabric.present(shape.name) == []
    assert not any(netns.exists(ns) for ns in shape.namespaces)
    assert root_links() == before
    assert fabric.destroy(shape.name) == []


def test_a_build_failing_halfway_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    shape = Shape(f"lbt{os.getpid()}f", hosts=2, nics=2)
    before = root_links()
    real = fabric._ensure_nic
    calls = []

    def failing(*args: object) -> None:
        calls.append(args)
        if len(calls) == 4:  # h0 is done, h1's first NIC is not
            raise RuntimeError("injected failure")
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(fabric, "_ensure_nic", failing)
    with pytest.raises(RuntimeError, match="injected failure"):
        fabric.build(shape)
    assert len(calls) == 4
    assert fabric.present(shape.name) == []
    assert root_links() == before


def test_destroy_leaves_other_labs_alone(lab: Shape) -> None:
    """Lab `X` must not match lab `X-h0`'s namespaces, nor the other way round."""
    assert fabric.destroy(f"{lab.name}-h0") == []
    assert fabric.destroy(lab.name[:-1]) == []
    assert sorted(fabric.present(lab.name)) == sorted(lab.namespaces)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "-x"}, "lab name '-x'"),
        ({"name": "a/b"}, "lab name 'a/b'"),
        ({"hosts": 0}, "--hosts must be between 1 and 64, not 0"),
        ({"nics": 9}, "--nics must be between 1 and 8, not 9"),
    ],
)
def test_bad_shapes_are_refused_with_one_line(kwargs: dict, message: str) -> None:
    with pytest.raises(FabricError, match=message) as info:
        Shape(**kwargs)
    assert "\n" not in str(info.value)


def test_a_veth_pair_is_operational_before_it_is_handed_over() -> None:
    """Both ends UP as the kernel says it (the link watcher has attached their qdiscs), not only set up:
    what is sent at once must not be dropped."""
    with VethPair(f"vp{os.getpid() % 100000}", subnet="198.18.93") as pair:
        for host in pair.hosts:
            assert netns.run(host.netns, operstate, host.netdev) == "UP", host


def test_every_host_nic_is_operational_when_the_build_returns() -> None:
    """Asked at once: a shiftd started right after the build must find every NIC UP, not DOWN for the
    moment before the kernel's link watcher runs (and then held down for its hold-down)."""
    shape = Shape(f"lbo{os.getpid() % 100000}", hosts=2, nics=2)
    fabric.build(shape)
    try:
        for i in range(shape.hosts):
            states = {
                netdev: netns.run(shape.host_ns(i), operstate, netdev)
                for netdev in [*(shape.nic_netdev(i, r) for r in range(shape.nics)), shape.mgmt_netdev(i)]
            }
            assert set(states.values()) == {"UP"}, (i, states)
    finally:
        fabric.destroy(shape.name)


def operstate(netdev: str) -> str:
    with IPRoute() as ipr:
        (link,) = ipr.get_links(ifname=netdev)
        return link.get_attr("IFLA_OPERSTATE")
