# The C core's API (shift_core.h), as Cython sees it.
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from "shift_core.h" nogil:
    ctypedef struct sc_ctx:
        pass
    ctypedef struct sc_pd:
        pass
    ctypedef struct sc_mr:
        pass
    ctypedef struct sc_cq:
        pass
    ctypedef struct sc_chan:
        pass
    ctypedef struct sc_qp:
        pass

    struct sc_sge:
        uint64_t addr
        uint32_t length
        uint32_t lkey

    struct sc_send_wr:
        uint64_t wr_id
        uint32_t opcode
        uint32_t send_flags
        uint32_t imm_data
        uint32_t rkey
        uint64_t remote_addr, compare_add, swap
        uint32_t num_sge
        const sc_sge *sg

    struct sc_recv_wr:
        uint64_t wr_id
        uint32_t num_sge
        const sc_sge *sg

    struct sc_wc:
        uint64_t wr_id
        uint32_t status, opcode, qp_num, byte_len, imm_data, wc_flags, src_qp

    struct sc_cap:
        uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data

    enum sc_post_error:
        SC_POST_OK

    sc_ctx *sc_ctx_new()
    void sc_ctx_free(sc_ctx *ctx)
    void sc_ctx_progress(sc_ctx *ctx)
    uint64_t sc_ctx_failures(sc_ctx *ctx)
    sc_pd *sc_pd_new(sc_ctx *ctx)
    void sc_pd_free(sc_pd *pd)
    sc_mr *sc_mr_reg(sc_pd *pd, void *addr, uint64_t length, uint32_t access)
    uint32_t sc_mr_lkey(const sc_mr *mr)
    uint32_t sc_mr_rkey(const sc_mr *mr)
    void sc_mr_dereg(sc_mr *mr)
    int sc_mr_try_free(sc_mr *mr)
    sc_chan *sc_chan_new(sc_ctx *ctx)
    int sc_chan_fd(const sc_chan *chan)
    int sc_chan_take(sc_chan *chan, uint64_t *cookie)
    int sc_chan_wait(sc_chan *chan, int timeout_ms, int drive, uint64_t *cookie)
    void sc_ctx_wake_waiters(sc_ctx *ctx)
    void sc_chan_wake(sc_chan *chan)
    void sc_chan_free(sc_chan *chan)
    sc_cq *sc_cq_new(sc_ctx *ctx, uint32_t cqe, sc_chan *chan, uint64_t cookie)
    int sc_cq_poll(sc_cq *cq, int n, sc_wc *out)
    void sc_cq_req_notify(sc_cq *cq, int solicited_only)
    void sc_cq_set_filled(sc_cq *cq, void (*fn)(void *arg), void *arg)
    void sc_cq_free(sc_cq *cq)
    int sc_ctx_listen(sc_ctx *ctx, int listen_fd)
    sc_qp *sc_qp_new(sc_pd *pd, sc_cq *send_cq, sc_cq *recv_cq, const sc_cap *cap, int sq_sig_all,
                     uint32_t qpn, uint32_t local_ip)
    int sc_qp_state(sc_qp *qp)
    void sc_qp_to_init(sc_qp *qp, uint32_t access)
    int sc_qp_connects(const sc_qp *qp, uint32_t remote_ip, uint32_t remote_qpn)
    void sc_qp_set_local_ip(sc_qp *qp, uint32_t local_ip)
    void sc_qp_to_rtr(sc_qp *qp, uint32_t remote_ip, uint32_t remote_qpn, uint32_t rq_psn,
                      uint8_t min_rnr_timer, int fd)
    void sc_qp_to_rts(sc_qp *qp, uint64_t ack_timeout_ns, uint64_t retry_period_ns, uint8_t rnr_retry,
                      uint32_t sq_psn)
    void sc_qp_to_err(sc_qp *qp)
    void sc_qp_reset(sc_qp *qp)
    sc_post_error sc_qp_post_send(sc_qp *qp, const sc_send_wr *wrs, int n, int *posted)
    sc_post_error sc_qp_post_recv(sc_qp *qp, const sc_recv_wr *wrs, int n, int *posted)
    void sc_qp_free(sc_qp *qp)
    double sc_raw_pingpong(int fd, uint32_t size, uint32_t iters, int first)
    double sc_raw_stream(int fd, uint64_t total, uint32_t chunk, int sending)


cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    enum:
        POLLIN


cdef extern from "wire.h" nogil:
    enum:
        SC_WIRE_MAGIC
        SC_WIRE_HEADER_SIZE
    enum sc_wire_op:
        SC_OP_HELLO, SC_OP_SEND, SC_OP_SEND_IMM, SC_OP_WRITE, SC_OP_WRITE_IMM, SC_OP_READ_REQ, SC_OP_CMP_SWP
        SC_OP_FETCH_ADD, SC_OP_ACK, SC_OP_NAK, SC_OP_READ_RESP, SC_OP_ATOMIC_RESP, SC_OP_REFUSE
    struct sc_hdr:
        uint8_t magic, op
        uint16_t flags
        uint32_t seq, length, rkey, imm
        uint64_t addr, arg1, arg2
        uint32_t ack
    void sc_wire_pack(const sc_hdr *hdr, uint8_t *out)
    int sc_wire_is_request(unsigned op)
