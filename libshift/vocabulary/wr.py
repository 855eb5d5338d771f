"""Work requests and work completions: what the application hands to a QP and gets back from a CQ."""

from __future__ import annotations

from dataclasses import dataclass, field

from libshift.vocabulary.enums import ibv_send_flags, ibv_wc_opcode, ibv_wc_status, ibv_wr_opcode


@dataclass
class SGE:
    """One piece of a scatter/gather list: an address inside an MR (mr.buf + offset), its length, the lkey."""

    addr: int
    length: int
    lkey: int


@dataclass
class SendWR:
    """A send-queue work request, its first six fields in pyverbs' order; remote_addr/rkey for RDMA,
    compare_add/swap for atomics. num_sge None (the default) takes the whole sg list."""

    wr_id: int = 0
    opcode: ibv_wr_opcode = ibv_wr_opcode.IBV_WR_SEND
    num_sge: int | None = None
    imm_data: int = 0
    sg: list[SGE] = field(default_factory=list)
    send_flags: int = ibv_send_flags.IBV_SEND_SIGNALED
    remote_addr: int = 0
    rkey: int = 0
    compare_add: int = 0
    swap: int = 0

    def set_wr_rdma(self, rkey: int, addr: int) -> None:
        """pyverbs spelling of setting the RDMA target."""
        self.rkey, self.remote_addr = rkey, addr

    def set_wr_atomic(self, rkey: int, addr: int, compare_add: int, swap: int = 0) -> None:
        """pyverbs spelling of setting the atomic target and operands."""
        self.rkey, self.remote_addr, self.compare_add, self.swap = rkey, addr, compare_add, swap

    def sges(self) -> list[SGE]:
        """The gather list, honouring num_sge as ibverbs does."""
        return self.sg if self.num_sge is None else self.sg[: self.num_sge]

    def copy_with(self, wr_id: int, sg: list[SGE], send_flags: int, rkey: int) -> SendWR:
        """This WR with another id, gather list, flags and rkey: what a layer below the application posts
        in its stead (spelled out: dataclasses.replace costs several microseconds a post)."""
        return SendWR(
            wr_id, self.opcode, None, self.imm_data, sg, send_flags, self.remote_addr, rkey, self.compare_add,
            self.swap,
        )  # fmt: skip


@dataclass
class RecvWR:
    """A receive-queue work request: where an incoming SEND is scattered."""

    wr_id: int = 0
    num_sge: int | None = None
    sg: list[SGE] = field(default_factory=list)

    def sges(self) -> list[SGE]:
        """The scatter list, honouring num_sge as ibverbs does."""
        return self.sg if self.num_sge is None else self.sg[: self.num_sge]


@dataclass(slots=True)
class WC:
    """A work completion, with ibverbs' field names (all of pyverbs' WC's; the last four are UD's and read 0
    on RC). Not frozen, as pyverbs' is not: a frozen dataclass costs microseconds to build, once per
    completion."""

    wr_id: int
    status: ibv_wc_status
    opcode: ibv_wc_opcode
    qp_num: int
    byte_len: int = 0
    imm_data: int = 0
    wc_flags: int = 0
    src_qp: int = 0
    vendor_err: int = 0
    pkey_index: int = 0
    slid: int = 0
    sl: int = 0
    dlid_path_bits: int = 0
