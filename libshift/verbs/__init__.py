"""libshift's verbs API, shaped after pyverbs: `from libshift.verbs import Context, PD, MR, CQ, QP, ...`."""

from libshift.device import get_device_list
from libshift.verbs import enums
from libshift.verbs.attrs import Endpoint, QPAttr, QPCap, QPInitAttr
from libshift.verbs.errors import CQOverflowError, PyverbsError, PyverbsRDMAError, VerbsError, VerbsRDMAError
from libshift.verbs.objects import CQ, MR, PD, QP, CompChannel, Context
from libshift.verbs.wr import SGE, WC, RecvWR, SendWR

__all__ = [
    "CQ",
    "MR",
    "PD",
    "QP",
    "SGE",
    "WC",
    "CQOverflowError",
    "CompChannel",
    "Context",
    "Endpoint",
    "PyverbsError",
    "PyverbsRDMAError",
    "QPAttr",
    "QPCap",
    "QPInitAttr",
    "RecvWR",
    "SendWR",
    "VerbsError",
    "VerbsRDMAError",
    "enums",
    "get_device_list",
]
