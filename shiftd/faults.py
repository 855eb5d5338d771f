"""Fault injection on the netdevs of the current network namespace (shiftd's own, in the lab).

Faults are real, so that the monitors and the tcp provider see exactly what a broken NIC does:
DOWN sets the link down (the veth peer loses carrier); BLACKHOLE keeps link and carrier up but
drops every packet both ways, the gray failure that only a timeout reveals; FLAP toggles the link
until cleared; LOSSY drops each packet, both ways, with a given chance; SLOW limits what the NIC
sends to a rate (tbf, the kernel's token bucket; shaping what arrives would need an ifb device).

BLACKHOLE and LOSSY are a clsact qdisc with a classic BPF filter in direct-action mode on ingress
and egress, whose return value is the packet's verdict: "drop" for the black hole, "drop when the
kernel's random number is below the loss" for LOSSY. They need neither act_gact, cls_matchall nor
sch_netem, which minimal kernels lack (the lab's has none of them). pyroute2 can send neither
classic BPF filters nor tbf's 64-bit rates, so those go through `tc`; everything else is netlink.
"""

from __future__ import annotations

import asyncio
import logging

from pyroute2 import AsyncIPRoute
from pyroute2.netlink.exceptions import NetlinkError

from shiftd.fault_spec import Fault, format_rate
from shiftd.nic import FaultMode
from shiftd.tasks import cancel_and_wait

log = logging.getLogger(__name__)

# classic BPF, one instruction: BPF_RET|BPF_K with k = 2 (TC_ACT_SHOT)
DROP_ALL_PROGRAM = "1,6 0 0 2"
# BPF_LD|BPF_W|BPF_ABS of SKF_AD_OFF + SKF_AD_RANDOM (a random u32), as classic BPF's k (unsigned)
LOAD_RANDOM = f"32 0 0 {(-0x1000 + 56) & 0xFFFFFFFF}"
TBF_HANDLE = 0x5FF00000  # tbf's handle 5ff0: marks our rate limit, so no other root qdisc is removed
TC_H_ROOT = 0xFFFFFFFF
TBF_LATENCY = "50ms"  # how long a packet may wait in the bucket before it is dropped
TBF_MIN_BURST = 65536  # bytes: one whole GSO segment passes at once


class FaultError(RuntimeError):
    """A fault cannot be applied or cleared; str() is one line for the operator."""


class FaultInjector:
    """Applies and clears faults; one fault per netdev at a time, a new one replaces the old."""

    def __init__(self, flap_period: float = 1.0) -> None:
        if not flap_period > 0:
            raise FaultError(f"flap period must be greater than 0, not {flap_period}")
        self.flap_period = flap_period
        self._active: dict[str, Fault] = {}
        self._flappers: dict[str, asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()

    def active(self, netdev: str) -> FaultMode:
        fault = self._active.get(netdev)
        return FaultMode.NONE if fault is None else fault.mode

    async def apply(self, netdev: str, fault: Fault) -> None:
        """Inject `fault` on `netdev`; FLAP toggles every period/2 (down half, up half)."""
        if fault.mode == FaultMode.NONE:
            await self.clear(netdev)
            return
        async with self._lock, AsyncIPRoute() as ipr:
            index = await _index(ipr, netdev)
            await self._undo(ipr, netdev, index)
            if fault.mode == FaultMode.DOWN:
                await ipr.link("set", index=index, state="down")
            elif fault.mode == FaultMode.BLACKHOLE:
                await _filter_both_ways(ipr, netdev, index, DROP_ALL_PROGRAM)
            elif fault.mode == FaultMode.LOSSY:
                await _filter_both_ways(ipr, netdev, index, random_drop_program(fault.loss_percent))
            elif fault.mode == FaultMode.SLOW:
                await _rate_limit(netdev, fault.rate_bits)
            elif fault.mode == FaultMode.FLAP:
                period = self.flap_period if fault.period is None else fault.period
                self._flappers[netdev] = asyncio.create_task(_flap(netdev, index, period))
            else:
                raise FaultError(f"unknown fault mode {fault.mode!r}")
            self._active[netdev] = fault
        log.info("fault %s applied to %s", fault.describe(), netdev)

    async def clear(self, netdev: str) -> None:
        """Undo any fault on `netdev`: stop flapping, remove the filters and the rate limit, set the
        link up.

        It acts even when this injector applied nothing, so a daemon restarted mid-fault can
        still recover the NIC.
        """
        async with self._lock, AsyncIPRoute() as ipr:
            await self._undo(ipr, netdev, await _index(ipr, netdev))
        log.info("faults cleared on %s", netdev)

    async def close(self) -> None:
        """Clear every fault this injector applied (shiftd's clean stop leaves no NIC broken)."""
        for netdev in list(self._active):
            try:
                await self.clear(netdev)
            except FaultError as exc:  # the netdev went away meanwhile: nothing left to undo
                log.warning("%s", exc)
                self._active.pop(netdev, None)

    async def _undo(self, ipr: AsyncIPRoute, netdev: str, index: int) -> None:
        flapper = self._flappers.pop(netdev, None)
        if flapper is not None:
            await cancel_and_wait([flapper])
        qdiscs = [(q.get("kind"), q["handle"]) async for q in await ipr.get_qdiscs(index=index)]
        if any(kind == "clsact" for kind, _ in qdiscs):
            await ipr.tc("del", "clsact", index)
        if ("tbf", TBF_HANDLE) in qdiscs:
            await ipr.tc("del", index=index, handle=TBF_HANDLE, parent=TC_H_ROOT)
        await ipr.link("set", index=index, state="up")
        self._active.pop(netdev, None)


async def _index(ipr: AsyncIPRoute, netdev: str) -> int:
    indexes = await ipr.link_lookup(ifname=netdev)
    if not indexes:
        raise FaultError(f"no network interface {netdev!r} in this namespace")
    return indexes[0]


def random_drop_program(percent: float) -> str:
    """Classic BPF that drops a packet when a random u32 is below percent% of 2^32:
    ld rand; jge #threshold, pass, drop; ret #TC_ACT_OK; ret #TC_ACT_SHOT."""
    threshold = min(int(percent / 100 * 2**32), 2**32 - 1)
    return f"4,{LOAD_RANDOM},53 0 1 {threshold},6 0 0 0,6 0 0 2"


async def _filter_both_ways(ipr: AsyncIPRoute, netdev: str, index: int, program: str) -> None:
    classifier = ("bpf", "bytecode", program, "da")
    await ipr.tc("add", "clsact", index)
    try:
        for direction in ("ingress", "egress"):
            await _run_tc("filter", "add", "dev", netdev, direction, "protocol", "all", *classifier)
    except BaseException:
        await ipr.tc("del", "clsact", index)  # half a fault would be a different fault
        raise


def tbf_shape(rate_bits: int, latency: str = TBF_LATENCY) -> tuple[str, ...]:
    """`tc`'s arguments of a tbf qdisc limiting what passes to `rate_bits` a second, a packet waiting
    `latency` at most before it is dropped."""
    burst = max(TBF_MIN_BURST, rate_bits // 8000)  # and at least a millisecond's worth at the rate
    return ("tbf", "rate", format_rate(rate_bits), "burst", str(burst), "latency", latency)


async def _rate_limit(netdev: str, rate_bits: int) -> None:
    handle = f"{TBF_HANDLE >> 16:x}:"
    await _run_tc("qdisc", "add", "dev", netdev, "root", "handle", handle, *tbf_shape(rate_bits))


async def _run_tc(*args: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        "tc", *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await proc.communicate()
    if proc.returncode != 0:
        message = stderr.decode(errors="replace").strip().splitlines()
        raise FaultError(f"tc {' '.join(args)}: {message[0] if message else f'exit {proc.returncode}'}")


async def _flap(netdev: str, index: int, period: float) -> None:
    """Toggle the link down and up every period/2 until cancelled."""
    try:
        async with AsyncIPRoute() as ipr:
            while True:
                for state in ("down", "up"):
                    await ipr.link("set", index=index, state=state)
                    await asyncio.sleep(period / 2)
    except NetlinkError as exc:  # typically the interface went away
        log.warning("stopped flapping %s: %s", netdev, exc)
