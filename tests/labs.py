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
    except BaseException:
        show_shiftd_logs(lab)
        raise
    finally:
        lab.down()


def show_shiftd_logs(lab: Lab, lines: int = 60) -> None:
    """The last lines of each host's shiftd log, for pytest to show with a failure that went through the
    lab's block (a module fixture's setup): the lab and its logs are gone after it."""
    for host in lab.host_names:
        path = lab.log_path(host)
        tail = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else ["(no log)"]
        print(f"--- {host}'s shiftd.log, last {lines} lines:", *tail, sep="\n")


@contextmanager
def on_lab_host(lab: Lab, host: str = "h0") -> Iterator[None]:
    """For the block, this process opens `host`'s devices (sockets in its namespace) and uses its shiftd."""
    ns = lab.namespace(host)
    devices = ",".join(f"{dev}={netdev}@{ns}" for dev, netdev in lab.shape.devices().items())
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SHIFT_TCP_DEVICES", devices)
        env.setenv("SHIFT_SOCKET", str(lab.socket(host)))
        yield
