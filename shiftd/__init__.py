"""shiftd: the per-host SHIFT daemon (NIC monitoring, gRPC for agents, etcd registry, metrics)."""

__version__ = "0.1.0"
