"""Fleet scale: many simulated hosts, each a real shiftd registry client, on one 3-member lab etcd.

    sudo nice -n 19 .venv/bin/python bench/fleet_scale.py [--hosts 1000] [--qps-per-host 64]
        [--mrs-per-host 16] [--procs 4] [--lease-ttl 10] [--lab NAME]

A lab of one host and 3 etcd members (or `--lab NAME`, a running one with 3 members); the fleet runs in
`--procs` processes on its host h0 (bench/fleet_host.py, niced below etcd and the prober: on a real fleet
every shiftd has its own CPU), and a prober process looks up mappings at `--probe-rate` a second
throughout. In order:

1. fleet up: every host takes a lease and writes its host and NIC records;
2. job start: every host publishes its QP and MR mappings at once, and its QPs look their peers' backups
   up with libshift's wait; time until every mapping is acknowledged (readable), etcd's writes, batching;
3. quiet: lookups after the burst;
4. storm: NIC 0 of every host fails at once: each writes its NIC's state and looks up its peers' backups
   (QP and MR) of every QP on that rail;
5. lapse: one host dies without revoking; how long until each host connected to it has seen its mappings
   deleted (a watch on the victim's keys);
6. member loss: a second job replaces the first while etcd's first member (every client's pick_first
   choice) is SIGKILLed and started again; then every key in etcd is checked against what every host
   wants, and every client's lease against the one it started with;
7. memory: etcd's database and RSS, the fleet processes' RSS per 1,000 mappings.

Progress on stderr, the table on stdout, JSON in bench/out/fleet_scale.json, the lookups' latency over time
in bench/out/fleet_scale.png.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import etcd_metrics
from fleet_layout import Fleet
from fleet_plot import draw
from fleet_report import goals, print_table

from shiftlab.etcdproc import EtcdError
from shiftlab.fabric import FabricError
from shiftlab.lab import Lab, LabError
from shiftlab.labproc import LabProcess, LabProcessError

HERE = Path(__file__).parent
PREFIX = "/shift/v1/"
FLEET_NICE = 5  # the fleet's processes yield the CPU to etcd and the prober
WINDOWS = {  # the prober's samples by phase: (start mark, end mark)
    "burst": ("burst", "burst_end"),
    "quiet": ("quiet", "quiet_end"),
    "storm": ("storm", "storm_end"),
    "member_down": ("member_killed", "member_back"),
    "turnover": ("turnover", "turnover_end"),
}


def log(text: str) -> None:
    print(f"fleet_scale: {text}", file=sys.stderr, flush=True)


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def summary_ms(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {"n": len(ms), "p50": percentile(ms, 50), "p99": percentile(ms, 99), "max": max(ms, default=0.0)}


class Bench:
    def __init__(self, args: argparse.Namespace, lab: Lab, logs: Path) -> None:
        self.args = args
        self.lab = lab
        self.logs = logs
        self.fleet = Fleet(args.hosts, args.nics_per_host, args.qps_per_host, args.mrs_per_host, args.peers)
        self.workers: list[LabProcess] = []
        self.prober: LabProcess | None = None
        self.marks: dict[str, float] = {}  # phase -> CLOCK_MONOTONIC
        self.result: dict[str, Any] = {}

    # ---- processes --------------------------------------------------------------------------------

    def spawn(self, name: str, argv: list[str], nice: int) -> LabProcess:
        base = ["--endpoints", ",".join(self.lab.etcd_endpoints), "--hosts", str(self.args.hosts)]
        base += ["--nics", str(self.args.nics_per_host), "--qps", str(self.args.qps_per_host)]
        base += ["--mrs", str(self.args.mrs_per_host), "--peers", str(self.args.peers)]
        base += ["--lease-ttl", str(self.args.lease_ttl)] + (["--no-cache"] if self.args.no_cache else [])
        command = ["nice", "-n", str(nice), sys.executable, str(HERE / "fleet_host.py"), *base, *argv]
        return LabProcess(self.lab, "h0", command, stderr_file=self.logs / f"{name}.log", timeout=600.0)

    def start(self) -> None:
        args = self.args
        self.prober = self.spawn("prober", ["--probe-rate", str(args.probe_rate)], 0)
        per = -(-args.hosts // args.procs)
        for p in range(args.procs):
            first, count = p * per, min(per, args.hosts - p * per)
            if count > 0:
                argv = ["--first", str(first), "--count", str(count)]
                self.workers.append(self.spawn(f"fleet{p}", argv, FLEET_NICE))
        self.marks["start"] = time.monotonic()
        ups = [w.read("up") for w in self.workers]
        self.prober.read("up")
        self.leases = {k: v for up in ups for k, v in up["leases"].items()}
        self.rss_up = [up["rss_kib"] for up in ups]
        self.rss_base = [up["rss_base_kib"] for up in ups]
        self.result["fleet_up_seconds"] = time.monotonic() - self.marks["start"]
        up = self.result["fleet_up_seconds"]
        log(f"{args.hosts} hosts up in {up:.1f} s ({len(self.workers)} processes)")

    def everyone(self, key: str, timeout: float = 600.0, **order: Any) -> list[dict[str, Any]]:
        for worker in self.workers:
            worker.send(**order)
        return [w.read(key, timeout) for w in self.workers]

    # ---- phases -----------------------------------------------------------------------------------

    def job_start(self) -> None:
        before = etcd_metrics.scrape_all(self.lab)
        self.marks["burst"] = time.monotonic()
        replies = self.everyone("published", job=0, concurrency=self.args.connect_concurrency)
        after = etcd_metrics.scrape_all(self.lab)
        t0 = min(r["t0"] for r in replies)
        synced = [r["t0"] - t0 + s for r in replies for s in r["synced"] if s >= 0]  # -1: never synced
        readable = max(synced, default=float("nan"))
        self.marks["burst_end"] = t0 + readable
        connects = [c for r in replies for c in r["connect_lookups"]]
        keys = len(etcd_metrics.dump(self.lab, PREFIX + "qp/")) + len(
            etcd_metrics.dump(self.lab, PREFIX + "mr/")
        )
        self.result["job_start"] = {
            "mappings": self.fleet.mappings,
            "qp_mappings": self.fleet.qp_mappings,
            "publish_seconds": readable,
            "hosts_synced_p50_seconds": percentile(synced, 50),
            "unsynced_hosts": sum(1 for r in replies for s in r["synced"] if s < 0),
            "mappings_in_etcd": keys,
            "connect_lookups": summary_ms([c[1] for c in connects]),
            "connect_not_found": sum(1 for c in connects if not c[2]),
            "connected_seconds": max((c[0] + c[1] for c in connects), default=0.0),
            "fleet_cpu_seconds": sum(r["cpu_seconds"] for r in replies),
            "etcd": etcd_delta(before, after, readable),
        }
        js = self.result["job_start"]
        log(
            f"job start: {js['mappings']} mappings readable after {readable:.2f} s; "
            f"{keys} in etcd; connects p99 {js['connect_lookups']['p99']:.0f} ms"
        )

    def quiet(self) -> None:
        self.marks["quiet"] = time.monotonic()
        time.sleep(self.args.quiet)
        self.marks["quiet_end"] = time.monotonic()

    def storm(self) -> None:
        before = etcd_metrics.scrape_all(self.lab)
        self.marks["storm"] = time.monotonic()
        replies = self.everyone("stormed", storm=0)
        after = etcd_metrics.scrape_all(self.lab)
        t0 = min(r["t0"] for r in replies)
        lookups = [lk for r in replies for lk in r["lookups"]]
        done = max((r["t0"] - t0 + lk[0] + lk[1] for r in replies for lk in r["lookups"]), default=0.0)
        written = max((r["t0"] - t0 + s for r in replies for s in r["synced"]), default=0.0)
        self.marks["storm_end"] = t0 + max(done, written)
        self.result["storm"] = {
            "hosts": self.fleet.hosts,
            "lookups": summary_ms([lk[1] for lk in lookups]),
            "not_found": sum(1 for lk in lookups if not lk[2]),
            "all_lookups_done_seconds": done,
            "nic_states_written_seconds": written,
            "fleet_cpu_seconds": sum(r["cpu_seconds"] for r in replies),
            "etcd": etcd_delta(before, after, max(done, written)),
        }
        self.everyone("recovered", recover=0)
        st = self.result["storm"]
        log(f"storm: {st['lookups']['n']} lookups, p99 {st['lookups']['p99']:.0f} ms, all done {done:.2f} s")

    def lapse(self) -> None:
        victim = 0  # the first worker's first host
        watching = sum(r["watching"] for r in self.everyone("watching", watch_lapse=victim))
        crash = self.workers[0].ask("crashed", crash=victim)
        self.marks["lapse"] = crash["at"]
        seen = self.everyone("lapse_seen", lapse_result=self.args.lease_ttl + 10)
        times = [t - crash["at"] for r in seen for t in r["lapse_seen"]]
        self.result["lapse"] = {
            "lease_ttl": self.args.lease_ttl,
            "watchers": watching,
            "watchers_saw_it": len(times),
            "first_seen_seconds": min(times, default=float("nan")),
            "all_seen_seconds": max(times, default=float("nan")),
        }
        la = self.result["lapse"]
        log(f"lapse: {len(times)} of {watching} watchers saw it, last after {la['all_seen_seconds']:.2f} s")

    def member_loss(self) -> None:
        args = self.args
        before = etcd_metrics.scrape_all(self.lab)
        leader = etcd_metrics.leader(self.lab)
        self.marks["turnover"] = time.monotonic()
        for worker in self.workers:
            worker.send(job=1, concurrency=args.connect_concurrency, dead=[0])  # host 0 died in the lapse
        time.sleep(args.kill_after)
        self.marks["member_killed"] = time.monotonic()
        etcd_metrics.kill_member(self.lab, "etcd")
        log("etcd member 0 killed")
        time.sleep(args.down_for)
        self.marks["member_restart"] = time.monotonic()
        self.lab.up()  # starts what is not running: the killed member, on its data dir
        self.marks["member_back"] = time.monotonic()
        log(f"etcd member 0 back after {self.marks['member_back'] - self.marks['member_killed']:.1f} s")
        replies = [w.read("published", 600.0) for w in self.workers]
        self.marks["turnover_end"] = max(r["t0"] + max(r["synced"], default=0) for r in replies)
        self.everyone("synced", sync=60.0)
        after = etcd_metrics.scrape_all(self.lab)
        reports = self.everyone("report", report=True)
        lost = self.check_keys(job=1)
        leases = {k: v for r in reports for k, v in r["leases"].items()}
        changed = sorted(
            h for h, lease in leases.items() if h != self.fleet.name(0) and lease != self.leases[h]
        )
        self.result["member_loss"] = {
            "member": 0,
            "was_leader": leader == 0,
            "down_seconds": self.marks["member_back"] - self.marks["member_killed"],
            "turnover_seconds": self.marks["turnover_end"] - self.marks["turnover"],
            **lost,
            "leases_changed": len(changed),
            "clients_running": sum(r["running"] for r in reports),
            "clients": self.fleet.hosts - 1,
            "client_errors": merge_counts(r["errors"] for r in reports),
            "etcd": etcd_delta(before, after, self.marks["turnover_end"] - self.marks["turnover"]),
        }
        ml = self.result["member_loss"]
        log(f"member loss: {ml['missing']} missing, {ml['wrong']} wrong, {ml['stale']} stale keys")

    def check_keys(self, job: int) -> dict[str, int]:
        """etcd against what every live host wants: job `job`'s mappings and its records, under its lease."""
        want: dict[str, tuple[str, str]] = {}
        for host in range(1, self.fleet.hosts):  # host 0 died in the lapse
            name = self.fleet.name(host)
            for key, value in (self.fleet.startup_records(host) | self.fleet.publishes(host, job)).items():
                want[PREFIX + key] = (value, name)
        held = etcd_metrics.dump(self.lab, PREFIX)
        shiftd_keys = {k for k in held if "/h0" in k}  # the lab's own shiftd on h0
        missing = sum(1 for k in want if k not in held)
        wrong = sum(1 for k, (v, _) in want.items() if k in held and held[k][0] != v)
        stale = sum(1 for k in held if k not in want and k not in shiftd_keys)
        return {"keys_wanted": len(want), "missing": missing, "wrong": wrong, "stale": stale}

    def memory(self) -> None:
        """etcd's database and memory; the fleet's memory per simulated host, after a gc, over the
        interpreter's own (each process's RSS before its first registry)."""
        members = etcd_metrics.scrape_all(self.lab)
        reports = [w.ask("report", report=True) for w in self.workers]
        hosts = sum(r["live_hosts"] for r in reports)
        grown = sum(r["rss_kib"] for r in reports) - sum(self.rss_base)
        held = sum(r["own_mappings"] + r["cached_mappings"] for r in reports)
        self.result["memory"] = {
            "etcd_db_bytes": [m.get("etcd_mvcc_db_total_size_in_bytes", 0) for m in members],
            "etcd_db_in_use_bytes": [m.get("etcd_mvcc_db_total_size_in_use_in_bytes", 0) for m in members],
            "etcd_rss_bytes": [m.get("process_resident_memory_bytes", 0) for m in members],
            "etcd_keys": [m.get("etcd_debugging_mvcc_keys_total", 0) for m in members],
            "fleet_rss_kib": [r["rss_kib"] for r in reports],
            "client_kib_per_host_started": (sum(self.rss_up) - sum(self.rss_base)) / self.fleet.hosts,
            "client_kib_per_host": grown / hosts,
            "cache_groups_per_host": sum(r["cache_groups"] for r in reports) / hosts,
            "mappings_held_per_host": held / hosts,
            "client_kib_per_1000_mappings": grown / held * 1000,
        }

    def probes(self) -> None:
        assert self.prober is not None
        start = self.marks["start"]
        probes = self.prober.ask("report", report=True)["probes"]
        samples = [[round(at - start, 3), round(s, 5), ok, kind] for at, s, ok, kind in probes]  # ms, 10 us
        self.result["probe_samples"] = samples
        self.result["marks"] = marks = {k: v - start for k, v in self.marks.items()}
        labels = {"probe_lookups": (0, (True, False)), "probe_lookups_found": (0, (True,))}
        labels["probe_etcd_reads"] = (1, (True, False))
        for label, (kind, found) in labels.items():
            self.result[label] = {
                name: summary_ms(
                    [s[1] for s in samples if s[3] == kind and s[2] in found and marks[a] <= s[0] < marks[b]]
                )
                for name, (a, b) in WINDOWS.items()
            }

    def stop(self) -> None:
        for process in [*self.workers, *([self.prober] if self.prober else [])]:
            process.send(stop=True)
        for process in [*self.workers, *([self.prober] if self.prober else [])]:
            process.end(grace=30)


def etcd_delta(
    before: list[dict[str, float]], after: list[dict[str, float]], seconds: float
) -> dict[str, Any]:
    """What the first member counted in between: writes, transactions, watch events, fsyncs, CPU."""
    names = {
        "puts": "etcd_mvcc_put_total",
        "deletes": "etcd_mvcc_delete_total",
        "txns": "etcd_mvcc_txn_total",
        "ranges": "etcd_mvcc_range_total",
        "watch_events": "etcd_debugging_mvcc_events_total",
        "proposals": "etcd_server_proposals_committed_total",
        "wal_fsyncs": "etcd_disk_wal_fsync_duration_seconds_count",
        "cpu_seconds": "process_cpu_seconds_total",
    }
    member = next((i for i, (b, a) in enumerate(zip(before, after, strict=True)) if a and b), 0)
    delta = {k: after[member].get(n, 0.0) - before[member].get(n, 0.0) for k, n in names.items()}
    delta["cpu_seconds_all_members"] = sum(
        a.get(names["cpu_seconds"], 0.0) - b.get(names["cpu_seconds"], 0.0)
        for b, a in zip(before, after, strict=True)
        if a and b
    )
    delta["writes_per_second"] = (delta["puts"] + delta["deletes"]) / seconds if seconds > 0 else 0.0
    delta["ops_per_txn"] = (delta["puts"] + delta["deletes"]) / delta["txns"] if delta["txns"] else 0.0
    delta["member"] = member
    return delta


def merge_counts(counts: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for count in counts:
        for kind, n in count.items():
            total[kind] = total.get(kind, 0) + n
    return total


def run(args: argparse.Namespace) -> dict[str, Any]:
    lab = (
        Lab.existing(args.lab)
        if args.lab
        else Lab(f"fs{os.getpid() % 10000}", hosts=1, nics=1, etcd_members=3)
    )
    if lab.shape.etcd_members != 3:
        raise LabError(f"lab {lab.name} has {lab.shape.etcd_members} etcd members; the bench needs 3")
    logs = Path(tempfile.mkdtemp(prefix="shift-fleet-"))
    if not args.lab:
        log(f"bringing up lab {lab.name} (3 etcd members)")
        lab.up()
    bench = Bench(args, lab, logs)
    try:
        bench.start()
        bench.job_start()
        bench.quiet()
        bench.storm()
        bench.lapse()
        bench.member_loss()
        bench.memory()
        bench.probes()
    finally:
        bench.stop()
        if not args.lab:
            lab.down()
    log(f"the fleet processes' logs are in {logs}")
    shape = {"hosts": args.hosts, "qps_per_host": args.qps_per_host, "mrs_per_host": args.mrs_per_host}
    shape |= {"nics_per_host": args.nics_per_host, "peers": args.peers, "procs": len(bench.workers)}
    shape |= {"peer_cache": not args.no_cache}
    return shape | bench.result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--qps-per-host", type=int, default=64)
    parser.add_argument("--mrs-per-host", type=int, default=16)
    parser.add_argument("--nics-per-host", type=int, default=2)
    parser.add_argument("--peers", type=int, default=8, help="hosts each host's QPs connect to (default 8)")
    parser.add_argument("--procs", type=int, default=4, help="fleet processes (default 4)")
    parser.add_argument("--lease-ttl", type=int, default=10, help="shiftd's lease TTL, s (default 10)")
    parser.add_argument("--probe-rate", type=float, default=100.0, help="prober lookups/s (default 100)")
    parser.add_argument("--connect-concurrency", type=int, default=4, help="lookups at once per host")
    parser.add_argument("--quiet", type=float, default=3.0, help="seconds of lookups after the burst")
    parser.add_argument("--kill-after", type=float, default=0.5, help="s into the second job")
    parser.add_argument("--down-for", type=float, default=3.0, help="s the member stays down")
    parser.add_argument("--no-cache", action="store_true", help="registries without the peer cache (A/B)")
    parser.add_argument("--lab", help="a running lab with 3 etcd members (shift-lab up --etcd-members 3)")
    parser.add_argument("--json", type=Path, default=HERE / "out" / "fleet_scale.json")
    parser.add_argument("--png", type=Path, default=HERE / "out" / "fleet_scale.png")
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1)  # where a stuck run is
    if os.geteuid() != 0:
        print("fleet_scale: needs root (network namespaces)", file=sys.stderr)
        return 1
    if args.hosts < 2:
        print("fleet_scale: --hosts must be at least 2", file=sys.stderr)
        return 1
    try:
        result = run(args)
    except (LabProcessError, LabError, FabricError, EtcdError) as exc:
        print(f"fleet_scale: {exc}", file=sys.stderr)
        return 1
    result["goals"] = [{"figure": f, "measured": m, "goal": g, "met": ok} for f, m, g, ok in goals(result)]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print_table(result)
    draw(result, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
