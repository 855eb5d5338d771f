# The fast path of shift QPs (fastpath.h) and the backends' data-path tables (datapath.h), as Cython sees them.
from libc.stdint cimport int64_t, uint32_t, uint64_t

from libshift.core.cshift cimport sc_post_error, sc_recv_wr, sc_send_wr, sc_wc


cdef extern from "datapath.h" nogil:
    struct sc_dp:
        const char *name
    const sc_dp sc_dp_tcp
    const sc_dp sc_dp_verbs


cdef extern from "fastpath.h" nogil:
    ctypedef struct sf_ctx:
        pass
    ctypedef struct sf_cq:
        pass
    ctypedef struct sf_qp:
        pass
    ctypedef struct sf_chan:
        pass

    enum:
        SF_PATHS
        SF_MODE_PYTHON, SF_MODE_FAST
        SF_DEFER_WC, SF_DEFER_OVERFLOW
        SF_WAIT_NONE, SF_WAIT_EVENT, SF_WAIT_WOKEN, SF_WAIT_PASS
        SF_NEWS_MAX

    enum sf_post:
        SF_POSTED, SF_POSTED_NEW_RKEY, SF_NOT_FAST, SF_QUEUE_FULL, SF_REFUSED

    struct sf_deferred:
        uint32_t kind, path
        uint64_t cookie
        sc_wc wc

    struct sf_news:
        uint32_t kind, left, to, reason, moved
        int64_t at_ns, stopped_ns, then_ns

    struct sf_entry:
        uint64_t id
        sc_send_wr wr
        int is_send, signaled, posted, done
        int64_t index
        uint32_t failed_with, inline_len
        unsigned char *inline_copy
        sc_wc wc

    struct sf_ledger_view:
        const sf_entry *sq
        const sf_entry *rq
        uint32_t sq_count, rq_count
        uint64_t next_id
        int64_t sent_two_sided, received

    sf_ctx *sf_ctx_new(const sc_dp *dp, int paths)
    void sf_ctx_free(sf_ctx *ctx)
    void sf_ctx_set_control(sf_ctx *ctx, int path, void *cq)
    int sf_ctx_set_lkey(sf_ctx *ctx, int path, uint32_t lkey, uint32_t path_lkey)
    void sf_ctx_drop_lkey(sf_ctx *ctx, int path, uint32_t lkey)
    int sf_ctx_lkey(const sf_ctx *ctx, int path, uint32_t lkey, uint32_t *path_lkey)
    int sf_ctx_progress(sf_ctx *ctx, int everything)
    int sf_ctx_drain(sf_ctx *ctx, sf_cq *cq, int path)
    int sf_ctx_next_deferred(sf_ctx *ctx, sf_deferred *out)
    int sf_ctx_has_deferred(const sf_ctx *ctx)
    int sf_ctx_next_deferred_on(sf_ctx *ctx, int path, uint32_t qpn, sf_deferred *out)
    int sf_ctx_backup_hot(const sf_ctx *ctx)
    void sf_ctx_heat_backups(sf_ctx *ctx)
    int sf_ctx_take_news(sf_ctx *ctx)
    void sf_ctx_lock(sf_ctx *ctx)
    void sf_ctx_unlock(sf_ctx *ctx)
    void sf_ctx_links_act(void *ctx)
    void sf_ctx_controls_act(void *ctx)
    uint32_t *sf_ctx_link_word(sf_ctx *ctx)
    void sf_ctx_link_down(sf_ctx *ctx, int path)
    int sf_ctx_link_is_down(const sf_ctx *ctx, int path)
    void sf_ctx_link_up(sf_ctx *ctx, int path)

    sf_cq *sf_cq_new(sf_ctx *ctx, uint32_t cqe, void *const *path_cqs, uint64_t cookie, sf_chan *chan)
    void sf_cq_free(sf_cq *cq)
    int sf_cq_push(sf_cq *cq, const sc_wc *wc)
    int sf_cq_take(sf_cq *cq, int n, sc_wc *out)
    uint32_t sf_cq_ready(const sf_cq *cq)
    void sf_cq_arm(sf_cq *cq)

    sf_chan *sf_chan_new(sf_ctx *ctx)
    void sf_chan_free(sf_chan *chan)
    void sf_chan_raise(sf_chan *chan, uint64_t cookie)
    void sf_chan_wake(sf_chan *chan)
    int sf_chan_wait(sf_chan *chan, void *serve, int timeout_ms, uint64_t *cookie)
    int64_t sf_ctx_watch_begin(sf_ctx *ctx)
    void sf_ctx_watch_end(sf_ctx *ctx)

    sf_qp *sf_qp_new(sf_ctx *ctx, sf_cq *send_cq, sf_cq *recv_cq, uint32_t max_send_wr, uint32_t max_recv_wr,
                     uint32_t max_sge, uint32_t max_inline, int sig_all)
    int sf_qp_add_path(sf_qp *qp, int path, void *provider_qp, uint32_t qpn)
    int sf_qp_set_rkey(sf_qp *qp, int path, uint32_t rkey, uint32_t path_rkey)
    void sf_qp_set_armed(sf_qp *qp, int path, int armed)
    void sf_qp_set_target(sf_qp *qp, int path, uint64_t addr, uint32_t rkey)
    int sf_qp_news(sf_qp *qp, sf_news *out, int max)
    void sf_qp_free(sf_qp *qp)
    int sf_qp_mode(const sf_qp *qp)
    int sf_qp_path(const sf_qp *qp)
    uint32_t sf_qp_inline_kept(sf_qp *qp)
    sf_post sf_qp_post_send(sf_qp *qp, const sc_send_wr *wr, sc_post_error *err)
    sf_post sf_qp_post_recv(sf_qp *qp, const sc_recv_wr *wr, sc_post_error *err)
    sc_post_error sf_qp_post_raw_send(sf_qp *qp, int path, const sc_send_wr *wrs, int n, int *posted)
    sc_post_error sf_qp_post_raw_recv(sf_qp *qp, int path, const sc_recv_wr *wrs, int n, int *posted)
    int sf_qp_export(sf_qp *qp, sf_ledger_view *out)
    int sf_qp_import(sf_qp *qp, const sf_entry *entry)
    void sf_qp_import_done(sf_qp *qp, int path, uint64_t next_id, int64_t sent_two_sided, int64_t received)
    void sf_qp_import_abort(sf_qp *qp)
