"""The one place pyverbs is imported, and how its errors and the core's verbs backend's become the verbs
API's.

pyverbs serves discovery and the device's attributes; every object the data path uses is the core's
(libshift.core._verbs, which loads libibverbs itself on first use). pyverbs is imported on first use,
never when libshift is: a host without rdma-core runs everything else. Debian's python3-pyverbs is the
supported build (it matches the system's libibverbs); docs/hardware.md says why PyPI's is not.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType

from libshift.vocabulary.errors import VerbsError, VerbsRDMAError

INSTALL_HINT = "install Debian's python3-pyverbs (make setup links it into the venv; see docs/hardware.md)"


class PyverbsMissing(VerbsError):
    """pyverbs (or the rdma-core libraries under it) cannot be loaded."""


@dataclass(frozen=True)
class Pyverbs:
    """The pyverbs modules the provider uses."""

    device: ModuleType
    pd: ModuleType
    mr: ModuleType
    cq: ModuleType
    qp: ModuleType
    wr: ModuleType
    addr: ModuleType
    enums: ModuleType
    error: type[Exception]  # PyverbsError, the base of every pyverbs exception


_loaded: Pyverbs | None = None


def load() -> Pyverbs:
    """Import pyverbs once; PyverbsMissing (one line, with the fix) when it cannot be imported."""
    global _loaded
    if _loaded is None:
        try:
            modules = {
                name: importlib.import_module(f"pyverbs.{name}")
                for name in ("device", "pd", "mr", "cq", "qp", "wr", "addr", "enums")
            }
            errors = importlib.import_module("pyverbs.pyverbs_error")
        except (ImportError, OSError) as exc:  # absent, or built against other rdma-core libraries
            raise PyverbsMissing(f"pyverbs cannot be loaded ({one_line(exc)}); {INSTALL_HINT}") from None
        _loaded = Pyverbs(**modules, error=errors.PyverbsError)
    return _loaded


def errno_of(exc: BaseException) -> int:
    """The errno a pyverbs exception carries (PyverbsRDMAError.error_code), 0 when it has none."""
    code = getattr(exc, "error_code", -1)
    return code if isinstance(code, int) and code > 0 else 0


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def rdma_error(what: str, exc: BaseException, default_errno: int = 0) -> VerbsRDMAError:
    """`what failed: <strerror>` with the errno of `exc` (or default_errno), as ibverbs reports it."""
    code = errno_of(exc) or default_errno
    reason = os.strerror(code) if code else one_line(exc)
    return VerbsRDMAError(f"{what} failed: {reason}", code or 0)


@contextmanager
def mapped(what: str, default_errno: int = 0) -> Iterator[None]:
    """Run a pyverbs call; its exception becomes a one-line VerbsRDMAError naming `what`."""
    try:
        yield
    except load().error as exc:
        raise rdma_error(what, exc, default_errno) from None


@contextmanager
def native(what: str) -> Iterator[None]:
    """Run a call of the core's verbs backend; its failure becomes `what failed: <why>`, errno kept."""
    try:
        yield
    except VerbsRDMAError as exc:
        raise VerbsRDMAError(f"{what} failed: {exc}", exc.error_code) from None
