"""Every console script in pyproject.toml names a function that exists (tests run the modules behind them)."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import pytest

SCRIPTS = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.mark.parametrize(("script", "target"), sorted(SCRIPTS.items()))
def test_a_console_script_names_a_callable(script: str, target: str) -> None:
    module, _, name = target.partition(":")
    assert callable(getattr(importlib.import_module(module), name)), script


def test_shift_lab_is_the_lab_cli() -> None:
    assert SCRIPTS["shift-lab"] == "shiftlab.cli:main"
