"""One process of bench/fleet_scale.py's fleet: many simulated hosts, each a real shiftd registry client.

Every simulated host is a `shiftd.registry.Registry` of its own (its own gRPC channel, lease, reconciler,
watches), all on this process's event loop. The driver gives orders as JSON lines on stdin and reads the
answers on stdout (`stream_peer.say`); times are CLOCK_MONOTONIC, which every process of the machine shares.

    fleet_host.py --endpoints A:P,B:P,C:P --first 0 --count 250 [--probe-rate 0]

With --count 0 and --probe-rate R it is the prober: one registry that only looks up, R lookups a second, on
an otherwise idle process, so its latencies are etcd's under the fleet's load, not this simulator's queue.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import logging
import random
import resource
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fleet_layout import Fleet
from stream_peer import Orders, rss_kib, say

from shiftd.registry import Registry
from shiftd.registry_watch import PUT

PEER_WAIT = 10.0  # libshift's wait for a peer's backup at connect (libshift.shift.peers.PEER_WAIT)
SYNC_POLL = 0.02  # seconds between looks at every host's pending writes


class SimHost:
    """One simulated shiftd: its registry and what it has published."""

    def __init__(self, index: int, fleet: Fleet, registry: Registry) -> None:
        self.index = index
        self.fleet = fleet
        self.registry = registry
        self.job: int | None = None

    def publish(self, job: int) -> None:
        """A job starts: its agents publish every mapping (the old job's are withdrawn first)."""
        if self.job is not None:
            for key in self.fleet.publishes(self.index, self.job):
                self.registry.delete(key)
        for key, value in self.fleet.publishes(self.index, job).items():
            self.registry.put(key, value)
        self.job = job


async def timed(call: Awaitable[str | None]) -> tuple[float, float, bool]:
    """(start, seconds, found) of one lookup; an error counts as not found."""
    start = time.monotonic()
    try:
        found = await call is not None
    except Exception:
        found = False
    return start, time.monotonic() - start, found


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.fleet = Fleet(args.hosts, args.nics, args.qps, args.mrs, args.peers)
        endpoints = [(h, int(p)) for h, _, p in (e.rpartition(":") for e in args.endpoints.split(","))]
        options = {"lease_ttl": args.lease_ttl, "timeout": args.timeout, "spread": True}  # as shiftd
        options["peer_cache"] = not args.no_cache

        def registry(name: str) -> Registry:
            return Registry(endpoints, name, **options)

        self.hosts = [SimHost(i, self.fleet, registry(self.fleet.name(i))) for i in args.indexes]
        self.prober = registry(f"probe-{args.first}") if args.probe_rate else None
        self.probe_rate = args.probe_rate
        self.probes: list[tuple[float, float, bool, int]] = []  # start, s, found, 0 lookup / 1 get
        self.job = 0
        self.crashed: set[int] = set()

    @property
    def live(self) -> list[SimHost]:
        return [h for h in self.hosts if h.index not in self.crashed]

    async def start(self) -> dict[str, Any]:
        """Every host starts as shiftd does: a lease, its host record and its NICs' records."""
        t0 = time.monotonic()
        for host in self.hosts:
            await host.registry.start()
            for key, value in self.fleet.startup_records(host.index).items():
                host.registry.put(key, value)
        if self.prober is not None:
            await self.prober.start()
            asyncio.get_running_loop().create_task(self.probe())
        synced = await self.synced(self.hosts, 120.0)
        return {"up": True, "seconds": max(synced.values(), default=t0) - t0, "leases": self.leases()}

    def leases(self) -> dict[str, int]:
        return {h.registry.host: h.registry.lease_id or 0 for h in self.hosts}

    async def synced(self, hosts: list[SimHost], timeout: float) -> dict[int, float]:
        """When each host had every write in etcd (acknowledged: readable by anyone from then on)."""
        done: dict[int, float] = {}
        deadline = time.monotonic() + timeout
        while len(done) < len(hosts) and time.monotonic() < deadline:
            now = time.monotonic()
            for host in hosts:
                reg = host.registry
                if host.index not in done and not reg.pending and reg.lease_id is not None and reg.connected:
                    done[host.index] = now
            await asyncio.sleep(SYNC_POLL)
        return done

    # ---- the job start ----------------------------------------------------------------------------

    async def job_start(self, job: int, connect_concurrency: int, dead: list[int]) -> dict[str, Any]:
        """Every host publishes job `job` at once; its QPs then look up their peers' backups (with wait),
        `connect_concurrency` at a time per host, as its ranks connect (none to the `dead` hosts)."""
        self.job = job
        t0 = time.monotonic()
        for host in self.live:
            host.publish(job)
        connects = [self.connect(host, job, connect_concurrency, set(dead)) for host in self.live]
        synced, lookups = await asyncio.gather(self.synced(self.live, 300.0), asyncio.gather(*connects))
        flat = [sample for per_host in lookups for sample in per_host]
        return {
            "published": job,
            "t0": t0,
            "synced": [synced.get(h.index, -1.0) - t0 for h in self.live],
            "connect_lookups": [[start - t0, seconds, found] for start, seconds, found in flat],
        }

    async def connect(
        self, host: SimHost, job: int, concurrency: int, dead: set[int]
    ) -> list[tuple[float, float, bool]]:
        qps = [q for q in range(self.fleet.qps) if self.fleet.peer(host.index, q) not in dead]
        keys = [self.fleet.peer_qp_key(host.index, q, job) for q in qps]
        return await bounded([lambda k=k: host.registry.lookup(k, PEER_WAIT) for k in keys], concurrency)

    # ---- a rail fails -----------------------------------------------------------------------------

    async def storm(self, rail: int) -> dict[str, Any]:
        """NIC `rail` of every host goes down at once: each publishes its NIC's state and looks up its peers'
        backups (QP mapping and MR key) of every QP on that rail, with no wait: they were published."""
        t0 = time.monotonic()
        calls: list[Callable[[], Awaitable[str | None]]] = []
        for host in self.live:
            name = self.fleet.name(host.index)
            host.registry.put(f"nics/{name}/mlx5_{rail}", self.fleet.nic_record(host.index, rail, up=False))
            for q in range(rail, self.fleet.qps, self.fleet.nics):
                for key in (
                    self.fleet.peer_qp_key(host.index, q, self.job),
                    self.fleet.peer_mr_key(host.index, q, self.job),
                ):
                    calls.append(lambda r=host.registry, k=key: r.lookup(k))
        synced, samples = await asyncio.gather(self.synced(self.live, 120.0), bounded(calls, len(calls)))
        return {
            "stormed": rail,
            "t0": t0,
            "synced": [v - t0 for v in synced.values()],
            "lookups": [[start - t0, seconds, found] for start, seconds, found in samples],
        }

    async def recover(self, rail: int) -> dict[str, Any]:
        for host in self.live:
            name = self.fleet.name(host.index)
            host.registry.put(f"nics/{name}/mlx5_{rail}", self.fleet.nic_record(host.index, rail))
        synced = await self.synced(self.live, 120.0)
        return {"recovered": len(synced)}

    # ---- a host's lease lapses ----------------------------------------------------------------------

    async def watch_lapse(self, victim: int) -> dict[str, Any]:
        """Every host here whose QPs connect to `victim` watches the victim's QP mappings on its rails."""
        rails = {}
        for host in self.live:
            for q in range(self.fleet.qps):
                if self.fleet.peer(host.index, q) == victim:
                    rails.setdefault(host.index, set()).add(self.fleet.rail(q))
        self.lapse_seen: dict[int, float] = {}
        self.lapse_tasks = [
            asyncio.get_running_loop().create_task(self.await_lapse(h, victim, sorted(r)))
            for h, r in rails.items()
        ]
        await asyncio.sleep(0.5)  # the watches are created (etcd starts a "from now" watch at once)
        return {"watching": len(rails)}

    async def await_lapse(self, watcher: int, victim: int, rails: list[int]) -> None:
        registry = next(h.registry for h in self.hosts if h.index == watcher)
        gone = {k for k in self.fleet.publishes(victim, self.job) if k.startswith("qp/")}
        gone = {k for k in gone if any(k.startswith(f"qp/{self.fleet.gid(victim, r)}/") for r in rails)}
        events = [registry.watch_prefix(f"qp/{self.fleet.gid(victim, r)}/") for r in rails]
        queue: asyncio.Queue[str] = asyncio.Queue()

        async def pump(stream: Any) -> None:
            async for event in stream:
                if event.type != PUT:
                    await queue.put(event.key)

        pumps = [asyncio.get_running_loop().create_task(pump(s)) for s in events]
        try:
            while gone:
                gone.discard(await queue.get())
            self.lapse_seen[watcher] = time.monotonic()
        finally:
            for task in pumps:
                task.cancel()

    async def crash(self, victim: int) -> dict[str, Any]:
        """The victim's shiftd dies (SIGKILL): no revoke, its lease runs out."""
        host = next(h for h in self.hosts if h.index == victim)
        self.crashed.add(victim)
        await host.registry.stop(revoke=False)
        return {"crashed": victim, "at": time.monotonic()}

    async def lapse_result(self, timeout: float) -> dict[str, Any]:
        if self.lapse_tasks:
            await asyncio.wait(self.lapse_tasks, timeout=timeout)
        for task in self.lapse_tasks:
            task.cancel()
        return {"lapse_seen": list(self.lapse_seen.values()), "watchers": len(self.lapse_tasks)}

    # ---- lookups from an idle process ---------------------------------------------------------------

    async def probe(self) -> None:
        """`probe_rate` times a second, with no wait, in turn: a lookup as shiftd answers it, of a QP mapping
        of one host's peers (a real host looks up its own peers only), and a plain read of any QP mapping
        of the fleet from etcd (one linearizable Range: etcd's own latency under the load)."""
        assert self.prober is not None
        period = 1.0 / self.probe_rate
        pending: set[asyncio.Task[None]] = set()
        next_at = time.monotonic()
        for n in itertools.count():
            if n % 2 == 0:
                call = self.prober.lookup(
                    self.fleet.peer_qp_key(self.fleet.hosts // 2, n // 2 % self.fleet.qps, self.job)
                )
            else:
                host, qp = random.randrange(self.fleet.hosts), random.randrange(self.fleet.qps)
                call = self.prober.get(self.fleet.peer_qp_key(host, qp, self.job))
            task = asyncio.get_running_loop().create_task(self.probe_one(call, n % 2))
            pending.add(task)
            task.add_done_callback(pending.discard)
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def probe_one(self, call: Awaitable[str | None], kind: int) -> None:
        self.probes.append((*await timed(call), kind))

    # ---- the end ------------------------------------------------------------------------------------

    async def sync(self, timeout: float) -> dict[str, Any]:
        synced = await self.synced(self.live, timeout)
        return {"synced": len(synced), "of": len(self.live)}

    async def report(self) -> dict[str, Any]:
        errors: dict[str, int] = {}
        for host in self.hosts:
            for kind, n in host.registry.errors.items():
                errors[kind] = errors.get(kind, 0) + n
        gc.collect()
        return {
            "report": True,
            "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "live_hosts": len(self.live),
            "own_mappings": len(self.live) * (self.fleet.mappings_per_host + 1 + self.fleet.nics),
            "cached_mappings": sum(h.registry.cache.held for h in self.live),
            "cache_groups": sum(len(h.registry.cache) for h in self.live),
            "leases": self.leases(),
            "errors": errors,
            "running": sum(1 for h in self.live if h.registry.running),
            "probes": self.probes,
        }

    async def stop(self) -> None:
        await asyncio.gather(*(h.registry.stop() for h in self.live), return_exceptions=True)
        if self.prober is not None:
            await self.prober.stop()


async def bounded(
    calls: list[Callable[[], Awaitable[str | None]]], limit: int
) -> list[tuple[float, float, bool]]:
    """Run the calls, at most `limit` at a time, each timed."""
    gate = asyncio.Semaphore(max(1, limit))

    async def one(call: Callable[[], Awaitable[str | None]]) -> tuple[float, float, bool]:
        async with gate:
            return await timed(call())

    return list(await asyncio.gather(*(one(c) for c in calls)))


def dump_state(worker: Worker) -> None:
    """SIGUSR1: where a stuck run is (each host's writes and link, every task's stack) on stderr."""
    for host in worker.live:
        reg = host.registry
        print(
            f"{reg.host}: pending {reg.pending} lease {reg.lease_id} connected {reg.connected}",
            file=sys.stderr,
        )
    for task in asyncio.all_tasks():
        task.print_stack(limit=4, file=sys.stderr)


async def serve(args: argparse.Namespace) -> None:
    base = rss_kib()  # the interpreter and the imports, before any registry
    worker = Worker(args)
    orders = Orders()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, dump_state, worker)
    say(**await worker.start(), rss_kib=rss_kib(), rss_base_kib=base)
    handlers: dict[str, Callable[[Any], Awaitable[dict[str, Any]]]] = {
        "job": lambda o: worker.job_start(o["job"], o.get("concurrency", 4), o.get("dead", [])),
        "storm": lambda o: worker.storm(o["storm"]),
        "recover": lambda o: worker.recover(o["recover"]),
        "watch_lapse": lambda o: worker.watch_lapse(o["watch_lapse"]),
        "crash": lambda o: worker.crash(o["crash"]),
        "lapse_result": lambda o: worker.lapse_result(o["lapse_result"]),
        "sync": lambda o: worker.sync(o["sync"]),
        "report": lambda o: worker.report(),
    }
    while not (order := await loop.run_in_executor(None, orders.next, None) or {}).get("stop"):
        for name, handler in handlers.items():
            if name in order:
                cpu = time.process_time()
                answer = await handler(order)
                say(**answer, rss_kib=rss_kib(), cpu_seconds=time.process_time() - cpu)
    await worker.stop()
    say(done=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--hosts", type=int, required=True, help="hosts in the whole fleet")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=0, help="hosts this process simulates")
    parser.add_argument("--nics", type=int, default=2)
    parser.add_argument("--qps", type=int, default=64)
    parser.add_argument("--mrs", type=int, default=16)
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--lease-ttl", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--probe-rate", type=float, default=0.0)
    parser.add_argument("--no-cache", action="store_true", help="lookups straight from etcd (as before)")
    args = parser.parse_args()
    args.indexes = range(args.first, args.first + args.count)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
