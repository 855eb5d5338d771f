# The core's verbs backend (verbs_core.h), as Cython sees it; the shared structs are cshift's.
from libc.stdint cimport uint8_t, uint32_t, uint64_t

from libshift.core.cshift cimport sc_cap, sc_post_error, sc_recv_wr, sc_send_wr, sc_wc


cdef extern from "verbs_core.h" nogil:
    ctypedef struct sv_ctx:
        pass
    ctypedef struct sv_pd:
        pass
    ctypedef struct sv_mr:
        pass
    ctypedef struct sv_cq:
        pass
    ctypedef struct sv_chan:
        pass
    ctypedef struct sv_qp:
        pass

    struct sv_port:
        uint32_t state, active_mtu, lid, link_layer, gid_tbl_len

    struct sv_dest:
        uint8_t gid[16]
        uint32_t qpn, lid, sgid_index, mtu

    struct sv_event:
        uint32_t type, qp_num, port
        uint64_t cq_cookie

    int sv_available()
    const char *sv_error()
    sv_ctx *sv_ctx_open(const char *name, uint8_t port)
    void sv_ctx_free(sv_ctx *ctx)
    int sv_ctx_port(sv_ctx *ctx, sv_port *out)
    int sv_ctx_gid(sv_ctx *ctx, int index, uint8_t *out)
    int sv_ctx_event_fd(const sv_ctx *ctx)
    int sv_ctx_event(sv_ctx *ctx, sv_event *out)
    sv_pd *sv_pd_new(sv_ctx *ctx)
    void sv_pd_free(sv_pd *pd)
    sv_mr *sv_mr_reg(sv_pd *pd, void *addr, uint64_t length, uint32_t access)
    uint32_t sv_mr_lkey(const sv_mr *mr)
    uint32_t sv_mr_rkey(const sv_mr *mr)
    int sv_mr_dereg(sv_mr *mr)
    sv_chan *sv_chan_new(sv_ctx *ctx)
    int sv_chan_fd(const sv_chan *chan)
    int sv_chan_take(sv_chan *chan, uint64_t *cookie)
    int sv_chan_wait(sv_chan *chan, int timeout_ms, int drive, uint64_t *cookie)
    void sv_chan_wake(sv_chan *chan)
    int sv_chan_free(sv_chan *chan)
    sv_cq *sv_cq_new(sv_ctx *ctx, uint32_t cqe, sv_chan *chan, uint64_t cookie)
    uint32_t sv_cq_cqe(const sv_cq *cq)
    int sv_cq_poll(sv_cq *cq, int n, sc_wc *out)
    int sv_cq_req_notify(sv_cq *cq, int solicited_only)
    int sv_cq_free(sv_cq *cq)
    sv_qp *sv_qp_new(sv_pd *pd, sv_cq *send_cq, sv_cq *recv_cq, const sc_cap *cap, int sq_sig_all)
    uint32_t sv_qp_num(const sv_qp *qp)
    void sv_qp_cap(const sv_qp *qp, sc_cap *out)
    int sv_qp_state(sv_qp *qp)
    int sv_qp_last_state(const sv_qp *qp)
    int sv_qp_set_min_rnr_timer(sv_qp *qp, uint8_t min_rnr_timer)
    int sv_qp_to_init(sv_qp *qp, uint32_t access)
    int sv_qp_to_rtr(sv_qp *qp, const sv_dest *dest, uint32_t rq_psn, uint8_t min_rnr_timer,
                     uint8_t max_dest_rd_atomic)
    int sv_qp_to_rts(sv_qp *qp, uint8_t timeout, uint8_t retry_cnt, uint8_t rnr_retry, uint32_t sq_psn,
                     uint8_t max_rd_atomic)
    int sv_qp_to_err(sv_qp *qp)
    int sv_qp_reset(sv_qp *qp)
    sc_post_error sv_qp_post_send(sv_qp *qp, const sc_send_wr *wrs, int n, int *posted)
    sc_post_error sv_qp_post_recv(sv_qp *qp, const sc_recv_wr *wrs, int n, int *posted)
    int sv_qp_free(sv_qp *qp)
