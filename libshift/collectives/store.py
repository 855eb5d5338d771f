"""The rendezvous store: where the ranks swap endpoints and keys before the ring is connected.

`Store` is the shape the Communicator needs; torch.distributed's stores have it, and so does `FileStore`, a
directory that every rank can reach (lab hosts share the machine's file system), for programs without torch.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from pathlib import Path
from typing import Protocol

POLL_FIRST, POLL_MAX = 0.002, 0.05  # a waiting get() looks again after this, doubling up to the maximum


class Store(Protocol):
    def set(self, key: str, value: bytes) -> None: ...

    def get(self, key: str) -> bytes:
        """The value of `key`, waiting until some rank sets it (within the store's own timeout)."""
        ...

    def check(self, keys: list[str]) -> bool:
        """Whether every one of `keys` is set, without waiting."""
        ...


class FileStore:
    """`FileStore(path)`: one file per key in the directory `path` (created if missing).

    A value is written to a temporary file and renamed into place, so a reader sees all of it or nothing.
    """

    def __init__(self, path: str | os.PathLike[str], timeout: float = 300.0) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.path.mkdir(parents=True, exist_ok=True)

    def _file(self, key: str) -> Path:
        return self.path / urllib.parse.quote(key, safe="")

    def set(self, key: str, value: bytes | str) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        target = self._file(key)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{time.monotonic_ns()}")
        tmp.write_bytes(data)
        os.replace(tmp, target)

    def check(self, keys: list[str]) -> bool:
        return all(self._file(key).exists() for key in keys)

    def get(self, key: str) -> bytes:
        target = self._file(key)
        deadline = time.monotonic() + self.timeout
        pause = POLL_FIRST
        while True:
            try:
                return target.read_bytes()
            except FileNotFoundError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"store {self.path}: key {key!r} not set within {self.timeout:g} s"
                    ) from None
            time.sleep(pause)
            pause = min(2 * pause, POLL_MAX)
