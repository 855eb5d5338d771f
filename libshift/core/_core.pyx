# cython: language_level=3, boundscheck=False, wraparound=False
"""The Cython face of the C core (shift_core.h): one class per core object, as pyverbs faces libibverbs.

The C side only ever sees pointers and numbers. What keeps Python objects alive is here: an MR holds the
buffer it registered (a Py_buffer export, so a bytearray cannot be resized under the transport) until the
core says nothing uses the memory any more; an MR still busy when closed waits in its context's graveyard.
Every object holds its Context and does nothing once the context is closed, since sc_ctx_free has freed it.
The interpreter lock is released only around the calls that block (a channel wait, closing a context), so a
post or a poll cannot overlap a close. A channel or its context may be closed while another thread waits
on it (Guarded): the close waits for that wait to leave before it frees, and later calls are refused (a
post raises VerbsRDMAError, a poll finds nothing, a wait ends): never a freed pointer in use.
"""

cimport cython
from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.errno cimport errno
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc

cimport libshift.core.cfast as f
cimport libshift.core.clinkwatch as lw
cimport libshift.core.cshift as c

from enum import IntEnum
from time import monotonic

from libshift.vocabulary.enums import ibv_qp_state
from libshift.vocabulary.errors import VerbsRDMAError

DEF POLL_BATCH = 64


cdef extern from "<sched.h>" nogil:
    int sched_yield()


include "face.pxi"


cdef class Context(Guarded):
    """Guarded too: a channel wait reads the context's sockets, so closing waits for the waits to end."""
    cdef c.sc_ctx *ptr
    cdef list graveyard  # MRs closed while a transfer still used their memory

    def __cinit__(self):
        self.ptr = c.sc_ctx_new()
        if self.ptr is NULL:
            raise OSError("shift core: cannot start a context (threads or descriptors exhausted)")
        self.graveyard = []

    def listen(self, int fd):
        """Hand the core a listening socket (it owns it from here): the port of the QPNs port << 8 | i."""
        if self.closed:
            raise VerbsRDMAError("the context is closed")
        if c.sc_ctx_listen(self.ptr, fd) != 0:
            raise MemoryError()

    def progress(self):
        """One non-blocking pass of progress on this thread."""
        if not self.closed:
            c.sc_ctx_progress(self.ptr)

    @property
    def failures(self):
        return 0 if self.closed else c.sc_ctx_failures(self.ptr)

    cdef void bury(self, MR mr):
        self.graveyard.append(mr)
        self.graveyard = [m for m in self.graveyard if not (<MR>m).try_free()]

    def close(self):
        if self.closed:
            return
        with nogil:
            c.sc_ctx_wake_waiters(self.ptr)  # channel waits return, see `closed` and leave
        self.quiesce()
        with nogil:
            c.sc_ctx_free(self.ptr)
        for mr in self.graveyard:
            (<MR>mr).release_buffer()
        self.graveyard = []

    def __dealloc__(self):
        if not self.closed and self.ptr is not NULL:
            c.sc_ctx_free(self.ptr)


cdef class PD:
    cdef c.sc_pd *ptr
    cdef Context ctx
    cdef bint closed

    def __cinit__(self, Context ctx):
        self.ctx = ctx
        self.ptr = c.sc_pd_new(ctx.ptr)
        if self.ptr is NULL:
            raise MemoryError()

    def close(self):
        if not self.closed and not self.ctx.closed:
            c.sc_pd_free(self.ptr)
        self.closed = True


cdef class MR:
    cdef c.sc_mr *ptr
    cdef Context ctx
    cdef object buffer
    cdef bint holding, closed
    cdef c.Py_buffer view

    def __cinit__(self, PD pd, object buffer, uint64_t length, uint32_t access):
        self.ctx = pd.ctx
        PyObject_GetBuffer(buffer, &self.view, PyBUF_WRITABLE)
        self.holding = True
        self.buffer = buffer
        if <uint64_t>self.view.len < length:
            self.release_buffer()
            raise ValueError(f"MR buffer: {self.view.len} bytes, fewer than the length {length}")
        self.ptr = c.sc_mr_reg(pd.ptr, self.view.buf, length, access)
        if self.ptr is NULL:
            self.release_buffer()
            raise MemoryError()

    @property
    def addr(self):
        return <uint64_t><size_t>self.view.buf

    @property
    def lkey(self):
        return c.sc_mr_lkey(self.ptr)

    @property
    def rkey(self):
        return c.sc_mr_rkey(self.ptr)

    cdef void release_buffer(self):
        if self.holding:
            PyBuffer_Release(&self.view)
            self.holding = False
        self.buffer = None

    cdef bint try_free(self):
        if self.ctx.closed or c.sc_mr_try_free(self.ptr):
            self.release_buffer()
            return True
        return False

    def close(self):
        if self.closed:
            return
        self.closed = True
        if self.ctx.closed:
            self.release_buffer()
            return
        c.sc_mr_dereg(self.ptr)
        if not self.try_free():
            self.ctx.bury(self)

    def __dealloc__(self):
        if self.holding:
            PyBuffer_Release(&self.view)


cdef class Channel(Guarded):
    cdef c.sc_chan *ptr
    cdef Context ctx

    def __cinit__(self, Context ctx):
        self.ctx = ctx
        self.ptr = c.sc_chan_new(ctx.ptr)
        if self.ptr is NULL:
            raise OSError("shift core: cannot make a completion channel")

    def fileno(self):
        return -1 if self.closed else c.sc_chan_fd(self.ptr)

    def wait(self, timeout):
        """The cookie of the next armed CQ that got a completion; None when woken or after timeout s.
        The interpreter lock is released while it waits; meanwhile this thread reads the context's
        sockets itself (sc_chan_wait's drive), until they have been idle for a while."""
        cdef uint64_t cookie = 0
        cdef int got, ms
        cdef bint drive = True
        end = None if timeout is None else monotonic() + timeout
        if not self.hold():
            return None
        try:
            while not self.ctx.closed and not self.closed:
                if end is None:
                    ms = -1
                else:
                    left = end - monotonic()
                    ms = max(0, int(left * 1000 + 0.999))
                with nogil:
                    got = c.sc_chan_wait(self.ptr, ms, drive, &cookie)
                if got == 1:
                    return cookie
                if got != 3:  # woken, or the time is up
                    return None
                drive = False
            return None
        finally:
            self.let_go()

    cdef bint hold(self):
        """Count a wait in, on the channel and its context (False: either is closed; nothing counted)."""
        if not self.enter():
            return False
        if not self.ctx.enter():
            self.leave()
            return False
        return True

    cdef void let_go(self):
        self.ctx.leave()
        self.leave()

    def wake(self):
        if not self.ctx.closed and not self.closed:
            c.sc_chan_wake(self.ptr)

    def close(self):
        if self.closed:
            return
        if not self.ctx.closed:
            c.sc_chan_wake(self.ptr)  # a waiter in poll() returns, sees `closed` and leaves
        self.quiesce()
        if not self.ctx.closed:
            c.sc_chan_free(self.ptr)


cdef class CQ:
    cdef c.sc_cq *ptr
    cdef Context ctx
    cdef bint closed
    cdef public uint32_t cqe

    def __cinit__(self, Context ctx, uint32_t cqe, Channel channel, uint64_t cookie):
        self.ctx = ctx
        self.cqe = cqe
        self.ptr = c.sc_cq_new(ctx.ptr, cqe, NULL if channel is None else channel.ptr, cookie)
        if self.ptr is NULL:
            raise MemoryError()

    def poll(self, int num_entries):
        """Up to num_entries WCs, oldest first; None once the CQ has overflowed."""
        cdef c.sc_wc wcs[POLL_BATCH]
        cdef int got, i, want
        out = []
        if self.closed or self.ctx.closed:
            return out
        while True:
            want = max(0, min(num_entries, POLL_BATCH))  # poll(0) asks too: it makes progress, sees overflow
            got = c.sc_cq_poll(self.ptr, want, wcs)
            if got < 0:
                return None
            for i in range(got):
                out.append(wc_of(&wcs[i]))
            num_entries -= got
            if got < want or num_entries <= 0:
                return out

    def req_notify(self, bint solicited_only):
        if not self.closed and not self.ctx.closed:
            c.sc_cq_req_notify(self.ptr, solicited_only)

    def close(self):
        if self.closed:
            return
        self.closed = True
        if not self.ctx.closed:
            c.sc_cq_free(self.ptr)


cdef class QP:
    cdef c.sc_qp *ptr
    cdef Context ctx
    cdef bint closed
    cdef uint32_t qpn

    def __cinit__(self, PD pd, CQ send_cq, CQ recv_cq, tuple cap, bint sq_sig_all, uint32_t qpn,
                  uint32_t local_ip):
        cdef c.sc_cap ccap
        ccap.max_send_wr, ccap.max_recv_wr, ccap.max_send_sge, ccap.max_recv_sge, ccap.max_inline_data = cap
        self.ctx = pd.ctx
        self.qpn = qpn
        self.ptr = c.sc_qp_new(pd.ptr, send_cq.ptr, recv_cq.ptr, &ccap, sq_sig_all, qpn, local_ip)
        if self.ptr is NULL:
            raise MemoryError()

    @property
    def state(self):
        return int(ibv_qp_state.IBV_QPS_ERR) if self.closed else c.sc_qp_state(self.ptr)

    cdef int refuse_if_closed(self) except -1:
        if self.closed:
            raise VerbsRDMAError(f"QP {self.qpn}: the QP is closed")
        return 0

    def to_init(self, uint32_t access):
        self.refuse_if_closed()
        c.sc_qp_to_init(self.ptr, access)

    def connects(self, uint32_t remote_ip, uint32_t remote_qpn):
        """Whether this side connects to that peer at RTR (the other accepts): only it needs a socket."""
        self.refuse_if_closed()
        return bool(c.sc_qp_connects(self.ptr, remote_ip, remote_qpn))

    def set_local_ip(self, uint32_t local_ip):
        """The device's address now (re-addressed since the QP was made), for `connects`."""
        self.refuse_if_closed()
        c.sc_qp_set_local_ip(self.ptr, local_ip)

    def to_rtr(self, uint32_t remote_ip, uint32_t remote_qpn, uint32_t rq_psn, int min_rnr_timer, int fd):
        """fd: a socket for the core to connect with if this side connects, else -1."""
        self.refuse_if_closed()
        c.sc_qp_to_rtr(self.ptr, remote_ip, remote_qpn, rq_psn, min_rnr_timer, fd)

    def to_rts(self, uint64_t ack_timeout_ns, uint64_t retry_period_ns, int rnr_retry, uint32_t sq_psn):
        self.refuse_if_closed()
        c.sc_qp_to_rts(self.ptr, ack_timeout_ns, retry_period_ns, rnr_retry, sq_psn)

    def to_err(self):
        self.refuse_if_closed()
        c.sc_qp_to_err(self.ptr)

    def reset(self):
        self.refuse_if_closed()
        c.sc_qp_reset(self.ptr)

    def post_send(self, wrs):
        """Post SendWRs in order: (POST_OK or why the next one was refused, how many were posted)."""
        cdef SendWRs batch = SendWRs(wrs)
        cdef int posted = 0
        self.refuse_if_closed()
        err = c.sc_qp_post_send(self.ptr, batch.wrs, batch.n, &posted)
        return err, posted

    def post_recv(self, wrs):
        """Post RecvWRs in order: (POST_OK or why the next one was refused, how many were posted)."""
        cdef RecvWRs batch = RecvWRs(wrs)
        cdef int posted = 0
        self.refuse_if_closed()
        err = c.sc_qp_post_recv(self.ptr, batch.wrs, batch.n, &posted)
        return err, posted

    def close(self):
        if self.closed:
            return
        self.closed = True
        if not self.ctx.closed:
            c.sc_qp_free(self.ptr)


cdef double measured(double value, str what) except -1:
    """A baseline's figure, or OSError: the C side says -1 when the socket failed."""
    if value < 0:
        raise OSError(f"{what}: the socket failed")
    return value


def raw_pingpong(int fd, uint32_t size, uint32_t iters, bint first):
    """Half round trip (s) of `iters` ping-pongs of `size` bytes on a connected blocking TCP socket, in C
    with the interpreter lock released (shift-perf's baseline)."""
    cdef double half
    with nogil:
        half = c.sc_raw_pingpong(fd, size, iters, first)
    return measured(half, "raw ping-pong")


def raw_stream(int fd, uint64_t total, uint32_t chunk, bint sending):
    """Bytes/s of a `total`-byte TCP stream in `chunk`-byte writes, as the sender sees it (shift-perf's
    baseline), in C with the interpreter lock released."""
    cdef double rate
    with nogil:
        rate = c.sc_raw_stream(fd, total, chunk, sending)
    return measured(rate, "raw stream")


# The frame format (wire.h), for libshift.core.wire: the numbers and the packing are the core's own,
# never a second copy in Python.
WIRE_MAGIC = c.SC_WIRE_MAGIC


class Op(IntEnum):
    HELLO = c.SC_OP_HELLO
    SEND = c.SC_OP_SEND
    SEND_IMM = c.SC_OP_SEND_IMM
    WRITE = c.SC_OP_WRITE
    WRITE_IMM = c.SC_OP_WRITE_IMM
    READ_REQ = c.SC_OP_READ_REQ
    CMP_SWP = c.SC_OP_CMP_SWP
    FETCH_ADD = c.SC_OP_FETCH_ADD
    ACK = c.SC_OP_ACK
    NAK = c.SC_OP_NAK
    READ_RESP = c.SC_OP_READ_RESP
    ATOMIC_RESP = c.SC_OP_ATOMIC_RESP
    REFUSE = c.SC_OP_REFUSE


REQUESTS = frozenset(op for op in Op if c.sc_wire_is_request(op))


def pack_header(int op, uint32_t seq, uint32_t length=0, *, uint16_t flags=0, uint32_t rkey=0,
                uint32_t imm=0, uint64_t addr=0, uint64_t arg1=0, uint64_t arg2=0, uint32_t ack=0):
    """One frame's header, as the core packs it (its magic; `op` may be any byte, for a fuzzer)."""
    cdef c.sc_hdr hdr
    cdef uint8_t out[c.SC_WIRE_HEADER_SIZE]
    if not 0 <= op <= 255:
        raise ValueError(f"op {op}: a frame's op is one byte")
    hdr.magic, hdr.op, hdr.flags, hdr.seq, hdr.length = c.SC_WIRE_MAGIC, op, flags, seq, length
    hdr.rkey, hdr.imm, hdr.addr, hdr.arg1, hdr.arg2, hdr.ack = rkey, imm, addr, arg1, arg2, ack
    c.sc_wire_pack(&hdr, out)
    return bytes(out[:c.SC_WIRE_HEADER_SIZE])


cdef const f.sc_dp *DATAPATH = &f.sc_dp_tcp


cdef void hook_control(CQ cq, f.sf_ctx *ctx):
    """The progress thread takes the control messages of a backup path the moment they come."""
    if not cq.closed and not cq.ctx.closed:
        c.sc_cq_set_filled(cq.ptr, f.sf_ctx_controls_act, ctx)


cdef void unhook_control(CQ cq):
    if not cq.closed and not cq.ctx.closed:
        with nogil:
            c.sc_cq_set_filled(cq.ptr, NULL, NULL)

include "fastpath.pxi"
include "linkwatch.pxi"
