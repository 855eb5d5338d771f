"""How gRPC reads the NIC event stream in the processes that use libshift, chosen as gRPC is imported.

grpcio 1.85's EventEngine client reads a connection on a thread of its pool and then wakes the thread
waiting in the call: two thread hand-offs between shiftd's stream write and the agent's failover, each a
scheduler wake-up (0.1-0.2 ms on a busy host, more on an idle VM). Without the `event_engine_client`
experiment the waiting thread reads the socket itself, as gRPC did for years before that experiment.
bench/nic_event_latency.py measures the difference (about 0.3 ms of a NIC event's latency).

gRPC reads GRPC_EXPERIMENTS once, when it is first imported. So libshift imports it with the setting
in place and takes the variable away again (the application's child processes do not inherit it), and
leaves gRPC alone when it was imported before libshift, when the user set GRPC_EXPERIMENTS, and on
grpcio versions whose experiment names were not checked (gRPC logs an error for a name it lacks).
"""

from __future__ import annotations

import os
import sys
from importlib import metadata

CHECKED_VERSIONS = ("1.85.",)  # grpcio releases whose experiments include event_engine_client
SETTING = "-event_engine_client"


def read_on_the_waiting_thread() -> bool:
    """Import gRPC with its pre-EventEngine client polling; False when gRPC was left as it is."""
    if "grpc" in sys.modules or "GRPC_EXPERIMENTS" in os.environ:
        return False
    try:
        version = metadata.version("grpcio")
    except metadata.PackageNotFoundError:
        return False
    if not version.startswith(CHECKED_VERSIONS):
        return False
    os.environ["GRPC_EXPERIMENTS"] = SETTING
    try:
        import grpc  # noqa: F401  (read GRPC_EXPERIMENTS now: gRPC never reads it again)
    finally:
        del os.environ["GRPC_EXPERIMENTS"]
    return True
