"""The lab the failover test modules share the shape of: 2 hosts x 2 NICs, one per module (a module's
faults, hold-downs and leftover QPs stay its own)."""

import pytest
from labs import running_lab


@pytest.fixture(scope="module")
def lab():
    with running_lab("fo", hosts=2, nics=2) as lab:
        yield lab
