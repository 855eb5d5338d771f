"""A lab fabric for one test module: named after the module's prefix and this process, always taken down."""

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from shiftlab.lab import Lab


@contextmanager
def running_lab(prefix: str, hosts: int, nics: int) -> Iterator[Lab]:
    lab = Lab(f"{prefix}{os.getpid() % 100000}", hosts=hosts, nics=nics)
    lab.up()
    try:
        yield lab
    finally:
        lab.down()


@contextmanager
def on_lab_host(lab: Lab, host: str = "h0") -> Iterator[None]:
    """For the block, this process opens `host`'s devices (sockets in its namespace) and uses its shiftd."""
    ns = lab.namespace(host)
    devices = ",".join(f"{dev}={netdev}@{ns}" for dev, netdev in lab.shape.devices().items())
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SHIFT_TCP_DEVICES", devices)
        env.setenv("SHIFT_SOCKET", str(lab.socket(host)))
        yield
