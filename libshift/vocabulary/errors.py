"""Errors of the verbs API; the names follow pyverbs so `except PyverbsRDMAError` keeps working."""

from __future__ import annotations

import errno as _errno


class VerbsError(Exception):
    """A verbs call was refused; str() is one line that says why."""


class VerbsRDMAError(VerbsError):
    """A verbs call failed with an errno, as ibverbs reports it (EINVAL, ENOMEM, ...)."""

    def __init__(self, message: str, error: int = _errno.EINVAL) -> None:
        super().__init__(message)
        self.error_code = error


class CQOverflowError(VerbsRDMAError):
    """More completions arrived than the CQ holds; as on an RNIC the CQ and its QPs are in error."""

    def __init__(self, message: str) -> None:
        super().__init__(message, _errno.EOVERFLOW)


PyverbsError = VerbsError
PyverbsRDMAError = VerbsRDMAError
