"""libshift's settings from the environment, checked: a bad value is a clear error, not a guess."""

from __future__ import annotations

import os

from libshift.verbs import VerbsError


def env_int(name: str, default: int, low: int, high: int) -> int:
    """The integer in environment variable `name` (`default` when unset or empty), from `low` to `high`."""
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        return default
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise VerbsError(f"{name} must be an integer from {low} to {high}, not {text!r}")
    return value
