"""The table of bench/fleet_scale.py and the issue's goals, from the result it writes as JSON."""

from __future__ import annotations

from typing import Any


def goals(r: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(figure, measured, goal, met) for the issue's goals."""
    js, st, la, ml = r["job_start"], r["storm"], r["lapse"], r["member_loss"]
    burst = r["probe_lookups_found"]["burst"]  # a key not yet published is not a lookup's latency
    lost = ml["missing"] + ml["wrong"] + ml["stale"]
    # every host acknowledged, and etcd holds them all when the bench counts (a lapsed lease loses them)
    whole = js["unsynced_hosts"] == 0 and js["mappings_in_etcd"] == js["mappings"]
    publish = f"{js['publish_seconds']:.2f} s" if whole else f"not all: {js['mappings_in_etcd']} in etcd"
    return [
        ("job start: every mapping readable", publish, "< 10 s", whole and js["publish_seconds"] < 10),
        ("lookup p99 under the burst (published)", f"{burst['p99']:.1f} ms", "< 20 ms", burst["p99"] < 20),
        (
            "lease lapse seen by every watcher",
            f"{la['all_seen_seconds']:.2f} s",
            f"< {la['lease_ttl'] + 1} s",
            la["watchers_saw_it"] == la["watchers"] and la["all_seen_seconds"] < la["lease_ttl"] + 1,
        ),
        ("storm lookups p99", f"{st['lookups']['p99']:.1f} ms", "-", True),
        (
            "member loss: mappings lost, leases lapsed",
            f"{lost}, {ml['leases_changed']}",
            "0, 0",
            lost == 0 and ml["leases_changed"] == 0,
        ),
    ]


def ms3(summary: dict[str, float]) -> str:
    return f"{summary['p50']:.1f} / {summary['p99']:.1f} ms ({summary['n']})"


def print_table(r: dict[str, Any]) -> None:
    js, st, la, ml, mem = r["job_start"], r["storm"], r["lapse"], r["member_loss"], r["memory"]
    lookups, reads = r["probe_lookups"], r["probe_etcd_reads"]
    burst_etcd, storm_etcd = js["etcd"], st["etcd"]
    print(
        f"\nfleet_scale: {r['hosts']} hosts x {r['qps_per_host']} QPs + {r['mrs_per_host']} MRs "
        f"({js['mappings']} mappings), {r['nics_per_host']} NICs, 3 etcd members, lease {la['lease_ttl']} s\n"
    )
    rows = [
        ("fleet up (leases, host and NIC records)", f"{r['fleet_up_seconds']:.2f} s"),
        ("job start: all mappings readable", f"{js['publish_seconds']:.2f} s"),
        ("  median host's mappings acknowledged", f"{js['hosts_synced_p50_seconds']:.2f} s"),
        ("  etcd writes/s, ops per txn", f"{burst_etcd['writes_per_second']:.0f}/s, "
                                         f"{burst_etcd['ops_per_txn']:.1f}"),
        ("  etcd ranges, watch events, fsyncs", f"{burst_etcd['ranges']:.0f}, "
                                                f"{burst_etcd['watch_events']:.0f}, "
                                                f"{burst_etcd['wal_fsyncs']:.0f}"),
        ("  CPU s: etcd (3 members), fleet", f"{burst_etcd['cpu_seconds_all_members']:.1f}, "
                                             f"{js['fleet_cpu_seconds']:.1f}"),
        ("  connect lookups p50 / p99 (n)", ms3(js["connect_lookups"])),
        ("  every QP has its peer's backup", f"{js['connected_seconds']:.2f} s"),
        ("prober lookups p50 / p99 (n): burst", ms3(lookups["burst"])),
        ("  burst, published keys only", ms3(r["probe_lookups_found"]["burst"])),
        ("  after the burst", ms3(lookups["quiet"])),
        ("  during the storm", ms3(lookups["storm"])),
        ("  member down", ms3(lookups["member_down"])),
        ("prober etcd reads p50 / p99 (n): burst", ms3(reads["burst"])),
        ("  after the burst", ms3(reads["quiet"])),
        ("  during the storm", ms3(reads["storm"])),
        ("  member down", ms3(reads["member_down"])),
        ("storm: lookups p50 / p99 (n)", ms3(st["lookups"])),
        ("  all lookups done, NIC states written", f"{st['all_lookups_done_seconds']:.2f} s, "
                                                   f"{st['nic_states_written_seconds']:.2f} s"),
        ("  etcd ranges, CPU s: etcd, fleet", f"{storm_etcd['ranges']:.0f}, "
                                              f"{storm_etcd['cpu_seconds_all_members']:.1f}, "
                                              f"{st['fleet_cpu_seconds']:.1f}"),
        ("lease lapse: watchers saw it", f"{la['watchers_saw_it']}/{la['watchers']}"),
        ("  first / last, after the crash", f"{la['first_seen_seconds']:.2f} / "
                                            f"{la['all_seen_seconds']:.2f} s"),
        ("member loss: down, second job done", f"{ml['down_seconds']:.1f} s, {ml['turnover_seconds']:.2f} s"),
        ("  keys missing / wrong / stale", f"{ml['missing']} / {ml['wrong']} / {ml['stale']} "
                                          f"of {ml['keys_wanted']}"),
        ("  leases changed, clients running", f"{ml['leases_changed']}, "
                                              f"{ml['clients_running']}/{ml['clients']}"),
        ("etcd db size / in use (member 0)", f"{mem['etcd_db_bytes'][0] / 2**20:.1f} / "
                                             f"{mem['etcd_db_in_use_bytes'][0] / 2**20:.1f} MiB"),
        ("etcd RSS per member", " / ".join(f"{b / 2**20:.0f}" for b in mem["etcd_rss_bytes"]) + " MiB"),
        ("client RSS per host: started, at the end", f"{mem['client_kib_per_host_started']:.0f} KiB, "
                                                     f"{mem['client_kib_per_host']:.0f} KiB"),
        ("  mappings held (own + cached), groups", f"{mem['mappings_held_per_host']:.0f}, "
                                                   f"{mem['cache_groups_per_host']:.1f}"),
        ("  client RSS per 1,000 mappings held", f"{mem['client_kib_per_1000_mappings']:.0f} KiB"),
    ]  # fmt: skip
    for label, value in rows:
        print(f"{label:42} {value}")
    print()
    for figure, measured, goal, met in goals(r):
        verdict = "" if goal == "-" else "met" if met else "MISSED"
        print(f"{figure:42} {measured:>10}  goal {goal:8} {verdict}")
