"""A lab fabric for one test module: named after the module's prefix and this process, always taken down."""

import os
from collections.abc import Iterator
from contextlib import contextmanager

from shiftd.lab import Lab


@contextmanager
def running_lab(prefix: str, hosts: int, nics: int) -> Iterator[Lab]:
    lab = Lab(f"{prefix}{os.getpid() % 100000}", hosts=hosts, nics=nics)
    lab.up()
    try:
        yield lab
    finally:
        lab.down()
