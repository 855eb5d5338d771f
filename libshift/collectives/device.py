"""Which NIC a rank uses, for the Communicator and the torch backend alike: one rail per local rank, as NCCL
picks on rail-optimized hosts.

On such hosts GPU i sits next to NIC i, so the rank with local rank i (torchrun's LOCAL_RANK, 0 without it)
takes the host's i-th device in natural order, wrapping around when there are more ranks than NICs.
SHIFT_DEVICE names the device instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from libshift.device import get_device_list, natural_key

ENV_DEVICE = "SHIFT_DEVICE"
ENV_LOCAL_RANK = "LOCAL_RANK"


def pick_device(environ: Mapping[str, str] = os.environ, devices: Sequence[str] | None = None) -> str:
    """The device for this rank: SHIFT_DEVICE if set, else the host's devices (in natural order) by local
    rank. `devices` defaults to every device libshift can open here."""
    names = sorted({d.name for d in get_device_list()} if devices is None else set(devices), key=natural_key)
    known = ", ".join(names) or "none"
    override = environ.get(ENV_DEVICE, "").strip()
    if override:
        if override not in names:
            raise ValueError(f"{ENV_DEVICE}={override}: no such RDMA device on this host (devices: {known})")
        return override
    if not names:
        raise ValueError("no RDMA device on this host (see SHIFT_TCP_DEVICES and SHIFT_CONFIG)")
    text = environ.get(ENV_LOCAL_RANK, "0").strip()
    if not text.isdigit():
        raise ValueError(f"{ENV_LOCAL_RANK}={text!r}: expected a non-negative integer")
    return names[int(text) % len(names)]
