"""Direct placement for point to point (pairs.py): a large message goes straight from the sender's array
into the receiver's, with no copy on either side.

The receiver registers a receive of at least DIRECT_MIN bytes in place (buffers.py: the registration is
kept for the next use of the same memory, as training loops reuse their buffers) and announces it: it
writes (number, address, length, tag, rkey) into a slot of the sender's mailbox, with an immediate that
says so. The sender, at a message with an announcement of its size and tag, writes the rest of it from its
own array, registered in place too, with one RDMA_WRITE_WITH_IMM whose immediate says which message ended
(DIRECT). Until the announcement has come it stages chunks rather than wait, so a message may begin staged
and end direct; a message that does not fit its announcement is staged whole, and the receiver finds the
mismatch in its header. At most MAILBOX receives are announced ahead of the first one not yet ended, and a
slot is written again only once the write before it is acknowledged, so a slot is overwritten only for a
message that the sender has finished.
"""

from __future__ import annotations

import numpy as np

from libshift.collectives.buffers import Buffers, Region
from libshift.collectives.peer import (
    ANNOUNCE_WR,
    ANNOUNCED,
    ANNOUNCEMENT,
    DIRECT,
    DIRECT_MIN,
    DIRECT_WR,
    MAIL_SLOT,
    MAILBOX,
    NUMBER,
    Peer,
)
from libshift.verbs import SGE, SendWR
from libshift.verbs import enums as e

AHEAD = 2 * MAILBOX  # registrations not (yet) reused that a peer's direct messages may have made


def announce(peer: Peer, buffers: Buffers) -> None:
    """Announce the large receives not yet announced, at most MAILBOX ahead of the first not ended, each
    with its array registered in place where that is worth it, else left to be staged."""
    for recv in peer.recvs:
        if recv.number >= peer.recvs_ended + MAILBOX or recv.number - MAILBOX in peer.announcing:
            return  # its mailbox slot may still hold an announcement the peer has not read
        if recv.decided:
            continue
        recv.decided = True  # once: buffers.in_place counts the uses of the same memory
        if recv.data.nbytes < DIRECT_MIN or (region := _registered(peer, buffers, recv.data)) is None:
            continue
        recv.region = region
        slot = recv.number % MAILBOX * MAIL_SLOT
        mine = MAILBOX * MAIL_SLOT + slot
        mr = region.mr
        ANNOUNCEMENT.pack_into(
            peer.mailbox.view, mine, recv.number, mr.buf, recv.data.nbytes, recv.tag, mr.rkey
        )
        address, rkey = peer.mail_target
        peer.qp.post_send(
            SendWR(
                wr_id=ANNOUNCE_WR | recv.number, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM,
                imm_data=ANNOUNCED | (recv.number & NUMBER),
                sg=[SGE(peer.mailbox.buf + mine, ANNOUNCEMENT.size, peer.mailbox.lkey)],
                remote_addr=address + slot, rkey=rkey,
            )
        )  # fmt: skip
        peer.announcing.add(recv.number)


def _registered(peer: Peer, buffers: Buffers, data: np.ndarray) -> Region | None:
    """A large message's array, registered in place: if it is kept from an earlier message, or if it came
    before (buffers.py) and the registrations made for this peer have been reused, give or take AHEAD. An
    array in fresh memory every time (`torch.empty` per call) would be registered every time: a
    registration costs a round trip to shiftd, and holds its memory, so the allocator hands out other
    memory the next time. Such arrays are staged once AHEAD registrations went unused."""
    kept = buffers.kept(data)
    if kept is not None:
        peer.reused += 1
        return kept
    if peer.registered >= peer.reused + AHEAD:
        return None
    region = buffers.in_place(data, at_once=False)
    peer.registered += region is not None
    return region


def take_announcement(peer: Peer, number: int) -> None:
    """An announcement landed in the mailbox (`number`: the low bits of its receive's number)."""
    at = number % MAILBOX * MAIL_SLOT
    full, address, length, tag, rkey = ANNOUNCEMENT.unpack_from(peer.mailbox.view, at)
    if full & NUMBER == number:  # else a later one took the slot: this one's message is gone already
        peer.announcements[full] = (address, length, rkey, tag)


def write(peer: Peer, buffers: Buffers) -> bool:
    """Write the rest of the first send straight into its receive, if the peer announced one that fits and
    the array is worth registering; whether it went."""
    send = peer.sends[0]
    announced = peer.announcements.get(send.number)
    if announced is None or send.decided:
        return False
    send.decided = True  # once: buffers.in_place counts the uses of the same memory
    address, length, rkey, tag = announced
    if (length, tag) != (send.data.nbytes, send.tag):
        return False
    region = _registered(peer, buffers, send.data)
    if region is None:
        return False
    del peer.announcements[send.number]
    peer.qp.post_send(
        SendWR(
            wr_id=DIRECT_WR | send.number, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM,
            imm_data=DIRECT | (send.number & NUMBER),
            sg=[SGE(region.mr.buf + send.offset, length - send.offset, region.mr.lkey)],
            remote_addr=address + send.offset, rkey=rkey,
        )
    )  # fmt: skip
    peer.direct[send.number] = peer.sends.popleft()
    return True
