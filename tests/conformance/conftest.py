"""Fixtures of the verbs conformance suite: a two-host fabric, and connected RC QP pairs on it.

The test bodies use only the verbs API. Everything provider-specific lives here: which devices the two
hosts have and how a link is broken. SHIFT_TEST_PROVIDER picks the providers, a comma-separated list
(default `tcp`: every test runs on each); the tcp fabric is a lab of two hosts (`shift-lab`, prefix `vx`)
whose links shiftd breaks (`shiftctl fail-nic`, down or black hole), removed at the end of the session.

SHIFT_TEST_PROVIDER=verbs runs the suite on this host's RNICs: both sides on the first device (QPs of one
RNIC reach each other through it), or on the two named in SHIFT_TEST_VERBS_DEVICES=mlx5_0,mlx5_1 (which
must share a fabric). Without a device every test is skipped with the reason. Link faults take the first
device's netdev down, so they run only with SHIFT_TEST_VERBS_BREAK_LINK=1; a black hole is tc's on a
software device's netdev (Soft-RoCE sends through the kernel's stack) and cannot be made with tc on an RNIC
(RDMA bypasses the kernel's stack), where those cases are skipped.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from labs import running_lab

from libshift.verbs import CQ, MR, PD, QP, WC, CompChannel, Context, QPAttr, QPCap, QPInitAttr
from libshift.verbs import enums as e
from shiftlab.lab import Lab
from shiftlab.rxe.network import SYSFS_IB

PROVIDERS = os.environ.get("SHIFT_TEST_PROVIDER", "tcp").split(",")
ALL_ACCESS = e.ALL_ACCESS


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test here is a lab test; one marked `only_on(providers...)` is left out (deselected, not
    skipped) for any other provider of the run."""
    here = os.path.dirname(__file__)
    kept, left_out = [], []
    for item in items:
        if not str(item.fspath).startswith(here):
            kept.append(item)
            continue
        item.add_marker(pytest.mark.lab)
        only_on = item.get_closest_marker("only_on")
        callspec = getattr(item, "callspec", None)
        provider = callspec.params.get("fabric") if callspec else None
        (left_out if only_on and provider not in only_on.args else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


class LabLink:
    """Host h0's NIC on the lab fabric, broken for real by its shiftd, as an operator would with shiftctl."""

    def __init__(self, lab: Lab, host: str = "h0", device: str = "mlx5_0") -> None:
        self._lab, self._host, self._device = lab, host, device

    def _shiftctl(self, *args: str) -> None:
        argv, env = self._lab.exec_command(self._host, ["shiftctl", *args])
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr

    def down(self) -> None:
        self._shiftctl("fail-nic", self._device, "--mode", "down")

    def blackhole(self) -> None:
        self._shiftctl("fail-nic", self._device, "--mode", "blackhole")

    def restore(self) -> None:
        self._shiftctl("recover-nic", self._device)


class HostLink:
    """A verbs device's link on this host, taken down and up with ip(8). A software device (rxe, siw: no
    PCI device under its sysfs entry) sends through the kernel's stack, so tc's blackhole qdisc on its
    netdev drops its packets as a dead switch port would; an RNIC's traffic bypasses tc."""

    def __init__(self, device: str, netdev: str) -> None:
        self._netdev = netdev
        self._software = not (SYSFS_IB / device / "device").exists()

    def _run(self, *argv: str) -> None:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr

    def down(self) -> None:
        self._run("ip", "link", "set", "dev", self._netdev, "down")

    def blackhole(self) -> None:
        if not self._software:
            pytest.skip("a tc black hole does not stop RDMA: an RNIC's traffic bypasses the kernel's stack")
        self._run("tc", "qdisc", "replace", "dev", self._netdev, "root", "blackhole")

    def restore(self) -> None:
        if self._software:  # no such qdisc when the test took the link down instead
            subprocess.run(["tc", "qdisc", "del", "dev", self._netdev, "root"], capture_output=True)
        self._run("ip", "link", "set", "dev", self._netdev, "up")


@dataclass
class Fabric:
    devices: tuple[str, str]
    link: LabLink | HostLink | None  # None: links are not broken on this fabric (skip_reason says why)
    skip_reason: str = ""


def _tcp_fabric() -> Iterator[Fabric]:
    """Two lab hosts (h0, h1) on one rail; the devices are their mlx5_0, each in its host's namespace."""
    with running_lab("vx", hosts=2, nics=1) as lab, pytest.MonkeyPatch.context() as env:
        netdev = lab.shape.netdev(0)
        env.setenv(
            "SHIFT_TCP_DEVICES", f"vx_a={netdev}@{lab.namespace('h0')},vx_b={netdev}@{lab.namespace('h1')}"
        )
        yield Fabric(devices=("vx_a", "vx_b"), link=LabLink(lab))


def _verbs_fabric() -> Iterator[Fabric]:
    """This host's RNICs (see the module's docstring); every test skips, with the reason, without one."""
    from libshift.providers.verbs import VerbsProvider

    provider = VerbsProvider()
    devices = {device.name: device for device in provider.devices()}
    if not devices:
        pytest.skip(f"SHIFT_TEST_PROVIDER=verbs: {provider.unavailable}")
    named = [n for n in os.environ.get("SHIFT_TEST_VERBS_DEVICES", "").split(",") if n]
    a, b = (named * 2)[:2] if named else [min(devices)] * 2
    missing = [n for n in (a, b) if n not in devices]
    if missing:
        pytest.fail(f"SHIFT_TEST_VERBS_DEVICES names {missing}; this host has {sorted(devices)}")
    if os.environ.get("SHIFT_TEST_VERBS_BREAK_LINK") == "1":
        yield Fabric(devices=(a, b), link=HostLink(a, devices[a].netdev))
    else:
        yield Fabric((a, b), None, "link faults take a real NIC down: set SHIFT_TEST_VERBS_BREAK_LINK=1")


FABRICS = {"tcp": _tcp_fabric, "verbs": _verbs_fabric}


@pytest.fixture(scope="session", params=PROVIDERS)
def fabric(request: pytest.FixtureRequest) -> Iterator[Fabric]:
    if request.param not in FABRICS:
        pytest.fail(f"SHIFT_TEST_PROVIDER={request.param}: known providers are {', '.join(FABRICS)}")
    yield from FABRICS[request.param]()


@pytest.fixture
def link(fabric: Fabric) -> Iterator[LabLink | HostLink]:
    """The link between the hosts, restored after the test whatever the test did to it."""
    if fabric.link is None:
        pytest.skip(fabric.skip_reason)
    yield fabric.link
    fabric.link.restore()


@pytest.fixture(scope="session")
def contexts(fabric: Fabric) -> Iterator[tuple[Context, Context]]:
    a, b = Context(name=fabric.devices[0]), Context(name=fabric.devices[1])
    yield a, b
    a.close()
    b.close()


@pytest.fixture(scope="session")
def max_sge(contexts: tuple[Context, Context]) -> int:
    """The SGEs a WR may carry on both devices: their max_sge (rxe: 32; mlx5: 30; tcp: 64)."""
    return min(ctx.query_device().max_sge for ctx in contexts)


@dataclass
class Side:
    """One end of a connection: its PD, a CQ with a completion channel, a QP, and one MR."""

    ctx: Context
    pd: PD
    channel: CompChannel
    cq: CQ
    qp: QP
    mr: MR
    extra: list[MR] = field(default_factory=list)

    def reg(self, length: int, access: int = ALL_ACCESS) -> MR:
        mr = MR(self.pd, length, access)
        self.extra.append(mr)
        return mr

    def reg_buffer(self, buffer: object, length: int, access: int = ALL_ACCESS) -> MR:
        """Register the caller's own memory (closed with the side)."""
        mr = MR(self.pd, length, access, buffer)
        self.extra.append(mr)
        return mr

    def wait(self, count: int = 1, timeout: float = 10.0) -> list[WC]:
        """Exactly `count` completions (or fewer at the timeout), blocking on the channel meanwhile."""
        got: list[WC] = []
        deadline = time.monotonic() + timeout
        while len(got) < count:
            got += self.cq.poll(count - len(got))[1]
            if len(got) >= count:
                break
            self.cq.req_notify()
            got += self.cq.poll(count - len(got))[1]
            left = deadline - time.monotonic()
            if len(got) >= count or left <= 0:
                break
            try:
                self.channel.get_cq_event(timeout=left)
            except TimeoutError:
                break
        return got

    def close(self) -> None:
        for obj in (self.qp, self.mr, *self.extra, self.cq, self.channel, self.pd):
            obj.close()


@dataclass
class Pair:
    a: Side
    b: Side

    def connect(self, access: int = ALL_ACCESS, **attrs: int) -> None:
        connect(self.a, self.b, access, **attrs)


def connect(a: Side, b: Side, access: int = ALL_ACCESS, **attrs: int) -> None:
    """Bring both QPs to RTS towards each other, with QP attributes `attrs` (timeout, ...) on both sides."""
    ea, eb = a.qp.endpoint(), b.qp.endpoint()
    for side, remote in ((a, eb), (b, ea)):
        side.qp.to_init(QPAttr(qp_access_flags=access))
        side.qp.to_rtr(QPAttr(dest=remote, **attrs))
    for side in (a, b):
        side.qp.to_rts(QPAttr(**attrs))


MakePair = Callable[..., Pair]


@pytest.fixture
def make_pair(contexts: tuple[Context, Context]) -> Iterator[MakePair]:
    """make_pair(mr_size=..., cap=QPCap(...), cqe=..., sq_sig_all=..., connected=True, **qp_attrs)."""
    sides: list[Side] = []

    def side(ctx: Context, mr_size: int, cap: QPCap, cqe: int, sq_sig_all: bool) -> Side:
        pd = PD(ctx)
        channel = CompChannel(ctx)
        cq = CQ(ctx, cqe, channel=channel)
        qp = QP(pd, QPInitAttr(scq=cq, rcq=cq, cap=cap, sq_sig_all=sq_sig_all))
        made = Side(ctx, pd, channel, cq, qp, MR(pd, mr_size, ALL_ACCESS))
        sides.append(made)
        return made

    def make(
        mr_size: int = 1 << 16,
        cap: QPCap | None = None,
        cqe: int = 1024,
        sq_sig_all: bool = False,
        connected: bool = True,
        **attrs: int,
    ) -> Pair:
        pair = Pair(*(side(ctx, mr_size, cap or QPCap(), cqe, sq_sig_all) for ctx in contexts))
        if connected:
            pair.connect(**attrs)
        return pair

    yield make
    for made in sides:
        made.close()


@pytest.fixture
def pair(make_pair: MakePair) -> Pair:
    return make_pair()
