"""Monitors: each turns one kind of kernel signal into the plain values of shiftd.nic.

netlink (LinkStatus), udev (DeviceChange) and rdma_sysfs (PortStatus). Each runs as an asyncio
task (`await monitor.run()`), reports through a plain callback, and closes what it opened
when cancelled.
"""
