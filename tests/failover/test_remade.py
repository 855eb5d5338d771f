"""A NIC made anew while it is down, on the lab fabric: its netdev deleted and created again with the same
name, MAC and address, as a driver reload does, so another ifindex. The stream fails over when the NIC
goes and comes home onto it when it is back; the tcp provider binds its listeners to the new netdev (a
socket bound to a device keeps the old one's ifindex, which nothing reaches any more).
"""

from __future__ import annotations

import subprocess

import pytest
from stream_harness import Fault, assert_intact, nic_fault, run_stream

from shiftlab import fabric
from shiftlab.lab import Lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(120)]
DEVICE = "mlx5_0"


def remake(lab: Lab, host: str) -> None:
    """Delete `host`'s netdev of DEVICE and let the fabric build it again."""
    ns, netdev = lab.namespace(host), lab.shape.devices()[DEVICE]
    assert ns is not None
    subprocess.run(["ip", "-n", ns, "link", "del", netdev], check=True)
    fabric.build(lab.shape)


@pytest.mark.parametrize("host", ["h0", "h1"], ids=["sender-nic", "receiver-nic"])
def test_a_nic_made_anew_while_down_carries_the_traffic_again(lab: Lab, host: str) -> None:
    """The failback after the NIC's return connects to its listeners (the receiver's case fails without
    their new binding), then the NIC fails again and the stream goes on with nothing lost or doubled."""
    nic = nic_fault(host)

    def inject(bed: Lab) -> None:
        nic.inject(bed)
        remake(bed, host)

    sent, received = run_stream(lab, "send", Fault(host, nic.reason, inject, nic.recover), failbacks=1)
    assert_intact(sent, received)
