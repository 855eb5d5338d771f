"""A NIC back from repair with another address, and so another GID, on the lab fabric: the stream fails
over when the NIC goes, and comes home onto it at its new GID when it is back (the peer learns the GID from
the NIC's record in etcd, through its own shiftd), then fails over again from there.

The module's lab is its own (conftest.py): the test changes a NIC's address, and puts the old one back after.
"""

from __future__ import annotations

import subprocess
import time

import pytest
from stream_harness import Fault, admin, assert_intact, nic_fault, run_stream

from libshift.api.shift.v1 import admin_pb2, common_pb2
from shiftlab.lab import Lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120)]
DEVICE = "mlx5_0"


def readdress(lab: Lab, host: str, old: str, new: str) -> None:
    """Give `host`'s NIC another address (the old one first: deleting a primary takes its secondaries)."""
    ns, netdev = lab.namespace(host), lab.shape.devices()[DEVICE]
    assert ns is not None
    subprocess.run(["ip", "-n", ns, "addr", "del", f"{old}/24", "dev", netdev], check=True)
    subprocess.run(["ip", "-n", ns, "addr", "add", f"{new}/24", "dev", netdev], check=True)


def nic_record(lab: Lab, host: str) -> common_pb2.Nic:
    with admin(lab, host) as stub:
        status = stub.Status(admin_pb2.StatusRequest(), timeout=30)
    return next(nic for nic in status.nics if nic.device == DEVICE)


@pytest.mark.parametrize("host", ["h0", "h1"], ids=["sender-nic", "receiver-nic"])
def test_a_nic_readdressed_while_down_carries_the_traffic_again(lab: Lab, host: str) -> None:
    """Each failure of `host`'s default NIC also gives it a new address while it is down. The failback after
    the first (run_stream waits for the sender to be back on the default path) can only be made at the new
    GID: the peer's re-arm connects to it and checks it is what connected. Then the NIC fails again, from
    its new address, and the stream goes on on the backup with nothing lost or doubled."""
    original = lab.shape.rail_address(0, lab.index(host))
    addresses = [original]
    fresh = iter(f"198.18.0.{n}" for n in range(100, 110))
    nic = nic_fault(host)

    def inject(bed: Lab) -> None:
        nic.inject(bed)
        addresses.append(next(fresh))
        readdress(bed, host, addresses[-2], addresses[-1])

    try:
        sent, received = run_stream(lab, "send", Fault(host, nic.reason, inject, nic.recover), failbacks=1)
        assert_intact(sent, received)
        assert nic_record(lab, host).gid == f"::ffff:{addresses[-1]}"
    finally:
        if addresses[-1] != original:
            readdress(lab, host, addresses[-1], original)
    deadline, home = time.monotonic() + 15, (f"::ffff:{original}", common_pb2.NIC_STATE_UP)
    while ((record := nic_record(lab, host)).gid, record.state) != home:
        assert time.monotonic() < deadline, record
        time.sleep(0.1)
