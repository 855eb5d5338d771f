# What the Cython faces of both backends share (included by _core.pyx and _verbs.pyx): the guard that
# keeps a close from freeing what a wait without the interpreter lock still uses, and libshift's work
# requests as the core's C arrays. It needs cython, `c` (cshift), malloc, free and sched_yield in scope.

DEF STACK_WRS = 4  # a post of at most this many WRs and STACK_SGES SGEs needs no malloc
DEF STACK_SGES = 16

from libshift.vocabulary.enums import ibv_wc_opcode, ibv_wc_status
from libshift.vocabulary.wr import WC

# why a post was refused (enum sc_post_error)
POST_OK, POST_STATE, POST_QUEUE_FULL, POST_OPCODE, POST_SGES, POST_INLINE, POST_ATOMIC, POST_NOMEM, POST_DEVICE = range(9)
_STATUS = {int(s): s for s in ibv_wc_status}
_OPCODE = {int(o): o for o in ibv_wc_opcode}


cdef object wc_of(const c.sc_wc *w):
    """libshift's WC of the core's (a number the enums do not know stays a number)."""
    return WC(w.wr_id, _STATUS.get(w.status, w.status), _OPCODE.get(w.opcode, w.opcode), w.qp_num,
              w.byte_len, w.imm_data, w.wc_flags, w.src_qp)


cdef class Guarded:
    """The count of calls inside this object's C side with the interpreter lock released; `busy` and
    `closed` change only under the lock, so a close that has set `closed` waits for `busy` to reach 0."""
    cdef bint closed
    cdef int busy

    cdef bint enter(self):
        """Count a call in, unless the object is closed (False: do nothing)."""
        if self.closed:
            return False
        self.busy += 1
        return True

    cdef void leave(self):
        self.busy -= 1

    cdef void quiesce(self):
        """Refuse new calls and wait for those inside to leave (they need the lock back to say so)."""
        self.closed = True
        while self.busy:
            with nogil:
                sched_yield()


cdef c.sc_sge *sge_array(list lists, c.sc_sge *stack) except NULL:
    """The SGEs of every WR's list, one after the other: in `stack` (STACK_SGES long) when they fit, else in
    one malloc'd array, which the caller frees."""
    cdef Py_ssize_t total = 0, k = 0
    for sges in lists:
        total += len(sges)
    cdef c.sc_sge *cs = stack if total <= STACK_SGES else <c.sc_sge *>malloc(total * sizeof(c.sc_sge))
    if cs is NULL:
        raise MemoryError()
    for sges in lists:
        for sge in sges:
            cs[k].addr, cs[k].length, cs[k].lkey = sge.addr, sge.length, sge.lkey
            k += 1
    return cs


@cython.freelist(8)  # a post's batch: no allocation in the steady state
cdef class SendWRs:
    """libshift SendWRs as sc_send_wr (an unknown opcode as one the core refuses), for one post."""
    cdef c.sc_send_wr *wrs
    cdef c.sc_sge *sges
    cdef int n
    cdef c.sc_sge stack_sges[STACK_SGES]
    cdef c.sc_send_wr stack_wrs[STACK_WRS]

    def __cinit__(self, wrs):
        cdef int i, k = 0
        self.n = len(wrs)
        lists = [wr.sges() for wr in wrs]
        self.sges = sge_array(lists, &self.stack_sges[0])
        self.wrs = &self.stack_wrs[0] if self.n <= STACK_WRS else <c.sc_send_wr *>malloc(self.n * sizeof(c.sc_send_wr))
        if self.wrs is NULL:
            raise MemoryError()
        for i in range(self.n):
            wr = wrs[i]
            op = int(wr.opcode)
            self.wrs[i].wr_id = wr.wr_id
            self.wrs[i].opcode = op if 0 <= op <= 6 else 0xFFFFFFFF
            self.wrs[i].send_flags = int(wr.send_flags)
            self.wrs[i].imm_data = wr.imm_data
            self.wrs[i].rkey = wr.rkey
            self.wrs[i].remote_addr = wr.remote_addr
            self.wrs[i].compare_add = wr.compare_add
            self.wrs[i].swap = wr.swap
            self.wrs[i].num_sge = len(lists[i])
            self.wrs[i].sg = &self.sges[k]
            k += self.wrs[i].num_sge

    def __dealloc__(self):
        if self.wrs is not NULL and self.wrs != &self.stack_wrs[0]:
            free(self.wrs)
        if self.sges is not NULL and self.sges != &self.stack_sges[0]:
            free(self.sges)


@cython.freelist(8)
cdef class RecvWRs:
    """libshift RecvWRs as sc_recv_wr, for one post."""
    cdef c.sc_recv_wr *wrs
    cdef c.sc_sge *sges
    cdef int n
    cdef c.sc_sge stack_sges[STACK_SGES]
    cdef c.sc_recv_wr stack_wrs[STACK_WRS]

    def __cinit__(self, wrs):
        cdef int i, k = 0
        self.n = len(wrs)
        lists = [wr.sges() for wr in wrs]
        self.sges = sge_array(lists, &self.stack_sges[0])
        self.wrs = &self.stack_wrs[0] if self.n <= STACK_WRS else <c.sc_recv_wr *>malloc(self.n * sizeof(c.sc_recv_wr))
        if self.wrs is NULL:
            raise MemoryError()
        for i in range(self.n):
            self.wrs[i].wr_id = wrs[i].wr_id
            self.wrs[i].num_sge = len(lists[i])
            self.wrs[i].sg = &self.sges[k]
            k += self.wrs[i].num_sge

    def __dealloc__(self):
        if self.wrs is not NULL and self.wrs != &self.stack_wrs[0]:
            free(self.wrs)
        if self.sges is not NULL and self.sges != &self.stack_sges[0]:
            free(self.sges)
