# cython: language_level=3, boundscheck=False, wraparound=False
"""The Cython face of the core's verbs backend (verbs_core.h): one class per object, as _core faces the tcp
engine, with the same work requests, completions and post results.

libibverbs is loaded on the first object made (never at import: a host without rdma-core imports this
module, and `unavailable()` says why it cannot be used). A device's objects must go before what they were
made on, as in libibverbs: each object counts its users, and closing one still in use is refused with a
VerbsError naming them. The interpreter lock is released only around a channel wait; a channel closed
under a wait first wakes it and waits for it to leave (Guarded), so no freed pointer is ever used.
"""

cimport cython
from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.errno cimport EIO, errno
from libc.string cimport memcpy

cimport libshift.core.cfast as f
cimport libshift.core.cshift as c
cimport libshift.core.cverbs as v

from time import monotonic

from libshift.vocabulary.errors import VerbsError, VerbsRDMAError

DEF POLL_BATCH = 64


cdef extern from "<sched.h>" nogil:
    int sched_yield()


include "face.pxi"


def unavailable():
    """None when libibverbs can be loaded, else why not (one line)."""
    return None if v.sv_available() else v.sv_error().decode()


cdef str last_error():
    return v.sv_error().decode(errors="replace")


cdef object failure():
    """The last call's failure as a VerbsRDMAError, with the errno it left (EIO when it left none)."""
    return VerbsRDMAError(last_error(), errno or EIO)


def error():
    """What this thread's last failed call said (a post's SC_POST_DEVICE: the device's reason)."""
    return last_error()


cdef class Used(Guarded):
    """An object others are made on: it counts them, and refuses to close while any is open."""
    cdef int users
    cdef str what

    cdef int refuse_if_used(self) except -1:
        if self.users:
            raise VerbsError(f"{self.what}: {self.users} objects made on it are still open; close them first")
        return 0


cdef Used use(Used parent):
    if parent.closed:
        raise VerbsError(f"{parent.what} is closed")
    parent.users += 1
    return parent


cdef class Context(Used):
    cdef v.sv_ctx *ptr
    cdef public str name

    def __cinit__(self, str name, uint8_t port=1):
        self.name = name
        self.what = f"device {name}"
        self.ptr = v.sv_ctx_open(name.encode(), port)
        if self.ptr is NULL:
            raise failure()

    def port(self):
        """(state, active_mtu, lid, link_layer, gid_tbl_len), ibverbs' numbers."""
        cdef v.sv_port p
        if self.closed or v.sv_ctx_port(self.ptr, &p):
            raise VerbsError(f"{self.name}: " + (last_error() if not self.closed else "closed"))
        return p.state, p.active_mtu, p.lid, p.link_layer, p.gid_tbl_len

    def gid(self, int index):
        cdef uint8_t raw[16]
        if self.closed or v.sv_ctx_gid(self.ptr, index, raw):
            raise VerbsError(f"{self.name}: " + (last_error() if not self.closed else "closed"))
        return bytes(raw[:16])

    def event_fd(self):
        return -1 if self.closed else v.sv_ctx_event_fd(self.ptr)

    def event(self):
        """The next async event as (type, qp_num, port, cq_cookie), or None: it never blocks."""
        cdef v.sv_event e
        if self.closed or not v.sv_ctx_event(self.ptr, &e):
            return None
        return e.type, e.qp_num, e.port, e.cq_cookie

    def close(self):
        if self.closed:
            return
        self.refuse_if_used()
        self.closed = True
        v.sv_ctx_free(self.ptr)

    def __dealloc__(self):
        if not self.closed and self.ptr is not NULL:
            v.sv_ctx_free(self.ptr)


cdef class PD(Used):
    cdef v.sv_pd *ptr
    cdef Context ctx

    def __cinit__(self, Context ctx):
        self.what = f"a PD of {ctx.name}"
        self.ctx = <Context>use(ctx)
        self.ptr = v.sv_pd_new(ctx.ptr)
        if self.ptr is NULL:
            ctx.users -= 1
            raise failure()

    def close(self):
        if self.closed:
            return
        self.refuse_if_used()
        self.closed = True
        v.sv_pd_free(self.ptr)
        self.ctx.users -= 1

    def __dealloc__(self):
        if not self.closed and self.ptr is not NULL:
            v.sv_pd_free(self.ptr)


cdef class MR:
    """Holds the buffer it registered (a Py_buffer export: a bytearray cannot be resized under the device)."""
    cdef v.sv_mr *ptr
    cdef PD pd
    cdef bint holding, closed
    cdef c.Py_buffer view

    def __cinit__(self, PD pd, object buffer, uint64_t length, uint32_t access):
        PyObject_GetBuffer(buffer, &self.view, PyBUF_WRITABLE)
        self.holding = True
        if <uint64_t>self.view.len < length:
            self.release()
            raise ValueError(f"MR buffer: {self.view.len} bytes, fewer than the length {length}")
        self.pd = <PD>use(pd)
        self.ptr = v.sv_mr_reg(pd.ptr, self.view.buf, length, access)
        if self.ptr is NULL:
            pd.users -= 1
            self.release()
            raise failure()

    @property
    def addr(self):
        return <uint64_t><size_t>self.view.buf

    @property
    def lkey(self):
        return v.sv_mr_lkey(self.ptr)

    @property
    def rkey(self):
        return v.sv_mr_rkey(self.ptr)

    cdef void release(self):
        if self.holding:
            PyBuffer_Release(&self.view)
            self.holding = False

    def close(self):
        if self.closed:
            return
        if v.sv_mr_dereg(self.ptr):
            raise failure()
        self.closed = True
        self.pd.users -= 1
        self.release()

    def __dealloc__(self):
        if not self.closed and self.ptr is not NULL:
            v.sv_mr_dereg(self.ptr)
        self.release()


cdef class Channel(Used):
    cdef v.sv_chan *ptr
    cdef Context ctx

    def __cinit__(self, Context ctx):
        self.what = f"a completion channel of {ctx.name}"
        self.ctx = <Context>use(ctx)
        self.ptr = v.sv_chan_new(ctx.ptr)
        if self.ptr is NULL:
            ctx.users -= 1
            raise failure()

    def fileno(self):
        return -1 if self.closed else v.sv_chan_fd(self.ptr)

    def wait(self, timeout):
        """The cookie of the next armed CQ that got a completion; None when woken or after timeout s.
        The interpreter lock is released while it waits."""
        cdef uint64_t cookie = 0
        cdef int got, ms = -1
        if timeout is not None:
            ms = max(0, int(timeout * 1000 + 0.999))
        if not self.hold():
            return None
        try:
            with nogil:
                got = v.sv_chan_wait(self.ptr, ms, 0, &cookie)
        finally:
            self.let_go()
        return cookie if got == 1 and not self.closed else None

    cdef bint hold(self):
        """Count a wait in (False: the channel is closed; nothing counted)."""
        return self.enter()

    cdef void let_go(self):
        self.leave()

    def take(self):
        """As wait, without waiting."""
        cdef uint64_t cookie = 0
        if self.closed:
            return None
        return cookie if v.sv_chan_take(self.ptr, &cookie) == 1 else None

    def wake(self):
        if not self.closed:
            v.sv_chan_wake(self.ptr)

    def close(self):
        if self.closed:
            return
        self.refuse_if_used()
        v.sv_chan_wake(self.ptr)  # a waiter returns, sees `closed` and leaves
        self.quiesce()
        v.sv_chan_free(self.ptr)
        self.ctx.users -= 1

    def __dealloc__(self):
        if not self.closed and self.ptr is not NULL:
            v.sv_chan_free(self.ptr)


cdef class CQ(Used):
    cdef v.sv_cq *ptr
    cdef Context ctx
    cdef Channel channel
    cdef readonly uint32_t cqe  # as granted

    def __cinit__(self, Context ctx, uint32_t cqe, Channel channel, uint64_t cookie):
        self.what = f"a CQ of {ctx.name}"
        self.ctx = <Context>use(ctx)
        self.channel = None if channel is None else <Channel>use(channel)
        self.ptr = v.sv_cq_new(ctx.ptr, cqe, NULL if channel is None else channel.ptr, cookie)
        if self.ptr is NULL:
            self.unuse()
            raise failure()
        self.cqe = v.sv_cq_cqe(self.ptr)

    cdef void unuse(self):
        self.ctx.users -= 1
        if self.channel is not None:
            self.channel.users -= 1

    def poll(self, int num_entries):
        """Up to num_entries WCs, oldest first; None once the device has said the CQ overflowed."""
        cdef c.sc_wc wcs[POLL_BATCH]
        cdef int got, i, want
        out = []
        if self.closed:
            return out
        while num_entries > 0:
            want = min(num_entries, POLL_BATCH)
            got = v.sv_cq_poll(self.ptr, want, wcs)
            if got < 0:
                return None
            for i in range(got):
                out.append(wc_of(&wcs[i]))
            num_entries -= got
            if got < want:
                break
        return out

    def req_notify(self, bint solicited_only):
        if not self.closed and v.sv_cq_req_notify(self.ptr, solicited_only):
            raise VerbsRDMAError(last_error())

    def close(self):
        if self.closed:
            return
        self.refuse_if_used()
        if v.sv_cq_free(self.ptr):
            raise failure()
        self.closed = True
        self.unuse()

    def __dealloc__(self):
        if not self.closed and self.ptr is not NULL:
            v.sv_cq_free(self.ptr)


cdef class QP:
    cdef v.sv_qp *ptr
    cdef PD pd
    cdef CQ send_cq, recv_cq
    cdef bint closed
    cdef public uint32_t qp_num

    def __cinit__(self, PD pd, CQ send_cq, CQ recv_cq, tuple cap, bint sq_sig_all):
        cdef c.sc_cap ccap
        ccap.max_send_wr, ccap.max_recv_wr, ccap.max_send_sge, ccap.max_recv_sge, ccap.max_inline_data = cap
        self.pd, self.send_cq, self.recv_cq = <PD>use(pd), <CQ>use(send_cq), <CQ>use(recv_cq)
        self.ptr = v.sv_qp_new(pd.ptr, send_cq.ptr, recv_cq.ptr, &ccap, sq_sig_all)
        if self.ptr is NULL:
            self.unuse()
            raise failure()
        self.qp_num = v.sv_qp_num(self.ptr)

    cdef void unuse(self):
        self.pd.users -= 1
        self.send_cq.users -= 1
        self.recv_cq.users -= 1

    @property
    def cap(self):
        """What the device granted: (max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data)."""
        cdef c.sc_cap got
        v.sv_qp_cap(self.ptr, &got)
        return got.max_send_wr, got.max_recv_wr, got.max_send_sge, got.max_recv_sge, got.max_inline_data

    @property
    def state(self):
        """The state as the device has it."""
        self.refuse_if_closed()
        cdef int state = v.sv_qp_state(self.ptr)
        if state < 0:
            raise VerbsRDMAError(last_error())
        return state

    @property
    def last_state(self):
        """The state the last transition set (no device call)."""
        self.refuse_if_closed()
        return v.sv_qp_last_state(self.ptr)

    cdef int refuse_if_closed(self) except -1:
        if self.closed:
            raise VerbsRDMAError(f"QP {self.qp_num}: the QP is closed")
        return 0

    cdef int done(self, int err) except -1:
        if err:
            raise VerbsRDMAError(last_error(), err)
        return 0

    def to_init(self, uint32_t access):
        self.refuse_if_closed()
        self.done(v.sv_qp_to_init(self.ptr, access))

    def to_rtr(self, bytes gid, uint32_t qpn, uint32_t lid, uint32_t sgid_index, uint32_t mtu, uint32_t rq_psn,
               uint8_t min_rnr_timer, uint8_t max_dest_rd_atomic):
        cdef v.sv_dest dest
        if len(gid) != 16:
            raise ValueError(f"a GID is 16 bytes, not {len(gid)}")
        self.refuse_if_closed()
        memcpy(dest.gid, <const char *>gid, 16)
        dest.qpn, dest.lid, dest.sgid_index, dest.mtu = qpn, lid, sgid_index, mtu
        self.done(v.sv_qp_to_rtr(self.ptr, &dest, rq_psn, min_rnr_timer, max_dest_rd_atomic))

    def to_rts(self, uint8_t timeout, uint8_t retry_cnt, uint8_t rnr_retry, uint32_t sq_psn, uint8_t max_rd_atomic):
        self.refuse_if_closed()
        self.done(v.sv_qp_to_rts(self.ptr, timeout, retry_cnt, rnr_retry, sq_psn, max_rd_atomic))

    def set_min_rnr_timer(self, uint8_t min_rnr_timer):
        self.refuse_if_closed()
        self.done(v.sv_qp_set_min_rnr_timer(self.ptr, min_rnr_timer))

    def to_err(self):
        self.refuse_if_closed()
        self.done(v.sv_qp_to_err(self.ptr))

    def reset(self):
        self.refuse_if_closed()
        self.done(v.sv_qp_reset(self.ptr))

    def post_send(self, wrs):
        """Post SendWRs in order: (POST_OK or why the next one was refused, how many were posted)."""
        cdef SendWRs batch = SendWRs(wrs)
        cdef int posted = 0
        self.refuse_if_closed()
        err = v.sv_qp_post_send(self.ptr, batch.wrs, batch.n, &posted)
        return err, posted

    def post_recv(self, wrs):
        """Post RecvWRs in order: (POST_OK or why the next one was refused, how many were posted)."""
        cdef RecvWRs batch = RecvWRs(wrs)
        cdef int posted = 0
        self.refuse_if_closed()
        err = v.sv_qp_post_recv(self.ptr, batch.wrs, batch.n, &posted)
        return err, posted

    def close(self):
        if self.closed:
            return
        if v.sv_qp_free(self.ptr):
            raise failure()
        self.closed = True
        self.unuse()

    def __dealloc__(self):
        if not self.closed and self.ptr is not NULL:
            v.sv_qp_free(self.ptr)


cdef const f.sc_dp *DATAPATH = &f.sc_dp_verbs


# a device fills its CQs with no thread of ours: its control messages wait for a poll or the watcher
cdef void hook_control(CQ cq, f.sf_ctx *ctx):
    pass


cdef void unhook_control(CQ cq):
    pass

include "fastpath.pxi"
