"""Generate the Python stubs of proto/shift/v1 into libshift/api (run by `make proto`).

protoc writes absolute imports (`from shift.v1 import common_pb2`); the stubs live in the
package `libshift.api.shift.v1`, so the imports are rewritten to that package. The
staleness test in tests/test_proto_stubs.py runs this into a temporary directory and
compares the result with the committed files.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE = "libshift.api"
IMPORT_RE = re.compile(r"^from shift\.v1 import ", re.MULTILINE)


def generate(out: Path) -> list[Path]:
    """Write the stubs under out/shift/v1 and return the files written."""
    protos = sorted(PROTO_ROOT.glob("shift/v1/*.proto"))
    builtin = Path(protoc.__file__).parent / "_proto"
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{builtin}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    written = []
    for path in sorted((out / "shift" / "v1").glob("*.py*")):
        text = IMPORT_RE.sub(f"from {PACKAGE}.shift.v1 import ", path.read_text())
        path.write_text(text)
        written.append(path)
    for pkg in (out / "shift", out / "shift" / "v1"):
        (pkg / "__init__.py").write_text("")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "libshift" / "api")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out.parent.parent) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
