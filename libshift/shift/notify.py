"""The control traffic between the two halves of a resilient QP pair, on whichever of its paths.

The notification: an RDMA_WRITE_WITH_IMM whose immediate is our count of completed two-sided receives. It is
sent on the path being switched to, and lands in a control receive that each side keeps at the head of that
path's receive queue, so it never lands in an application buffer.

Messages: "re-arm path P" / "P is armed" (before a failback: the requester arms its side on the answer)
travel as a plain 16-byte RDMA_WRITE (the word and its complement, so a torn read is never taken for a
message) on the path in use, into the peer's control MR for that path; they consume no receive, so they
never disturb the application's receive queue. The watcher thread reads the word. A probe (a zero-byte
RDMA_WRITE) proves a re-armed path carries traffic before anything moves onto it.

Where each control MR is (one per path, on that path's device) travels with the published backup endpoint
(provider_data "shift_notify"), so the peer learns it from the same lookup that gives it the backup QP.
"""

from __future__ import annotations

import dataclasses
import enum

from libshift.shift.paths import BACKUP, PATHS, PRIMARY
from libshift.shift.rewind import COUNT_MASK
from libshift.verbs import MR, QP, SGE, Endpoint, RecvWR, SendWR, VerbsError, enums

ibv_send_flags, ibv_wr_opcode = enums.ibv_send_flags, enums.ibv_wr_opcode

NOTIFY_RECV = 1 << 62  # wr_ids of our own control WRs, far above the ledger's
NOTIFY_SEND = NOTIFY_RECV + 1
MESSAGE_SEND = NOTIFY_RECV + 2
PROBE_SEND = NOTIFY_RECV + 3
CONTROL_IDS = frozenset({NOTIFY_RECV, NOTIFY_SEND, MESSAGE_SEND, PROBE_SEND})
CONTROL_BYTES = 32  # [0:16] the peer's latest message to us, [16:32] the source of ours
WORD = 0xFFFFFFFFFFFFFFFF
KEY = "shift_notify"


class Kind(enum.IntEnum):
    REARM = 1  # "re-arm path P; I will arm mine when you say it is armed"
    ARMED = 2  # "path P is armed here too"


@dataclasses.dataclass(frozen=True)
class Message:
    kind: Kind
    path: str
    epoch: int

    def encode(self) -> int:
        return self.epoch << 16 | self.kind << 8 | PATHS.index(self.path)

    @classmethod
    def decode(cls, word: int) -> Message | None:
        kind, path = word >> 8 & 0xFF, word & 0xFF
        if kind not in Kind._value2member_map_ or path >= len(PATHS):
            return None
        return cls(Kind(kind), PATHS[path], word >> 16)


def advertise(endpoint: Endpoint, controls: dict[str, MR]) -> Endpoint:
    """The backup endpoint as published: the QP's own data plus where control traffic for us goes."""
    where = {path: {"addr": mr.buf, "rkey": mr.rkey} for path, mr in controls.items()}
    return dataclasses.replace(endpoint, provider_data={**endpoint.provider_data, KEY: where})


def targets_of(endpoint: Endpoint) -> dict[str, tuple[int, int]]:
    """path -> (addr, rkey) of the peer's control MRs, from its published backup endpoint: the default
    path's and the backup's at least, and one for each further backup the peer keeps."""
    try:
        where = endpoint.provider_data[KEY]
        paths = [path for path in PATHS if path in where]
        if PRIMARY not in paths or BACKUP not in paths:
            raise KeyError(BACKUP)
        return {path: (int(where[path]["addr"]), int(where[path]["rkey"])) for path in paths}
    except (KeyError, TypeError, ValueError):
        raise VerbsError(f"backup endpoint {endpoint.gid}/{endpoint.qpn} carries no {KEY} targets") from None


def arm(qp: QP) -> None:
    """Post the receive the peer's notification will consume."""
    qp.post_recv(RecvWR(wr_id=NOTIFY_RECV))


def send_count(qp: QP, target: tuple[int, int], count: int) -> None:
    """Tell the peer how many two-sided messages we have received (mod 2**32)."""
    wr = SendWR(
        wr_id=NOTIFY_SEND,
        opcode=ibv_wr_opcode.IBV_WR_RDMA_WRITE_WITH_IMM,
        send_flags=ibv_send_flags.IBV_SEND_SIGNALED,
        imm_data=count & COUNT_MASK,
    )
    wr.set_wr_rdma(target[1], target[0])
    qp.post_send(wr)


def send_message(qp: QP, own: MR, target: tuple[int, int], message: Message) -> None:
    word = message.encode()
    own.write(word.to_bytes(8, "little") + (word ^ WORD).to_bytes(8, "little"), offset=16)
    _write(qp, MESSAGE_SEND, [SGE(own.buf + 16, 16, own.lkey)], target)


def probe(qp: QP, target: tuple[int, int]) -> None:
    """A zero-byte write: its completion says the path carries traffic both ways."""
    _write(qp, PROBE_SEND, [], target)


def _write(qp: QP, wr_id: int, sg: list[SGE], target: tuple[int, int]) -> None:
    wr = SendWR(
        wr_id=wr_id,
        opcode=ibv_wr_opcode.IBV_WR_RDMA_WRITE,
        sg=sg,
        send_flags=ibv_send_flags.IBV_SEND_SIGNALED,
    )
    wr.set_wr_rdma(target[1], target[0])
    qp.post_send(wr)


def latest(own: MR) -> Message | None:
    """The peer's latest message on this control MR (None before the first, or while half written)."""
    raw = own.read(16)
    word, check = int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")
    return Message.decode(word) if word and word ^ check == WORD else None
