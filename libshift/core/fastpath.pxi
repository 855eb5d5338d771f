# The Cython face of the fast path of shift QPs (fastpath.h), included by _core.pyx and _verbs.pyx after
# their Channel, CQ and QP classes, with DATAPATH (the backend's data-path table) in scope; it needs `c`
# (cshift), `f` (cfast), monotonic, and Guarded, wc_of, SendWRs, RecvWRs and sge_array (face.pxi). Each C
# call is made holding the context's mutex (fastpath.h: the link watch's thread may fail QPs over at the
# same time), and no Python runs while it is held: a thread waiting for it holds the interpreter lock. A
# closed object does nothing.

from libc.stdint cimport int64_t, uintptr_t

from libshift.vocabulary.errors import CQOverflowError
from libshift.vocabulary.wr import SGE, WC

FAST_POSTED, FAST_NEW_RKEY, FAST_NOT_FAST, FAST_QUEUE_FULL, FAST_REFUSED = range(5)
DEFER_WC, DEFER_OVERFLOW = range(2)
PASS = -1  # FastChannel.wait: the deferred queue holds items, make a pass (FastContext.progress) first
NEWS_SWITCHED, NEWS_RESUMED = 1, 2
REASON_NIC_EVENT, REASON_PEER = 1, 2
DEF FAST_BATCH = 64
PROVIDER_OVERFLOW = "CQ overflow: a provider CQ behind a ShiftCQ overflowed"


cdef c.sc_wc wc_to_c(object wc):
    cdef c.sc_wc w
    w.wr_id, w.status, w.opcode, w.qp_num = wc.wr_id, int(wc.status), int(wc.opcode), wc.qp_num
    w.byte_len, w.imm_data, w.wc_flags, w.src_qp = wc.byte_len, wc.imm_data, wc.wc_flags, wc.src_qp
    return w


cdef class FastContext:
    """The fast path of a ShiftContext's QPs: `handler(kind, path, cookie, wc)` is called, under `lock`,
    for each deferred item (a completion for the failover layer, a QP that overflowed its CQ), in the order
    they happened."""
    cdef f.sf_ctx *ptr
    cdef object lock, handler
    cdef Channel serve  # the default path's channel, where a FastChannel's leading wait waits
    cdef list controls  # the control CQs the context reads: kept alive while it may
    cdef int children  # FastCQs and FastQPs not yet closed: the C context goes after the last of them
    cdef bint closing

    def __cinit__(self, int paths, object lock, object handler):
        self.ptr = f.sf_ctx_new(DATAPATH, paths)
        if self.ptr is NULL:
            raise MemoryError()
        self.lock, self.handler, self.controls = lock, handler, []

    def set_control(self, int path, CQ cq):
        """The control CQ of backup `path`: every completion on it is the failover layer's."""
        f.sf_ctx_lock(self.ptr)
        f.sf_ctx_set_control(self.ptr, path, <void *>cq.ptr)
        f.sf_ctx_unlock(self.ptr)
        self.controls.append(cq)
        hook_control(cq, self.ptr)

    def lkeys(self, int path):
        """The lkey map of backup `path` (default lkey -> the twin's there), as a mutable mapping."""
        return LkeyMap(self, path)

    def progress(self, bint everything=False):
        """Take the provider CQs' completions (the backup paths' on their schedule unless `everything`)."""
        cdef int overflowed, deferred
        if self.ptr is NULL or self.closing:
            return
        f.sf_ctx_lock(self.ptr)
        overflowed = f.sf_ctx_progress(self.ptr, everything) < 0
        deferred = f.sf_ctx_has_deferred(self.ptr)
        f.sf_ctx_unlock(self.ptr)
        self.after_pass(overflowed, deferred)

    cdef int after_pass(self, bint overflowed, bint deferred) except -1:
        """What a pass leaves to Python: a provider CQ's overflow to raise, the deferred items to hand over."""
        if overflowed:
            raise CQOverflowError(PROVIDER_OVERFLOW)
        if deferred:
            self.hand_over()
        return 0

    def drain(self, FastCQ cq, int path, uint32_t qpn):
        """Take the completions of one path of `cq` (None: that path's control CQ), and hand over at once
        every deferred completion of provider QP `qpn` on that path, older ones too, and the CQ events: a
        switch drains the path it leaves so that its receive count is final. Completions of other paths
        and other QPs wait for the hand-over under way (a peer's count taken in the same pass must not
        meet the switch half-done, nor another QP's error start its switch inside this one)."""
        cdef f.sf_deferred item
        cdef int overflowed
        if self.ptr is NULL:
            return
        f.sf_ctx_lock(self.ptr)
        overflowed = f.sf_ctx_drain(self.ptr, NULL if cq is None else cq.ptr, path) < 0
        f.sf_ctx_unlock(self.ptr)
        self.after_pass(overflowed, False)
        with self.lock:
            while self.next_deferred_on(path, qpn, &item):
                self.handler(item.kind, item.path, item.cookie, wc_of(&item.wc))

    def hand_over(self):
        """Hand every deferred item to the handler, oldest first."""
        cdef f.sf_deferred item
        with self.lock:
            while self.next_deferred(&item):
                self.handler(item.kind, item.path, item.cookie, wc_of(&item.wc))

    cdef bint next_deferred(self, f.sf_deferred *item):
        cdef bint got
        if self.ptr is NULL:
            return False
        f.sf_ctx_lock(self.ptr)
        got = f.sf_ctx_next_deferred(self.ptr, item)
        f.sf_ctx_unlock(self.ptr)
        return got

    cdef bint next_deferred_on(self, int path, uint32_t qpn, f.sf_deferred *item):
        cdef bint got
        if self.ptr is NULL:
            return False
        f.sf_ctx_lock(self.ptr)
        got = f.sf_ctx_next_deferred_on(self.ptr, path, qpn, item)
        f.sf_ctx_unlock(self.ptr)
        return got

    @property
    def backup_hot(self):
        """Whether a backup path carried traffic lately (a pass reads it every time meanwhile)."""
        return self.ptr is not NULL and f.sf_ctx_backup_hot(self.ptr)  # a word read: no mutex

    def heat_backups(self):
        """Read the backup paths on every pass for a while: a switch waits for the peer's count there."""
        if self.ptr is not NULL:
            f.sf_ctx_lock(self.ptr)
            f.sf_ctx_heat_backups(self.ptr)
            f.sf_ctx_unlock(self.ptr)

    def take_news(self):
        """Whether a QP has switched or resumed in the core since the last call (FastQP.news says how)."""
        cdef int news
        if self.ptr is NULL:
            return False
        f.sf_ctx_lock(self.ptr)
        news = f.sf_ctx_take_news(self.ptr)
        f.sf_ctx_unlock(self.ptr)
        return bool(news)

    def link_mark(self, int path):
        """What link_next raises, from the link watch's thread, when the link of `path` is seen down: the
        bit `path` of the context's link word, and the switch of the QPs on it (sf_ctx_links_act); valid
        until close()."""
        if self.ptr is NULL:
            return None
        return (<uintptr_t>f.sf_ctx_link_word(self.ptr), path, <uintptr_t>&f.sf_ctx_links_act,
                <uintptr_t>self.ptr)

    def link_down(self, int path):
        """The link of `path` was seen down: the next pass moves the fast-mode QPs off it."""
        if self.ptr is not NULL:
            f.sf_ctx_link_down(self.ptr, path)

    def link_is_down(self, int path):
        return self.ptr is not NULL and f.sf_ctx_link_is_down(self.ptr, path) == 1

    def link_up(self, int path):
        """The link of `path` carries traffic again (shiftd's UP)."""
        if self.ptr is not NULL:
            f.sf_ctx_link_up(self.ptr, path)

    def set_serve(self, Channel channel):
        """The default path's channel (its watcher's): the FastChannels' waits lead there."""
        self.serve = channel

    def watch_begin(self):
        """The default path's watcher is about to make a pass and wait on the serving channel: 0.0, or the
        seconds to keep off it (an application's wait leads there, or did a moment ago)."""
        cdef int64_t rest
        if self.ptr is NULL:
            return 0.0
        f.sf_ctx_lock(self.ptr)
        rest = f.sf_ctx_watch_begin(self.ptr)
        f.sf_ctx_unlock(self.ptr)
        return rest / 1e9

    def watch_end(self):
        if self.ptr is not NULL:
            f.sf_ctx_lock(self.ptr)
            f.sf_ctx_watch_end(self.ptr)
            f.sf_ctx_unlock(self.ptr)

    cdef void adopt(self):
        self.children += 1

    cdef void release(self):
        self.children -= 1
        if self.closing and not self.children:
            self.close()

    def close(self):
        """No more progress; the C context is freed once its CQs and QPs are closed too."""
        self.closing = True
        for cq in self.controls:
            unhook_control(cq)
        self.controls = []
        if self.ptr is not NULL and not self.children:
            f.sf_ctx_free(self.ptr)
            self.ptr = NULL


cdef class LkeyMap:
    """One backup path's lkeys (the default path's lkey -> the lkey of its MR's twin on the path), kept in
    the fast path, which translates the SGEs of its posts there; Python's posts read it through this."""
    cdef FastContext ctx
    cdef int path

    def __cinit__(self, FastContext ctx, int path):
        self.ctx, self.path = ctx, path

    def __setitem__(self, uint32_t lkey, uint32_t path_lkey):
        cdef int failed
        if self.ctx.ptr is NULL:
            raise MemoryError()
        f.sf_ctx_lock(self.ctx.ptr)
        failed = f.sf_ctx_set_lkey(self.ctx.ptr, self.path, lkey, path_lkey)
        f.sf_ctx_unlock(self.ctx.ptr)
        if failed:
            raise MemoryError()

    def __contains__(self, uint32_t lkey):
        cdef uint32_t found
        return self.lookup(lkey, &found)

    def get(self, uint32_t lkey, default=None):
        cdef uint32_t found
        return found if self.lookup(lkey, &found) else default

    cdef bint lookup(self, uint32_t lkey, uint32_t *found):
        cdef bint got
        if self.ctx.ptr is NULL:
            return False
        f.sf_ctx_lock(self.ctx.ptr)
        got = f.sf_ctx_lkey(self.ctx.ptr, self.path, lkey, found) == 1
        f.sf_ctx_unlock(self.ctx.ptr)
        return got

    def pop(self, uint32_t lkey, default=None):
        found = self.get(lkey, default)
        if self.ctx.ptr is not NULL:
            f.sf_ctx_lock(self.ctx.ptr)
            f.sf_ctx_drop_lkey(self.ctx.ptr, self.path, lkey)
            f.sf_ctx_unlock(self.ctx.ptr)
        return found


cdef class FastChannel(Guarded):
    """A ShiftCompChannel's events and blocking waits (fast_chan.c)."""
    cdef f.sf_chan *ptr
    cdef FastContext ctx

    def __cinit__(self, FastContext ctx):
        if ctx.ptr is NULL or ctx.closing:
            raise ValueError("a FastChannel needs an open FastContext")
        f.sf_ctx_lock(ctx.ptr)
        self.ptr = f.sf_chan_new(ctx.ptr)
        f.sf_ctx_unlock(ctx.ptr)
        if self.ptr is NULL:
            raise OSError("shift core: cannot make a completion channel")
        self.ctx = ctx
        ctx.adopt()

    def raise_event(self, uint64_t cookie):
        """An event of the CQ `cookie`, raised from Python (a wake-up of the thread waiting)."""
        if not self.closed:
            f.sf_ctx_lock(self.ctx.ptr)
            f.sf_chan_raise(self.ptr, cookie)
            f.sf_ctx_unlock(self.ctx.ptr)

    def wait(self, timeout):
        """The cookie of the next CQ of the channel that got a completion; PASS when Python must make a
        pass first; None after `timeout` s (None: no limit) or once closed. The interpreter lock is let go
        while it waits; the waiting thread may lead (fast_chan.c), on the default path's channel."""
        cdef uint64_t cookie = 0
        cdef int got = f.SF_WAIT_NONE, ms
        cdef Channel held
        cdef void *serve
        end = None if timeout is None else monotonic() + timeout
        if not self.enter():
            return None
        try:
            while not self.closed and not self.ctx.closing:
                ms = -1 if end is None else max(0, int((end - monotonic()) * 1000 + 0.999))
                held = self.ctx.serve
                if held is not None and not held.hold():
                    held = None  # closing: follow only
                serve = NULL if held is None else <void *>held.ptr
                with nogil:
                    got = f.sf_chan_wait(self.ptr, serve, ms, &cookie)
                if held is not None:
                    held.let_go()
                if got == f.SF_WAIT_EVENT:
                    return cookie
                if got == f.SF_WAIT_PASS:
                    return PASS
                if got == f.SF_WAIT_NONE:
                    return None
            return None  # woken by the close
        finally:
            self.leave()

    def close(self):
        if self.closed:
            return
        f.sf_ctx_lock(self.ctx.ptr)
        f.sf_chan_wake(self.ptr)  # a waiter returns, sees `closed` and leaves
        f.sf_ctx_unlock(self.ctx.ptr)
        self.quiesce()
        f.sf_ctx_lock(self.ctx.ptr)
        f.sf_chan_free(self.ptr)
        f.sf_ctx_unlock(self.ctx.ptr)
        self.ptr = NULL
        self.ctx.release()


cdef class FastCQ:
    """An application CQ over one provider CQ per path (`path_cqs`, this backend's CQs), its events on
    `channel` (or None)."""
    cdef f.sf_cq *ptr
    cdef FastContext ctx
    cdef list path_cqs
    cdef readonly uint32_t cqe

    def __cinit__(self, FastContext ctx, uint32_t cqe, list path_cqs, uint64_t cookie, FastChannel channel):
        cdef void *on[f.SF_PATHS]
        cdef int i
        if ctx.ptr is NULL or ctx.closing or not 0 < len(path_cqs) <= f.SF_PATHS:
            raise ValueError("a FastCQ needs an open FastContext and a CQ per path")
        if channel is not None and (channel.closed or channel.ctx is not ctx):
            raise ValueError("a FastCQ's channel must be open and of its FastContext")
        for i in range(f.SF_PATHS):
            on[i] = <void *>(<CQ>path_cqs[i]).ptr if i < len(path_cqs) else NULL
        f.sf_ctx_lock(ctx.ptr)
        self.ptr = f.sf_cq_new(ctx.ptr, cqe, on, cookie, NULL if channel is None else channel.ptr)
        f.sf_ctx_unlock(ctx.ptr)
        if self.ptr is NULL:
            raise MemoryError()
        self.ctx, self.path_cqs, self.cqe = ctx, path_cqs, cqe
        ctx.adopt()

    def push(self, wc):
        """Release `wc` to the application (an armed CQ raises its event): False once it has overflowed."""
        cdef c.sc_wc w = wc_to_c(wc)
        if self.ptr is NULL:
            return False
        f.sf_ctx_lock(self.ctx.ptr)
        ok = f.sf_cq_push(self.ptr, &w) == 0
        f.sf_ctx_unlock(self.ctx.ptr)
        return ok

    def arm(self):
        if self.ptr is not NULL:
            f.sf_ctx_lock(self.ctx.ptr)
            f.sf_cq_arm(self.ptr)
            f.sf_ctx_unlock(self.ctx.ptr)

    @property
    def ready(self):
        """Completions released to the application and not yet polled."""
        cdef uint32_t ready
        if self.ptr is NULL:
            return 0
        f.sf_ctx_lock(self.ctx.ptr)
        ready = f.sf_cq_ready(self.ptr)
        f.sf_ctx_unlock(self.ctx.ptr)
        return ready

    def poll(self, int num_entries):
        """(count, WCs) as ShiftCQ.poll returns them: what is ready, after a pass of the context's progress
        when nothing is (as a provider CQ found empty drives its engine first). One lock for both."""
        cdef c.sc_wc wcs[FAST_BATCH]
        cdef int got, i, want
        cdef bint overflowed = False, deferred = False
        cdef FastContext ctx = self.ctx
        if self.ptr is NULL:
            return 0, []
        f.sf_ctx_lock(ctx.ptr)
        if not f.sf_cq_ready(self.ptr) and not ctx.closing:
            overflowed = f.sf_ctx_progress(ctx.ptr, 0) < 0
            deferred = f.sf_ctx_has_deferred(ctx.ptr)
        if overflowed or deferred:
            f.sf_ctx_unlock(ctx.ptr)
            ctx.after_pass(overflowed, deferred)  # the failover layer's first: it may release completions here
            f.sf_ctx_lock(ctx.ptr)
        out = []
        while True:  # poll(0) asks too: it meets an overflow
            want = max(0, min(num_entries, FAST_BATCH))
            got = f.sf_cq_take(self.ptr, want, wcs)
            f.sf_ctx_unlock(ctx.ptr)  # the WCs are made without it (no Python under the mutex)
            if got < 0:
                raise CQOverflowError(f"CQ overflow: more than {self.cqe} completions were not polled")
            for i in range(got):
                out.append(wc_of(&wcs[i]))
            num_entries -= got
            if got < want or num_entries <= 0:
                return len(out), out
            f.sf_ctx_lock(ctx.ptr)

    def close(self):
        if self.ptr is not NULL:
            f.sf_ctx_lock(self.ctx.ptr)
            f.sf_cq_free(self.ptr)
            f.sf_ctx_unlock(self.ctx.ptr)
            self.ptr = NULL
            self.ctx.release()
        self.path_cqs = []


cdef class FastQP:
    """A shift QP's fast mode and its posts on any path (this backend's QPs, added per path)."""
    cdef f.sf_qp *ptr
    cdef FastContext ctx
    cdef list path_qps
    cdef public int refusal  # why the last post was refused (POST_*)

    def __cinit__(self, FastContext ctx, FastCQ send_cq, FastCQ recv_cq, tuple caps, bint sig_all):
        cdef uint32_t max_send_wr, max_recv_wr, max_sge, max_inline
        max_send_wr, max_recv_wr, max_sge, max_inline = caps
        if ctx.ptr is NULL or ctx.closing:
            raise ValueError("a FastQP needs an open FastContext")
        self.ptr = f.sf_qp_new(ctx.ptr, send_cq.ptr, recv_cq.ptr, max_send_wr, max_recv_wr, max_sge, max_inline,
                               sig_all)
        if self.ptr is NULL:
            raise MemoryError()
        self.ctx, self.path_qps = ctx, []
        ctx.adopt()

    def add_path(self, int path, QP qp, uint32_t qpn):
        f.sf_ctx_lock(self.ctx.ptr)
        failed = f.sf_qp_add_path(self.ptr, path, <void *>qp.ptr, qpn)
        f.sf_ctx_unlock(self.ctx.ptr)
        if failed:
            raise MemoryError()
        self.path_qps.append(qp)

    def set_rkey(self, int path, uint32_t rkey, uint32_t path_rkey):
        """The peer's default rkey `rkey` is `path_rkey` on backup `path`; False once closed."""
        cdef int failed
        if self.ptr is NULL:
            return False
        f.sf_ctx_lock(self.ctx.ptr)
        failed = f.sf_qp_set_rkey(self.ptr, path, rkey, path_rkey)
        f.sf_ctx_unlock(self.ctx.ptr)
        if failed:
            raise MemoryError()
        return True

    def set_armed(self, int path, bint armed):
        """Whether `path` is armed: where a switch made in the core may go."""
        if self.ptr is not NULL:
            f.sf_ctx_lock(self.ctx.ptr)
            f.sf_qp_set_armed(self.ptr, path, armed)
            f.sf_ctx_unlock(self.ctx.ptr)

    def set_target(self, int path, uint64_t addr, uint32_t rkey):
        """The peer's control MR on `path`, where a switch made in the core sends our count."""
        if self.ptr is not NULL:
            f.sf_ctx_lock(self.ctx.ptr)
            f.sf_qp_set_target(self.ptr, path, addr, rkey)
            f.sf_ctx_unlock(self.ctx.ptr)

    def news(self):
        """The switches made in the core since the last call, oldest first: (kind, left, to, reason, moved,
        at_ns, stopped_ns, then_ns) each (fastpath.h's sf_news)."""
        cdef f.sf_news got[f.SF_NEWS_MAX]
        cdef int n, i
        if self.ptr is NULL:
            return []
        f.sf_ctx_lock(self.ctx.ptr)
        n = f.sf_qp_news(self.ptr, got, f.SF_NEWS_MAX)
        f.sf_ctx_unlock(self.ctx.ptr)
        return [(got[i].kind, got[i].left, got[i].to, got[i].reason, got[i].moved, got[i].at_ns,
                 got[i].stopped_ns, got[i].then_ns) for i in range(n)]

    @property
    def fast(self):
        return self.ptr is not NULL and f.sf_qp_mode(self.ptr) == f.SF_MODE_FAST  # a word read: no mutex

    def moved_off(self, int path):
        """Whether the fast path holds the QP on another path than `path` (a switch made in the core)."""
        cdef bint moved
        if self.ptr is NULL:
            return False
        f.sf_ctx_lock(self.ctx.ptr)
        moved = f.sf_qp_mode(self.ptr) == f.SF_MODE_FAST and f.sf_qp_path(self.ptr) != path
        f.sf_ctx_unlock(self.ctx.ptr)
        return moved

    @property
    def inline_kept(self):
        """Sends in the fast path's ledger that keep a copy of their inline bytes."""
        cdef uint32_t kept
        if self.ptr is NULL:
            return 0
        f.sf_ctx_lock(self.ctx.ptr)
        kept = f.sf_qp_inline_kept(self.ptr)
        f.sf_ctx_unlock(self.ctx.ptr)
        return kept

    def post_send(self, wr):
        """FAST_POSTED, FAST_NEW_RKEY, FAST_NOT_FAST (post it in Python), FAST_QUEUE_FULL or FAST_REFUSED."""
        cdef SendWRs batch = SendWRs((wr,))
        cdef c.sc_post_error err = c.SC_POST_OK
        if self.ptr is NULL:
            return FAST_NOT_FAST
        f.sf_ctx_lock(self.ctx.ptr)
        got = f.sf_qp_post_send(self.ptr, batch.wrs, &err)
        f.sf_ctx_unlock(self.ctx.ptr)
        self.refusal = err
        return got

    def post_recv(self, wr):
        cdef RecvWRs batch = RecvWRs((wr,))
        cdef c.sc_post_error err = c.SC_POST_OK
        if self.ptr is NULL:
            return FAST_NOT_FAST
        f.sf_ctx_lock(self.ctx.ptr)
        got = f.sf_qp_post_recv(self.ptr, batch.wrs, &err)
        f.sf_ctx_unlock(self.ctx.ptr)
        self.refusal = err
        return got

    def post_raw_send(self, int path, wrs):
        """Post SendWRs as they are on `path`: (POST_OK or why the next was refused, how many went)."""
        cdef SendWRs batch = SendWRs(wrs)
        cdef int posted = 0
        if self.ptr is NULL:
            return POST_STATE, 0
        f.sf_ctx_lock(self.ctx.ptr)
        err = f.sf_qp_post_raw_send(self.ptr, path, batch.wrs, batch.n, &posted)
        f.sf_ctx_unlock(self.ctx.ptr)
        return err, posted

    def post_raw_recv(self, int path, wrs):
        cdef RecvWRs batch = RecvWRs(wrs)
        cdef int posted = 0
        if self.ptr is NULL:
            return POST_STATE, 0
        f.sf_ctx_lock(self.ctx.ptr)
        err = f.sf_qp_post_raw_recv(self.ptr, path, batch.wrs, batch.n, &posted)
        f.sf_ctx_unlock(self.ctx.ptr)
        return err, posted

    def export(self):
        """The ledger, which is Python's from now on: (next_id, sent_two_sided, received, sends, receives),
        each entry a tuple (see entry_fields); False, nothing taken, while the QP has news to read first
        (news()); None once closed."""
        cdef f.sf_ledger_view view
        cdef uint32_t i
        if self.ptr is NULL:
            return None
        f.sf_ctx_lock(self.ctx.ptr)
        unread = f.sf_qp_export(self.ptr, &view)  # the QP is Python's now: no switch touches the view
        f.sf_ctx_unlock(self.ctx.ptr)
        if unread:
            return False
        sends = [entry_fields(&view.sq[i]) for i in range(view.sq_count)]
        receives = [entry_fields(&view.rq[i]) for i in range(view.rq_count)]
        return view.next_id, view.sent_two_sided, view.received, sends, receives

    def import_ledger(self, int path, uint64_t next_id, int64_t sent_two_sided, int64_t received, entries):
        """Take the ledger back, on `path` (entries as entry_fields gives them, sends then receives, each in
        order): True, or False when one does not fit here (the ledger stays Python's)."""
        if self.ptr is NULL:
            return False
        for fields in entries:
            if not import_entry(self.ctx.ptr, self.ptr, fields):
                f.sf_ctx_lock(self.ctx.ptr)
                f.sf_qp_import_abort(self.ptr)
                f.sf_ctx_unlock(self.ctx.ptr)
                return False
        f.sf_ctx_lock(self.ctx.ptr)
        f.sf_qp_import_done(self.ptr, path, next_id, sent_two_sided, received)
        f.sf_ctx_unlock(self.ctx.ptr)
        return True

    def close(self):
        if self.ptr is not NULL:
            f.sf_ctx_lock(self.ctx.ptr)
            f.sf_qp_free(self.ptr)
            f.sf_ctx_unlock(self.ctx.ptr)
            self.ptr = NULL
            self.ctx.release()
        self.path_qps = []


cdef tuple entry_fields(const f.sf_entry *e):
    """(is_send, id, wr_id, opcode, send_flags, imm_data, rkey, remote_addr, compare_add, swap, sges,
    signaled, index, posted, wc, failed_with, inline bytes); wc None until done, index -1 for none."""
    cdef uint32_t i
    sges = [SGE(e.wr.sg[i].addr, e.wr.sg[i].length, e.wr.sg[i].lkey) for i in range(e.wr.num_sge)]
    wc = wc_of(&e.wc) if e.done else None
    kept = e.inline_copy[:e.inline_len] if e.inline_len else None
    return (bool(e.is_send), e.id, e.wr.wr_id, e.wr.opcode, e.wr.send_flags, e.wr.imm_data, e.wr.rkey,
            e.wr.remote_addr, e.wr.compare_add, e.wr.swap, sges, bool(e.signaled), e.index, bool(e.posted), wc,
            e.failed_with, kept)


cdef bint import_entry(f.sf_ctx *ctx, f.sf_qp *qp, tuple fields) except -1:
    cdef f.sf_entry e
    cdef c.sc_sge stack[STACK_SGES]
    cdef c.sc_sge *sges
    cdef bytes kept
    (is_send, e.id, e.wr.wr_id, e.wr.opcode, e.wr.send_flags, e.wr.imm_data, e.wr.rkey, e.wr.remote_addr,
     e.wr.compare_add, e.wr.swap, sg, signaled, e.index, posted, wc, e.failed_with, kept) = fields
    e.is_send, e.signaled, e.posted, e.done = is_send, signaled, posted, wc is not None
    if wc is not None:
        e.wc = wc_to_c(wc)
    e.inline_len = 0 if kept is None else len(kept)
    e.inline_copy = NULL if kept is None else <unsigned char *>kept
    sges = sge_array([sg], stack)
    e.wr.num_sge = len(sg)
    e.wr.sg = sges
    try:
        f.sf_ctx_lock(ctx)
        imported = f.sf_qp_import(qp, &e) == 0
        f.sf_ctx_unlock(ctx)
        return imported
    finally:
        if sges != &stack[0]:
            free(sges)
