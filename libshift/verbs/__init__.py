"""libshift's verbs API, shaped after pyverbs: `from libshift.verbs import Context, PD, MR, CQ, QP, ...`.

The public face of two floors: the vocabulary (libshift.vocabulary: enums, attributes, work requests, errors)
and, standing on it, the objects and device lookup. Code above this floor imports these names from here.
"""

from libshift.device import get_device_list
from libshift.verbs.objects import CQ, MR, PD, QP, Buffer, CompChannel, Context, QPInitAttr
from libshift.vocabulary import enums
from libshift.vocabulary.attrs import (
    GID,
    AHAttr,
    DeviceAttr,
    Endpoint,
    GlobalRoute,
    PortAttr,
    QPAttr,
    QPCap,
    ack_deadline,
)
from libshift.vocabulary.enums import (
    ibv_access_flags,
    ibv_mtu,
    ibv_port_state,
    ibv_qp_attr_mask,
    ibv_qp_state,
    ibv_qp_type,
    ibv_send_flags,
    ibv_wc_flags,
    ibv_wc_opcode,
    ibv_wc_status,
    ibv_wr_opcode,
)
from libshift.vocabulary.errors import (
    CQOverflowError,
    PyverbsError,
    PyverbsRDMAError,
    VerbsError,
    VerbsRDMAError,
)
from libshift.vocabulary.wr import SGE, WC, RecvWR, SendWR

__all__ = [
    "CQ",
    "GID",
    "MR",
    "PD",
    "QP",
    "SGE",
    "WC",
    "AHAttr",
    "Buffer",
    "CQOverflowError",
    "CompChannel",
    "Context",
    "DeviceAttr",
    "Endpoint",
    "GlobalRoute",
    "PortAttr",
    "PyverbsError",
    "PyverbsRDMAError",
    "QPAttr",
    "QPCap",
    "QPInitAttr",
    "RecvWR",
    "SendWR",
    "VerbsError",
    "VerbsRDMAError",
    "ack_deadline",
    "enums",
    "get_device_list",
    "ibv_access_flags",
    "ibv_mtu",
    "ibv_port_state",
    "ibv_qp_attr_mask",
    "ibv_qp_state",
    "ibv_qp_type",
    "ibv_send_flags",
    "ibv_wc_flags",
    "ibv_wc_opcode",
    "ibv_wc_status",
    "ibv_wr_opcode",
]
