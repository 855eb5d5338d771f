"""libshift: the verbs API that applications use, with SHIFT's failover beneath it."""

__version__ = "0.1.0"
