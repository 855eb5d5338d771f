"""valgrind's memcheck around a Python program of the tests: any report makes its exit status non-zero.

CPython's own reports are suppressed (valgrind-python.supp, with PYTHONMALLOC=malloc so that memcheck sees
every allocation); what is left is the C core's, or a real error of anybody's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

SUPPRESSIONS = Path(__file__).with_name("valgrind-python.supp")


def memcheck(log: Path) -> list[str]:
    """The argv prefix that runs a program under memcheck, its report in `log`; skips without valgrind."""
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is missing (scripts/ensure-system-deps.sh installs it)")
    return [
        "env",
        "PYTHONMALLOC=malloc",
        "valgrind",
        "--error-exitcode=1",
        f"--suppressions={SUPPRESSIONS}",
        "--num-callers=30",
        f"--log-file={log}",
    ]


def clean(log: Path) -> bool:
    """memcheck ran the program to its end and reported nothing (beyond the suppressed)."""
    return "ERROR SUMMARY: 0 errors from 0 contexts" in log.read_text()
