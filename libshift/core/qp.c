/* An RC queue pair: its states, connection set-up, the connection's frames handed to its two halves
 * (requester.c, responder.c), its timers, and errors.
 *
 * Set-up (docs/wire.md): at RTR the side with the smaller (address, QPN) connects to the port its peer's
 * QPN names (listener.c) and opens with a HELLO naming both QPNs; the other side's listener hands the
 * connection to the QP it names, which answers with its own HELLO, and only then do requests flow.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "internal.h"

static void free_memory(struct sc_qp *qp) {
    free(qp->sq);
    free(qp->rq);
    free(qp);
}

sc_qp *sc_qp_new(sc_pd *pd, sc_cq *send_cq, sc_cq *recv_cq, const struct sc_cap *cap, int sq_sig_all,
                 uint32_t qpn, uint32_t local_ip) {
    struct sc_ctx *ctx = pd->ctx;
    sc_qp *qp = calloc(1, sizeof *qp);
    if (!qp) return NULL;
    qp->sq = calloc(cap->max_send_wr ? cap->max_send_wr : 1, sizeof *qp->sq);
    qp->rq = calloc(cap->max_recv_wr ? cap->max_recv_wr : 1, sizeof *qp->rq);
    if (!qp->sq || !qp->rq) {
        free_memory(qp);
        return NULL;
    }
    qp->ctx = ctx;
    qp->pd_id = pd->id;
    qp->cap = *cap;
    qp->sq_sig_all = sq_sig_all;
    qp->state = SC_QPS_RESET;
    qp->connect_fd = -1;
    qp->qpn = qpn;
    qp->local_ip = local_ip;
    qp->rnr_retry = 7;
    qp->min_rnr_timer = 12;
    pthread_mutex_lock(&ctx->lock);
    if (!sc_timers_reserve(ctx, ctx->nqps + 1)) {
        pthread_mutex_unlock(&ctx->lock);
        free_memory(qp);
        return NULL;
    }
    ctx->nqps++;
    qp->send_cq = send_cq;
    qp->recv_cq = recv_cq;
    send_cq->refs++;
    recv_cq->refs++;
    qp->next = ctx->qps;
    if (ctx->qps) ctx->qps->prev = qp;
    ctx->qps = qp;
    pthread_mutex_unlock(&ctx->lock);
    return qp;
}

int sc_qp_state(sc_qp *qp) {
    pthread_mutex_lock(&qp->ctx->lock);
    int state = qp->state;
    pthread_mutex_unlock(&qp->ctx->lock);
    return state;
}

/* -- connection set-up ------------------------------------------------------------------------------- */

/* The connection in use and a connect under way; a pending HELLO stays for the next RTR (its peer may
 * have re-armed first). */
static void drop_connection(struct sc_qp *qp) {
    if (qp->conn) sc_conn_close(qp->conn);
    qp->conn = NULL;
    if (qp->connect_fd >= 0) {
        sc_watch_del(qp->ctx, qp->connect_fd, qp->connect_watch);
        close(qp->connect_fd);
    }
    qp->connect_fd = -1;
    qp->connect_watch = 0;
    qp->welcomed = qp->refused = qp->taken = 0;
}

static void send_hello(struct sc_qp *qp) {
    struct sc_hdr hello = {.op = SC_OP_HELLO, .seq = qp->qpn, .imm = qp->remote_qpn};
    struct sc_frame *frame = sc_frame_new(qp->ctx, &hello);
    if (frame) sc_conn_send(qp->conn, frame);
}

static void refused(struct sc_qp *qp) {
    /* the peer has no such QP: RoCE says RETRY_EXC_ERR once the retries are spent, this says it at once */
    if (qp->conn) sc_conn_close(qp->conn);
    qp->conn = NULL;
    qp->refused = 1;
    if (qp->sq_count && qp->state == SC_QPS_RTS) sc_req_fail_head(qp, WC_RETRY_EXC_ERR);
}

int sc_qp_connects(const sc_qp *qp, uint32_t remote_ip, uint32_t remote_qpn) {
    /* one side connects, the other accepts: the smaller (address, QPN) connects */
    return qp->local_ip < remote_ip || (qp->local_ip == remote_ip && qp->qpn < remote_qpn);
}

void sc_qp_set_local_ip(sc_qp *qp, uint32_t local_ip) {
    pthread_mutex_lock(&qp->ctx->lock);
    qp->local_ip = local_ip;
    pthread_mutex_unlock(&qp->ctx->lock);
}

static int connects(const struct sc_qp *qp) { return sc_qp_connects(qp, qp->remote_ip, qp->remote_qpn); }

static void connected(struct sc_qp *qp, int fd) {
    qp->conn = sc_conn_new(qp->ctx, qp, fd);
    if (!qp->conn) {
        close(fd);
        return;
    }
    send_hello(qp);
}

void sc_qp_connect_ready(struct sc_qp *qp) {
    int fd = qp->connect_fd, err = 0;
    socklen_t len = sizeof err;
    sc_watch_del(qp->ctx, fd, qp->connect_watch);
    qp->connect_fd = -1;
    qp->connect_watch = 0;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
        close(fd);
        if (err == ECONNREFUSED) refused(qp); /* nothing listens on that port: no such QP */
        /* else the peer is unreachable: requests will time out, as on an RNIC */
        return;
    }
    connected(qp, fd);
}

static void connect_to_peer(struct sc_qp *qp, int fd) {
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(qp->remote_qpn >> 8)),
                             .sin_addr.s_addr = htonl(qp->remote_ip)};
    if (connect(fd, (struct sockaddr *)&to, sizeof to) == 0) {
        connected(qp, fd);
        return;
    }
    int err = errno;
    if (err == EINPROGRESS) {
        qp->connect_fd = fd;
        qp->connect_watch = sc_watch_add(qp->ctx, fd, WATCH_CONNECTING, qp, 1);
        if (qp->connect_watch) return;
        qp->connect_fd = -1;
    }
    close(fd);
    if (err == ECONNREFUSED) refused(qp);
}

/* Takes conn, whose HELLO named this QP, if it comes from the peer RTR named; refuses it if not. */
static void take(struct sc_qp *qp, struct sc_conn *conn) {
    if (conn->peer_ip != qp->remote_ip || conn->peer_qpn != qp->remote_qpn) {
        sc_listen_refuse(conn, qp->qpn);
        return;
    }
    qp->conn = conn;
    qp->taken = 1;
    qp->welcomed = 1;
    send_hello(qp);
    sc_qp_pump(qp);
}

void sc_qp_on_hello(struct sc_qp *qp, struct sc_conn *conn) {
    conn->qp = qp;
    int ready = (qp->state == SC_QPS_RTR || qp->state == SC_QPS_RTS) && !connects(qp) && !qp->taken;
    if (ready) {
        take(qp, conn);
        return;
    }
    /* not ready for it (not yet at RTR, or still on its last connection, or in ERR: the peer got there
     * first, as when it re-arms before this side): kept until the next RTR; the peer sends nothing before
     * our HELLO. The newest is kept. */
    if (qp->pending) sc_conn_close(qp->pending);
    qp->pending = conn;
}

static void on_welcome(struct sc_qp *qp, struct sc_conn *conn, const struct sc_hdr *hdr) {
    /* the connecting side's first frame back: HELLO (taken) or REFUSE, naming both QPNs */
    int ours = hdr->seq == qp->remote_qpn && hdr->imm == qp->qpn;
    if (ours && hdr->op == SC_OP_REFUSE) {
        refused(qp);
        return;
    }
    if (!ours || hdr->op != SC_OP_HELLO) {
        sc_conn_close(conn); /* not our peer: requests will time out */
        qp->conn = NULL;
        return;
    }
    qp->welcomed = 1;
    sc_qp_pump(qp);
}

/* -- states ------------------------------------------------------------------------------------------ */

void sc_qp_to_init(sc_qp *qp, uint32_t access) {
    pthread_mutex_lock(&qp->ctx->lock);
    qp->access = access;
    qp->state = SC_QPS_INIT;
    pthread_mutex_unlock(&qp->ctx->lock);
}

void sc_qp_to_rtr(sc_qp *qp, uint32_t remote_ip, uint32_t remote_qpn, uint32_t rq_psn, uint8_t min_rnr_timer,
                  int fd) {
    struct sc_ctx *ctx = qp->ctx;
    pthread_mutex_lock(&ctx->lock);
    qp->remote_ip = remote_ip;
    qp->remote_qpn = remote_qpn;
    qp->has_remote = 1;
    qp->min_rnr_timer = min_rnr_timer;
    qp->expected = rq_psn;
    qp->state = SC_QPS_RTR;
    struct sc_conn *pending = qp->pending;
    qp->pending = NULL;
    if (connects(qp)) {
        if (pending) sc_listen_refuse(pending, qp->qpn); /* this side connects: the peer should not have */
        if (fd >= 0) connect_to_peer(qp, fd);
    } else {
        if (fd >= 0) close(fd);
        if (pending) take(qp, pending);
    }
    pthread_mutex_unlock(&ctx->lock);
}

void sc_qp_to_rts(sc_qp *qp, uint64_t ack_timeout_ns, uint64_t retry_period_ns, uint8_t rnr_retry,
                  uint32_t sq_psn) {
    pthread_mutex_lock(&qp->ctx->lock);
    qp->ack_timeout_ns = ack_timeout_ns;
    qp->retry_period_ns = retry_period_ns;
    qp->rnr_retry = rnr_retry;
    if (qp->state == SC_QPS_RTR) qp->next_seq = qp->tx_seq = sq_psn;
    qp->state = SC_QPS_RTS;
    sc_qp_pump(qp);
    pthread_mutex_unlock(&qp->ctx->lock);
}

void sc_qp_enter_error(struct sc_qp *qp) {
    /* every outstanding WR on both queues completes WR_FLUSH_ERR; the connection closes once what is
     * queued on it (a NAK) has been sent */
    if (qp->state == SC_QPS_ERR) return;
    qp->state = SC_QPS_ERR;
    sc_req_flush(qp, 1);
    sc_resp_flush(qp, 1);
    qp->has_ack = 0;
    sc_timer_set(qp, T_ACK, 0);
    if (qp->conn) sc_conn_close_when_sent(qp->conn);
}

void sc_qp_to_err(sc_qp *qp) {
    pthread_mutex_lock(&qp->ctx->lock);
    sc_qp_enter_error(qp);
    pthread_mutex_unlock(&qp->ctx->lock);
}

static void reset(struct sc_qp *qp) {
    drop_connection(qp);
    sc_req_flush(qp, 0);
    sc_resp_flush(qp, 0);
    qp->has_ack = 0;
    for (int i = 0; i < SC_NTIMERS; i++) sc_timer_set(qp, i, 0);
    qp->has_remote = 0;
    qp->state = SC_QPS_RESET;
}

void sc_qp_reset(sc_qp *qp) {
    pthread_mutex_lock(&qp->ctx->lock);
    reset(qp);
    pthread_mutex_unlock(&qp->ctx->lock);
}

static void unlink_qp(struct sc_qp *qp) {
    struct sc_ctx *ctx = qp->ctx;
    if (qp->prev) qp->prev->next = qp->next;
    else ctx->qps = qp->next;
    if (qp->next) qp->next->prev = qp->prev;
    ctx->nqps--;
}

static void destroy(struct sc_qp *qp) {
    reset(qp);
    if (qp->pending) sc_conn_close(qp->pending);
    sc_cq_put(qp->send_cq);
    sc_cq_put(qp->recv_cq);
    free_memory(qp);
}

void sc_qp_free(sc_qp *qp) {
    struct sc_ctx *ctx = qp->ctx;
    pthread_mutex_lock(&ctx->lock);
    unlink_qp(qp);
    destroy(qp);
    pthread_mutex_unlock(&ctx->lock);
}

void sc_qp_free_all(struct sc_ctx *ctx) {
    while (ctx->qps) {
        struct sc_qp *qp = ctx->qps;
        unlink_qp(qp);
        destroy(qp);
    }
}

/* -- posting ----------------------------------------------------------------------------------------- */

enum sc_post_error sc_qp_post_send(sc_qp *qp, const struct sc_send_wr *wrs, int n, int *posted) {
    struct sc_ctx *ctx = qp->ctx;
    enum sc_post_error err = SC_POST_OK;
    *posted = 0;
    pthread_mutex_lock(&ctx->lock);
    int state = qp->state;
    if (state != SC_QPS_RTS && state != SC_QPS_ERR) {
        pthread_mutex_unlock(&ctx->lock);
        return SC_POST_STATE;
    }
    for (int i = 0; i < n && err == SC_POST_OK; i++) {
        err = sc_req_post(qp, &wrs[i]);
        if (err == SC_POST_OK) (*posted)++;
    }
    if (state == SC_QPS_ERR) sc_req_flush(qp, 1); /* posted to an ERR QP: it completes as a flush */
    else if (qp->refused && qp->sq_count) sc_req_fail_head(qp, WC_RETRY_EXC_ERR);
    else {
        if (qp->conn) sc_conn_pump(qp->conn);
        if (!qp->deadline) sc_req_arm(qp);
        if (!qp->has_ack) sc_timer_set(qp, T_ACK, 0); /* a request carried the ack */
    }
    pthread_mutex_unlock(&ctx->lock);
    return err;
}

enum sc_post_error sc_qp_post_recv(sc_qp *qp, const struct sc_recv_wr *wrs, int n, int *posted) {
    struct sc_ctx *ctx = qp->ctx;
    enum sc_post_error err = SC_POST_OK;
    *posted = 0;
    pthread_mutex_lock(&ctx->lock);
    int state = qp->state;
    if (state == SC_QPS_RESET) err = SC_POST_STATE;
    for (int i = 0; i < n && err == SC_POST_OK; i++) {
        err = sc_resp_post(qp, &wrs[i]);
        if (err == SC_POST_OK) (*posted)++;
    }
    if (state == SC_QPS_ERR) sc_resp_flush(qp, 1);
    pthread_mutex_unlock(&ctx->lock);
    return err;
}

/* -- what the halves share --------------------------------------------------------------------------- */

void sc_qp_pump(struct sc_qp *qp) {
    if (qp->conn && qp->state == SC_QPS_RTS) sc_conn_pump(qp->conn);
}

void sc_qp_send_response(struct sc_qp *qp, struct sc_frame *frame) {
    if (qp->conn) sc_conn_send(qp->conn, frame);
    else sc_frame_free(frame);
}

void sc_qp_complete_send(struct sc_qp *qp, const struct sc_sq_item *item, int status) {
    static const uint32_t wc_op[] = {
        [WR_RDMA_WRITE] = WCO_RDMA_WRITE, [WR_RDMA_WRITE_IMM] = WCO_RDMA_WRITE, [WR_SEND] = WCO_SEND,
        [WR_SEND_IMM] = WCO_SEND, [WR_RDMA_READ] = WCO_RDMA_READ, [WR_CMP_SWP] = WCO_COMP_SWAP,
        [WR_FETCH_ADD] = WCO_FETCH_ADD,
    };
    struct sc_wc wc = {.wr_id = item->wr_id, .status = (uint32_t)status, .opcode = wc_op[item->opcode],
                       .qp_num = qp->qpn, .byte_len = item->length};
    if (!sc_cq_push(qp->send_cq, &wc, 0)) sc_qp_enter_error(qp);
}

void sc_qp_complete_recv(struct sc_qp *qp, const struct sc_wc *wc, int solicited) {
    if (!sc_cq_push(qp->recv_cq, wc, solicited)) sc_qp_enter_error(qp);
}

/* -- the connection's sink --------------------------------------------------------------------------- */

int sc_qp_on_header(struct sc_qp *qp, struct sc_conn *conn, const struct sc_hdr *hdr) {
    /* (a pending connection is not qp->conn; nothing is placed before the peer's HELLO) */
    if (conn != qp->conn || qp->state == SC_QPS_ERR || !qp->welcomed) return 0;
    if (sc_wire_is_request(hdr->op)) return sc_resp_on_request(qp, hdr, &conn->targets);
    if (hdr->op == SC_OP_READ_RESP) return sc_req_read_targets(qp, hdr, &conn->targets);
    return 0;
}

void sc_qp_on_frame(struct sc_qp *qp, struct sc_conn *conn, const struct sc_hdr *hdr, int placed) {
    if (conn == qp->pending) { /* a frame before our HELLO: the peer did not wait for it */
        qp->pending = NULL;
        sc_conn_close(conn);
        return;
    }
    if (conn != qp->conn || qp->state == SC_QPS_ERR) return;
    if (!qp->welcomed) {
        on_welcome(qp, conn, hdr);
        return;
    }
    if (sc_wire_is_request(hdr->op)) {
        if (hdr->flags & SC_WIRE_FLAG_ACK) sc_req_on_ack(qp, hdr->ack);
        sc_resp_on_request_done(qp, hdr, placed);
        return;
    }
    switch (hdr->op) {
    case SC_OP_ACK: sc_req_on_ack(qp, hdr->seq); break;
    case SC_OP_NAK: sc_req_on_nak(qp, hdr->seq, hdr->imm, hdr->arg1); break;
    case SC_OP_READ_RESP: sc_req_on_read_response(qp, hdr, placed); break;
    case SC_OP_ATOMIC_RESP: sc_req_on_atomic_response(qp, hdr); break;
    default: { /* a second HELLO: the peer is confused, the stream cannot be trusted */
        struct sc_hdr nak = {.op = SC_OP_NAK, .seq = hdr->seq, .imm = WC_REM_INV_REQ_ERR};
        struct sc_frame *frame = sc_frame_new(qp->ctx, &nak);
        if (frame) sc_qp_send_response(qp, frame);
        sc_qp_enter_error(qp);
    }
    }
}

static void send_ack(struct sc_qp *qp) {
    uint32_t seq;
    if (!sc_resp_take_ack(qp, &seq) || !qp->conn || qp->conn->closed) return;
    struct sc_hdr ack = {.op = SC_OP_ACK, .seq = seq};
    struct sc_frame *frame = sc_frame_new(qp->ctx, &ack);
    if (frame) sc_conn_send(qp->conn, frame);
}

void sc_qp_after_input(struct sc_qp *qp, struct sc_conn *conn) {
    /* acknowledge what was executed: at once after SC_ACK_BATCH requests or when the last asked for it,
     * else after SC_ACK_DELAY_NS unless a request of ours carries the ack first */
    if (conn != qp->conn) return;
    if (sc_req_unsent(qp)) sc_qp_pump(qp);
    if (qp->unacked >= SC_ACK_BATCH || qp->ack_now) {
        sc_timer_set(qp, T_ACK, 0);
        send_ack(qp);
    } else if (qp->has_ack && !qp->timer[T_ACK]) {
        sc_timer_set(qp, T_ACK, sc_now() + SC_ACK_DELAY_NS);
    }
}

struct sc_frame *sc_qp_next_request(struct sc_qp *qp, struct sc_conn *conn) {
    if (conn != qp->conn || qp->state != SC_QPS_RTS || !qp->welcomed) return NULL;
    struct sc_frame *frame = sc_req_next(qp, qp->has_ack, qp->ack_seq);
    if (frame && qp->has_ack) {
        uint32_t seq;
        sc_resp_take_ack(qp, &seq);
    }
    return frame;
}

void sc_qp_on_broken(struct sc_qp *qp, struct sc_conn *conn) {
    /* the stream ended: requests now wait for the ack deadline, as they would behind a dead link */
    if (conn == qp->pending) qp->pending = NULL;
    else if (conn == qp->conn) qp->conn = NULL;
}

/* -- timers ------------------------------------------------------------------------------------------ */

static int take_due(struct sc_qp *qp, int which, int64_t now) {
    if (!qp->timer[which] || qp->timer[which] > now) return 0;
    sc_timer_set(qp, which, 0);
    return 1;
}

void sc_qp_fire_timers(struct sc_qp *qp, int64_t now) {
    if (take_due(qp, T_ACK, now)) send_ack(qp);
    if (take_due(qp, T_RNR, now)) sc_req_rnr_resume(qp);
    if (take_due(qp, T_DEADLINE, now)) sc_req_check_deadline(qp);
}
