"""Fault injection on the netdevs of the current network namespace (shiftd's own, in the lab).

Faults are real, so that the monitors and the tcp provider see exactly what a broken NIC does:
DOWN sets the link down (the veth peer loses carrier); BLACKHOLE keeps link and carrier up but
drops every packet both ways, the gray failure that only a timeout reveals; FLAP toggles the link
until cleared. The black hole is a clsact qdisc with a one-instruction classic BPF filter
("return TC_ACT_SHOT") in direct-action mode on ingress and egress: it needs neither act_gact
nor cls_matchall, which minimal kernels lack. pyroute2 cannot send classic BPF filters, so those
two filters go through `tc`; everything else is netlink.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from pyroute2 import AsyncIPRoute
from pyroute2.netlink.exceptions import NetlinkError

from shiftd.nic import FaultMode

log = logging.getLogger(__name__)

# classic BPF of 1 instruction, BPF_RET|BPF_K with k = 2 (TC_ACT_SHOT), run in direct-action mode
DROP_ALL_FILTER = ("protocol", "all", "bpf", "bytecode", "1,6 0 0 2", "da")


class FaultError(RuntimeError):
    """A fault cannot be applied or cleared; str() is one line for the operator."""


class FaultInjector:
    """Applies and clears faults; one fault per netdev at a time, a new one replaces the old."""

    def __init__(self, flap_period: float = 1.0) -> None:
        _check_period(flap_period)
        self.flap_period = flap_period
        self._active: dict[str, FaultMode] = {}
        self._flappers: dict[str, asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()

    def active(self, netdev: str) -> FaultMode:
        return self._active.get(netdev, FaultMode.NONE)

    async def apply(self, netdev: str, mode: FaultMode, period: float | None = None) -> None:
        """Inject `mode` on `netdev`; FLAP toggles every period/2 (down half, up half)."""
        if mode == FaultMode.NONE:
            await self.clear(netdev)
            return
        period = self.flap_period if period is None else period
        _check_period(period)
        async with self._lock, AsyncIPRoute() as ipr:
            index = await _index(ipr, netdev)
            await self._undo(ipr, netdev, index)
            if mode == FaultMode.DOWN:
                await ipr.link("set", index=index, state="down")
            elif mode == FaultMode.BLACKHOLE:
                await _blackhole(ipr, netdev, index)
            elif mode == FaultMode.FLAP:
                self._flappers[netdev] = asyncio.create_task(_flap(netdev, index, period))
            else:
                raise FaultError(f"unknown fault mode {mode!r}")
            self._active[netdev] = FaultMode(mode)
        log.info("fault %s applied to %s", FaultMode(mode).name, netdev)

    async def clear(self, netdev: str) -> None:
        """Undo any fault on `netdev`: stop flapping, remove the black hole, set the link up.

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
            flapper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flapper
        if "clsact" in [q.get("kind") async for q in await ipr.get_qdiscs(index=index)]:
            await ipr.tc("del", "clsact", index)
        await ipr.link("set", index=index, state="up")
        self._active.pop(netdev, None)


def _check_period(period: float) -> None:
    if not period > 0:
        raise FaultError(f"flap period must be greater than 0, not {period}")


async def _index(ipr: AsyncIPRoute, netdev: str) -> int:
    indexes = await ipr.link_lookup(ifname=netdev)
    if not indexes:
        raise FaultError(f"no network interface {netdev!r} in this namespace")
    return indexes[0]


async def _blackhole(ipr: AsyncIPRoute, netdev: str, index: int) -> None:
    await ipr.tc("add", "clsact", index)
    try:
        for direction in ("ingress", "egress"):
            await _run_tc("filter", "add", "dev", netdev, direction, *DROP_ALL_FILTER)
    except BaseException:
        await ipr.tc("del", "clsact", index)  # half a black hole would be a different fault
        raise


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
