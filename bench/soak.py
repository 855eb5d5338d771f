"""Soak: many agents, thousands of mappings, and a NIC failure and recovery every few seconds, for minutes.

A lab of --hosts hosts (default 4) x 2 NICs. On every host, --procs agent processes each hold --agents
libshift agents that publish --mappings synthetic QP mappings apiece; the first process of each host also
runs a two-way SEND stream over one ShiftQP with a process on its partner host (h0-h1, h2-h3, ...), every
message checked for order and content. Every --fault-every seconds one host in turn loses mlx5_0
(`shiftctl fail-nic`) and gets it back half-way to the next fault, so the streams fail over and fail back
again and again. At the end it reports failovers done, errors seen (target: none), each daemon's RSS at the
start and the end (target: flat), the mappings in etcd (target: all of them, still), and etcd's write rate
from its own /metrics.

    sudo .venv/bin/python bench/soak.py [--duration 600] [--hosts 4] [--json FILE]

`soak.py worker` is the agent process, run by the soak itself on a lab host; it speaks JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etcd_metrics import scrape
from stream_peer import hear, say

from libshift.agent import Agent
from libshift.gid import gid_of_ipv4
from libshift.shift import ShiftContext, ShiftCQ, ShiftMR, ShiftPD, ShiftQP
from libshift.verbs import SGE, WC, Endpoint, QPAttr, QPCap, QPInitAttr, RecvWR, SendWR
from libshift.verbs import enums as e
from shiftlab import netns
from shiftlab.etcdproc import EtcdError
from shiftlab.fabric import FabricError
from shiftlab.lab import Lab, LabError
from shiftlab.labproc import LabProcess, LabProcessError

# the synthetic mappings' QPNs: from here up to below 1024 << 8, under every tcp QPN (port << 8 | index,
# and a context's listeners are never on a privileged port)
SYNTHETIC_QPN, SYNTHETIC_END = 0x1000, 1024 << 8
SIZE = 256  # bytes a message
SLOTS = 16  # receives posted at a time
WINDOW = 8  # sends outstanding at a time
RATE = 200.0  # messages a second, each way
DRAIN_SECONDS = 30.0


# ---- the agent process, on a lab host ------------------------------------------------------------


def message(seq: int) -> bytes:
    return seq.to_bytes(8, "little") * (SIZE // 8)


class TwoWay:
    """One ShiftQP carrying SENDs both ways: this side's sends, and the peer's checked in order."""

    def __init__(self) -> None:
        self.ctx = ShiftContext(name="mlx5_0")
        self.pd = ShiftPD(self.ctx)
        self.cq = ShiftCQ(self.ctx, 4 * (SLOTS + WINDOW))
        self.mr = ShiftMR(self.pd, 2 * SLOTS * SIZE, e.IBV_ACCESS_LOCAL_WRITE)  # receive slots, send slots
        cap = QPCap(max_send_wr=2 * WINDOW, max_recv_wr=SLOTS)
        self.qp = ShiftQP(self.pd, QPInitAttr(scq=self.cq, rcq=self.cq, cap=cap))
        self.posted = self.completed = self.received = 0
        self.errors: list[str] = []

    def connect(self, peer: str) -> None:
        # REMOTE_WRITE although the application only SENDs: libshift's control traffic (the receiver
        # notification, failback messages) arrives as RDMA writes, which the QP's access flags must allow
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        self.qp.connect(Endpoint.from_json(peer), QPAttr(qp_access_flags=access))
        for slot in range(SLOTS):
            self._post_recv(slot)

    def _sge(self, slot: int, send: bool) -> SGE:
        return SGE(self.mr.buf + ((SLOTS if send else 0) + slot) * SIZE, SIZE, self.mr.lkey)

    def _post_recv(self, wr_id: int) -> None:
        self.qp.post_recv(RecvWR(wr_id=wr_id, sg=[self._sge(wr_id % SLOTS, send=False)]))

    def step(self, sending: bool, started: float) -> None:
        """Post what the rate and the window allow, then take the completions."""
        while (
            sending
            and self.posted - self.completed < WINDOW
            and time.monotonic() >= started + self.posted / RATE
        ):
            slot = self.posted % SLOTS
            self.mr.write(message(self.posted), offset=(SLOTS + slot) * SIZE)
            wr = SendWR(wr_id=self.posted, opcode=e.IBV_WR_SEND, sg=[self._sge(slot, send=True)])
            self.qp.post_send(wr)
            self.posted += 1
        _, wcs = self.cq.poll(32)
        for wc in wcs:
            self._complete(wc)
        if not wcs:
            time.sleep(0.001)

    def _complete(self, wc: WC) -> None:
        if wc.status != e.IBV_WC_SUCCESS:
            self.errors.append(f"wr {wc.wr_id}: {e.ibv_wc_status(wc.status).name}")
        elif wc.opcode == e.IBV_WC_RECV:
            data = self.mr.read(SIZE, (wc.wr_id % SLOTS) * SIZE)
            if wc.wr_id != self.received or data != message(self.received):
                self.errors.append(f"receive {wc.wr_id}: expected message {self.received}")
            self.received += 1
            self._post_recv(wc.wr_id + SLOTS)
        else:
            if wc.wr_id != self.completed:
                self.errors.append(f"send completion {wc.wr_id}: expected {self.completed}")
            self.completed = wc.wr_id + 1


def worker(args: argparse.Namespace) -> int:
    """Hold agents with their mappings; with --stream, run one side of a two-way stream until told to stop."""
    agents = []
    for a in range(args.agents):
        agent = Agent.connect(name=f"soak-{args.base}-{a}")
        if agent is None:
            raise SystemExit("soak worker: no shiftd")
        agents.append(agent)
        for j in range(args.mappings):
            qpn = args.base + a * args.mappings + j
            agent.publish_qp(
                Endpoint(args.gid, qpn, 0, "mlx5_0", "tcp"),
                Endpoint(args.backup_gid, qpn, 0, "mlx5_1", "tcp"),
            )
    say(published=args.agents * args.mappings)
    errors: list[str] = []
    stats: dict[str, int] = {}
    if args.stream:
        stream = TwoWay()
        say(endpoint=stream.qp.endpoint().to_json())
        stream.connect(hear()["endpoint"])
        say(connected=True)
        orders: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        threading.Thread(target=lambda: [orders.put(hear()) for _ in range(2)], daemon=True).start()
        started = time.monotonic()
        while orders.empty() and len(stream.errors) < 10:  # {"stop"}
            stream.step(sending=True, started=started)
        while stream.completed < stream.posted and len(stream.errors) < 10:
            stream.step(sending=False, started=started)
        orders.get()  # {"stop"}
        say(sent=stream.posted)
        expect = orders.get()["expect"]
        deadline = time.monotonic() + DRAIN_SECONDS
        while stream.received < expect and time.monotonic() < deadline and len(stream.errors) < 10:
            stream.step(sending=False, started=started)
        if stream.received != expect:
            stream.errors.append(f"received {stream.received} of the peer's {expect} messages")
        errors += stream.errors
        stats = {"sent": stream.posted, "received": stream.received, "state": stream.qp.state.value}
        stream.ctx.close()
    else:
        hear()  # {"stop"}
    say(done=True, errors=errors[:10], reconnects=sum(a.reconnects for a in agents), **stats)
    for agent in agents:
        agent.close()
    return 0


# ---- the driver ----------------------------------------------------------------------------------


def start_worker(lab: Lab, host: str, argv: list[str], log: Path) -> LabProcess:
    """`soak.py worker` on a lab host, spoken to in JSON lines; its stderr kept in `log`."""
    return LabProcess(lab, host, [sys.executable, __file__, "worker", *argv], stderr_file=log, timeout=120.0)


@dataclass
class Snapshot:
    """What is measured at the start and at the end."""

    at: float
    etcd: dict[str, float]
    failovers: int
    failbacks: int
    mappings: int


@dataclass
class Soak:
    lab: Lab
    procs: int
    agents: int
    mappings: int
    logs: Path
    workers: list[LabProcess] = field(default_factory=list)
    faults: int = 0
    errors: list[str] = field(default_factory=list)
    rss_series: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # host -> (s, KiB)

    @property
    def expected_mappings(self) -> int:
        return self.lab.shape.hosts * self.procs * self.agents * self.mappings

    def start_workers(self) -> None:
        shape = self.lab.shape
        for i, host in enumerate(self.lab.host_names):
            for p in range(self.procs):
                base = SYNTHETIC_QPN + (i * self.procs + p) * self.agents * self.mappings
                gids = [gid_of_ipv4(shape.rail_address(r, i)) for r in (0, 1)]
                argv = ["--gid", gids[0], "--backup-gid", gids[1], "--base", str(base)]
                argv += ["--agents", str(self.agents), "--mappings", str(self.mappings)]
                streams = (
                    p == 0 and i ^ 1 < shape.hosts
                )  # h0-h1, h2-h3, ...: a host without a partner has none
                argv += ["--stream"] if streams else []
                self.workers.append(start_worker(self.lab, host, argv, self.logs / f"{host}-{p}.log"))
        for worker in self.workers:
            worker.read("published")

    @property
    def streams(self) -> list[tuple[LabProcess, LabProcess]]:
        first = {w.host: w for w in reversed(self.workers)}
        hosts = self.lab.host_names
        return [(first[hosts[i]], first[hosts[i + 1]]) for i in range(0, len(hosts) - 1, 2)]

    def connect_streams(self) -> None:
        for a, b in self.streams:
            ends = a.read("endpoint"), b.read("endpoint")
            a.send(endpoint=ends[1]["endpoint"])
            b.send(endpoint=ends[0]["endpoint"])
            a.read("connected")
            b.read("connected")

    def shiftctl(self, host: str, *args: str) -> subprocess.CompletedProcess[str]:
        argv, env = self.lab.exec_command(host, ["shiftctl", "--timeout", "20", *args])
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)

    def fault_cycle(self, host: str, down_for: float) -> None:
        """mlx5_0 of `host` down for `down_for` seconds, then back; a failed command is an error."""
        for command, pause in (("fail-nic", down_for), ("recover-nic", 0.0)):
            result = self.shiftctl(host, command, "mlx5_0")
            if result.returncode != 0:
                self.errors.append(f"{command} on {host}: {result.stderr.strip()}")
            time.sleep(pause)
        self.faults += 1

    def sample_rss(self, at: float) -> None:
        """Each daemon's RSS now, added to the series (a leak shows as growth after the warm-up)."""
        for host in self.lab.host_names:
            daemon = self.lab.daemon(host)
            self.rss_series.setdefault(host, []).append((at, rss_kib(daemon.pid) if daemon else 0))

    def snapshot(self, at: float = 0.0) -> Snapshot:
        self.sample_rss(at)
        failovers = failbacks = 0
        for host in self.lab.host_names:
            status = json.loads(self.shiftctl(host, "status", "--json").stdout or "{}")
            failovers += int(status.get("failovers", 0))
            failbacks += int(status.get("failbacks", 0))
        return Snapshot(
            time.monotonic(), etcd_counters(self.lab), failovers, failbacks, self.count_mappings()
        )

    def wait_for_mappings(self, timeout: float = 120.0) -> None:
        """Until etcd holds every published mapping: shiftd writes them behind the agents' backs."""
        deadline = time.monotonic() + timeout
        while self.count_mappings() < self.expected_mappings and time.monotonic() < deadline:
            time.sleep(0.5)

    def count_mappings(self) -> int:
        """The synthetic mappings in etcd: keys under qp/ whose QPN is in the soak's range."""
        argv = [
            "etcdctl",
            "--endpoints",
            self.lab.etcd_endpoint,
            "get",
            "--prefix",
            "/shift/v1/qp/",
            "--keys-only",
        ]
        out = subprocess.run(
            netns.command(self.lab.shape.mgmt_ns, argv),
            capture_output=True,
            text=True,
            env={**os.environ, "ETCDCTL_API": "3"},
            timeout=60,
        ).stdout
        return sum(1 for key in out.split() if SYNTHETIC_QPN <= int(key.rsplit("/", 1)[1]) < SYNTHETIC_END)

    def stop(self) -> list[dict[str, Any]]:
        """Stop the streams (each side learns how many messages the other sent) and the holders."""
        for worker in self.workers:
            worker.send(stop=True)
        for a, b in self.streams:
            sent = {w.host: w.read("sent")["sent"] for w in (a, b)}
            a.send(expect=sent[b.host])
            b.send(expect=sent[a.host])
        reports = [w.read("done", timeout=DRAIN_SECONDS + 30) for w in self.workers]
        for worker, report in zip(self.workers, reports, strict=True):
            self.errors += [f"{worker.host}: {error}" for error in report["errors"]]
            if report["reconnects"]:
                self.errors.append(f"{worker.host}: agents reconnected {report['reconnects']} times")
        return reports


def rss_kib(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) if match else 0


RSS_EVERY = 60.0  # seconds between samples of the daemons' RSS
ETCD_WRITES = ("etcd_mvcc_put_total", "etcd_mvcc_delete_total", "etcd_mvcc_txn_total")


def etcd_counters(lab: Lab) -> dict[str, float]:
    """etcd's own write counters, from the first member's /metrics."""
    samples = scrape(lab, lab.etcd_endpoint)
    return {name: samples.get(name, 0.0) for name in ETCD_WRITES}


def run(args: argparse.Namespace) -> dict[str, Any]:
    if SYNTHETIC_QPN + args.hosts * args.procs * args.agents * args.mappings > SYNTHETIC_END:
        raise SystemExit(
            f"soak: at most {SYNTHETIC_END - SYNTHETIC_QPN} synthetic mappings (their QPNs stay under tcp's)"
        )
    lab = Lab(args.name or f"soak{os.getpid() % 10000}", hosts=args.hosts, nics=2)
    soak = Soak(lab, args.procs, args.agents, args.mappings, Path(tempfile.mkdtemp(prefix="shift-soak-")))
    log(f"bringing up lab {lab.name} ({args.hosts} hosts x 2 NICs)")
    lab.up()
    try:
        soak.start_workers()
        soak.connect_streams()
        log(f"{soak.expected_mappings} mappings published; {len(soak.streams)} streams running")
        soak.wait_for_mappings()
        start = soak.snapshot()
        sampled = start.at
        for k in range(int(args.duration // args.fault_every)):  # fault k at start + k * fault_every
            time.sleep(max(0.0, start.at + k * args.fault_every - time.monotonic()))
            soak.fault_cycle(lab.host_names[k % args.hosts], args.fault_every / 2)
            if time.monotonic() - sampled >= RSS_EVERY:
                sampled = time.monotonic()
                soak.sample_rss(sampled - start.at)
            log(f"{time.monotonic() - start.at:6.0f}s: {soak.faults} faults, {len(soak.errors)} errors")
        time.sleep(max(0.0, start.at + args.duration - time.monotonic()))
        end = soak.snapshot(time.monotonic() - start.at)
        reports = soak.stop()
        restarts = {h: lab.restarts(h) for h in lab.host_names}
        soak.errors += [f"shiftd on {h} restarted {n} times" for h, n in restarts.items() if n]
        for when in (start, end):
            if when.mappings != soak.expected_mappings:
                soak.errors.append(f"{when.mappings} of {soak.expected_mappings} mappings in etcd")
    finally:
        for worker in soak.workers:
            worker.end(grace=0)
        lab.down()
    if soak.errors:
        log(f"errors: the agent processes' logs are in {soak.logs}")
    else:
        shutil.rmtree(soak.logs)
    seconds = end.at - start.at
    writes = {name: (end.etcd[name] - start.etcd[name]) / seconds for name in ETCD_WRITES}
    return {
        "hosts": args.hosts,
        "agent_processes": len(soak.workers),
        "agents": len(soak.workers) * args.agents,
        "mappings": soak.expected_mappings,
        "streams": len(soak.streams),
        "seconds": seconds,
        "faults": soak.faults,
        "failovers": end.failovers - start.failovers,
        "failbacks": end.failbacks - start.failbacks,
        "messages": sum(r.get("received", 0) for r in reports),
        "errors": soak.errors,
        "rss_kib": {h: [series[0][1], series[-1][1]] for h, series in soak.rss_series.items()},
        "rss_kib_series": soak.rss_series,
        "mappings_in_etcd": [start.mappings, end.mappings],
        "etcd_writes_per_second": writes,
    }


def print_table(result: dict[str, Any]) -> None:
    r = result
    print(
        f"\nsoak: {r['hosts']} hosts, {r['agent_processes']} agent processes with {r['agents']} agents, "
        f"{r['mappings']} mappings, {r['streams']} two-way streams, {r['seconds']:.0f} s\n"
    )
    rows = [
        ("NIC faults injected (fail + recover)", result["faults"]),
        ("failovers done (all QPs, both sides)", result["failovers"]),
        ("failbacks done", result["failbacks"]),
        ("stream messages checked", result["messages"]),
        ("errors seen", len(result["errors"])),
        ("mappings in etcd, start / end", "{} / {}".format(*result["mappings_in_etcd"])),
    ]
    for host, series in result["rss_kib_series"].items():
        mib = [kib / 1024 for kib in (series[0][1], warm_rss(series), series[-1][1])]
        label = f"shiftd RSS on {host}, start / 1 min / end (MiB)"
        rows.append((label, "{:.1f} / {:.1f} / {:.1f}".format(*mib)))
    writes = result["etcd_writes_per_second"]
    rows.append(("etcd writes/s (put + delete + txn)", f"{sum(writes.values()):.1f}"))
    rows += [(f"  {name}", f"{rate:.1f}/s") for name, rate in writes.items()]
    for label, value in rows:
        print(f"{label:42} {value}")
    for error in result["errors"][:20]:
        print(f"error: {error}")


def warm_rss(series: list[tuple[float, int]]) -> int:
    """The RSS once the daemon has warmed up (the first sample a minute in, else the last)."""
    return next((kib for at, kib in series if at >= RSS_EVERY), series[-1][1])


def log(text: str) -> None:
    print(f"soak: {text}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role")
    work = sub.add_parser("worker", help="(internal) the agent process on a lab host")
    work.add_argument("--gid", required=True)
    work.add_argument("--backup-gid", required=True)
    work.add_argument("--base", type=int, required=True)
    work.add_argument("--agents", type=int, required=True)
    work.add_argument("--mappings", type=int, required=True)
    work.add_argument("--stream", action="store_true")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of faults (default 600)")
    parser.add_argument("--hosts", type=int, default=4, help="lab hosts (default 4)")
    parser.add_argument("--procs", type=int, default=2, help="agent processes per host (default 2)")
    parser.add_argument("--agents", type=int, default=4, help="agents per process (default 4)")
    parser.add_argument("--mappings", type=int, default=125, help="mappings per agent (default 125)")
    parser.add_argument("--fault-every", type=float, default=5.0, help="seconds between faults (default 5)")
    parser.add_argument("--name", help="lab name (default soakPID)")
    parser.add_argument("--json", type=Path, help="also write the result as JSON to this file")
    args = parser.parse_args()
    if args.role == "worker":
        return worker(args)
    if os.geteuid() != 0:
        print("soak: needs root (network namespaces)", file=sys.stderr)
        return 1
    if args.duration < args.fault_every:
        print("soak: --duration must be at least --fault-every", file=sys.stderr)
        return 1
    try:
        result = run(args)
    except (LabProcessError, LabError, FabricError, EtcdError) as exc:
        # a worker or the lab failed: the message names the worker's stderr or the lab's log; a traceback
        # would not say more
        print(f"soak: {exc}", file=sys.stderr)
        return 1
    print_table(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
