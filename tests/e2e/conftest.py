"""The GPT-2 example's modules (examples/gpt2: job, scenario, report) for the end-to-end tests."""

import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt2"
sys.path.insert(0, str(EXAMPLE))
