"""Gray faults on a lab's rail switch: a port that loses packets while its link, and every host, stay up.

What `shiftctl fail-nic --mode lossy` does on a host's NIC, done instead on the switch's port towards the
host, so that no shiftd is told: only the traffic can show it (the tests and benches of detection).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from shiftd.faults import random_drop_program
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
