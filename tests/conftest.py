"""Fixtures shared by every test module: real etcd members (see etcd_fixtures.py)."""

from etcd_fixtures import etcd, etcd_cluster, etcd_member

__all__ = ["etcd", "etcd_cluster", "etcd_member"]
