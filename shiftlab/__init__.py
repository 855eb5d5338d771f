"""shiftlab: the lab fabric (hosts as network namespaces, etcd, a supervised shiftd per host), `shift-lab`.

Tests and benches import it; shiftd and libshift never do.
"""
