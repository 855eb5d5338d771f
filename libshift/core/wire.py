"""The core's frame format (wire.h, docs/wire.md) for what speaks it from outside the core: a fuzzer playing
a hostile peer, a tc filter that matches one op. The numbers and the packing are the core's own."""

from libshift.core._core import REQUESTS, WIRE_MAGIC, Op, pack_header

MAGIC = WIRE_MAGIC

__all__ = ["MAGIC", "REQUESTS", "Op", "pack_header"]
