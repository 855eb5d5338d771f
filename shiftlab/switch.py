"""Gray faults on a lab's rail switch: a port that loses packets, or passes them slowly, while its link and
every host stay up.

What `shiftctl fail-nic --mode lossy` and `--mode slow` do on a host's NIC, done instead on the switch's port
towards the host, so that no shiftd is told: only the traffic can show it (the tests and benches of
detection).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from shiftd.faults import TBF_LATENCY, random_drop_program, tbf_shape
from shiftlab.lab import Lab


@contextmanager
def lossy_port(lab: Lab, rail: int, towards: str, percent: float) -> Iterator[None]:
    """Rail `rail`'s switch port towards host `towards` drops each packet, both ways, with a chance of
    `percent`%, until the block ends (shiftd's lossy filter: a classic BPF program in a clsact qdisc)."""
    tc = ["tc", "-n", lab.shape.rail_ns(rail)]
    program = random_drop_program(percent)
    subprocess.run([*tc, "qdisc", "add", "dev", towards, "clsact"], check=True)
    try:
        for direction in ("ingress", "egress"):
            classifier = ["bpf", "bytecode", program, "da"]
            subprocess.run(
                [*tc, "filter", "add", "dev", towards, direction, "protocol", "all", *classifier], check=True
            )
        yield
    finally:
        subprocess.run([*tc, "qdisc", "del", "dev", towards, "clsact"], check=True)


@contextmanager
def slow_port(
    lab: Lab, rail: int, towards: str, rate_bits: int, latency: str = TBF_LATENCY
) -> Iterator[None]:
    """Rail `rail`'s switch port passes what it sends towards host `towards` at `rate_bits` a second at
    most, until the block ends (shiftd's slow fault: a root tbf). A packet waits `latency` at most in its
    queue, then is dropped: a queue deep enough ("5s") makes a slow link that loses nothing."""
    tc = ["tc", "-n", lab.shape.rail_ns(rail), "qdisc"]
    subprocess.run([*tc, "add", "dev", towards, "root", *tbf_shape(rate_bits, latency)], check=True)
    try:
        yield
    finally:
        subprocess.run([*tc, "del", "dev", towards, "root"], check=True)
