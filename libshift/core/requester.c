/* The requester half of a QP: the send queue, its frames, acks, the ack deadline and RNR retries.
 *
 * Work requests complete in order, and only when the responder has answered for them (an ACK at or after
 * their sequence number, or their READ/atomic response). The ack deadline (timeout and retry_cnt, worked
 * out by the caller) runs while anything is outstanding and restarts on every step of progress and on
 * every sign of life TCP gives of the path (liveness.c); when it passes, the oldest request completes
 * RETRY_EXC_ERR and the QP goes to ERR, which is how a dead or black-holed link looks on an RNIC.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define SEQ_MASK 0xFFFFFFFFull

/* IB's encoded RNR NAK timer (C9-138), in microseconds; 0 is the longest. */
static const uint32_t rnr_delay_us[32] = {
    655360, 10,    20,    30,    40,    60,    80,     120,    160,    240,    320,
    480,    640,   960,   1280,  1920,  2560,  3840,   5120,   7680,   10240,  15360,
    20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
};

static const uint8_t wire_op[] = {
    [WR_RDMA_WRITE] = SC_OP_WRITE,  [WR_RDMA_WRITE_IMM] = SC_OP_WRITE_IMM, [WR_SEND] = SC_OP_SEND,
    [WR_SEND_IMM] = SC_OP_SEND_IMM, [WR_RDMA_READ] = SC_OP_READ_REQ,       [WR_CMP_SWP] = SC_OP_CMP_SWP,
    [WR_FETCH_ADD] = SC_OP_FETCH_ADD,
};

static int is_atomic(uint32_t op) { return op == WR_CMP_SWP || op == WR_FETCH_ADD; }

static int writes_local(uint32_t op) { return op == WR_RDMA_READ || is_atomic(op); }

static struct sc_sq_item *at(struct sc_qp *qp, uint32_t index) {
    return &qp->sq[(qp->sq_head + index) % qp->cap.max_send_wr];
}

/* Copies an item; spans kept in the item itself must then point into the copy. */
static void move_item(struct sc_sq_item *dst, struct sc_sq_item *src) {
    *dst = *src;
    if (src->local.at == src->local.inline_at) dst->local.at = dst->local.inline_at;
    if (src->inline_data == src->inline_store) dst->inline_data = dst->inline_store;
}

static void release(struct sc_sq_item *item) {
    sc_spans_release(&item->local);
    if (item->inline_data != item->inline_store) free(item->inline_data);
    item->inline_data = NULL;
}

enum sc_post_error sc_req_post(struct sc_qp *qp, const struct sc_send_wr *wr) {
    if (qp->sq_count >= qp->cap.max_send_wr) return SC_POST_QUEUE_FULL;
    if (wr->opcode > WR_FETCH_ADD) return SC_POST_OPCODE;
    if (wr->num_sge > qp->cap.max_send_sge) return SC_POST_SGES;
    struct sc_sq_item *item = at(qp, qp->sq_count);
    memset(item, 0, sizeof *item);
    int local_write = writes_local(wr->opcode), denied = 0;
    uint64_t length = 0;
    struct sc_span *spans = sc_spans_alloc(&item->local, wr->num_sge);
    if (!spans) return SC_POST_NOMEM;
    for (uint32_t i = 0; i < wr->num_sge; i++) {
        const struct sc_sge *sge = &wr->sg[i];
        length += sge->length;
        struct sc_mr *mr = sc_mr_local(qp->ctx, qp->pd_id, sge->lkey);
        if (!mr || (local_write && !(mr->access & ACCESS_LOCAL_WRITE)) ||
            !sc_mr_span(mr, sge->addr, sge->length, &spans[item->local.count]))
            denied = 1;
        else item->local.count++;
    }
    enum sc_post_error err = SC_POST_OK;
    if (length > UINT32_MAX) err = SC_POST_SGES;
    else if ((wr->send_flags & SEND_INLINE) && !local_write) {
        if (length > qp->cap.max_inline_data) err = SC_POST_INLINE;
        else if (length) { /* the bytes are taken now: the application may reuse its buffer at once */
            item->inline_data = length <= SC_INLINE_BYTES ? item->inline_store : malloc(length);
            if (!item->inline_data) err = SC_POST_NOMEM;
            for (uint32_t i = 0, off = 0; item->inline_data && i < item->local.count; i++) {
                memcpy(item->inline_data + off, spans[i].ptr, spans[i].len);
                off += spans[i].len;
            }
            if (!denied) sc_spans_release(&item->local);
        }
    }
    if (!err && is_atomic(wr->opcode) && (wr->num_sge != 1 || length != 8)) err = SC_POST_ATOMIC;
    if (err) {
        release(item);
        return err;
    }
    item->wr_id = wr->wr_id;
    item->opcode = wr->opcode;
    item->seq = qp->next_seq++;
    item->signaled = qp->sq_sig_all || (wr->send_flags & SEND_SIGNALED);
    item->length = (uint32_t)length;
    item->rkey = wr->rkey;
    item->imm = wr->imm_data;
    item->addr = wr->remote_addr;
    item->arg1 = wr->compare_add;
    item->arg2 = wr->swap;
    item->flags = (wr->send_flags & SEND_SOLICITED) ? SC_WIRE_FLAG_SOLICITED : 0;
    item->error = denied ? WC_LOC_PROT_ERR : 0;
    qp->sq_count++;
    return SC_POST_OK;
}

int sc_req_unsent(const struct sc_qp *qp) { return qp->tx_seq != qp->next_seq && !qp->rnr_wait; }

/* Complete item (at index) with an error, then go to ERR: the rest flushes. */
static void fail(struct sc_qp *qp, uint32_t index, int status) {
    struct sc_sq_item gone;
    move_item(&gone, at(qp, index));
    for (uint32_t i = index; i + 1 < qp->sq_count; i++) move_item(at(qp, i), at(qp, i + 1));
    qp->sq_count--;
    sc_qp_complete_send(qp, &gone, status);
    release(&gone);
    sc_qp_enter_error(qp);
    sc_req_flush(qp, 1);
}

void sc_req_fail_head(struct sc_qp *qp, int status) { fail(qp, 0, status); }

struct sc_frame *sc_req_next(struct sc_qp *qp, int with_ack, uint32_t ack) {
    if (!sc_req_unsent(qp) || !qp->sq_count) return NULL;
    uint32_t index = (uint32_t)(qp->tx_seq - at(qp, 0)->seq);
    struct sc_sq_item *item = at(qp, index);
    if (item->error) {
        fail(qp, index, item->error);
        return NULL;
    }
    /* the last request queued: nothing follows soon that the responder's ack could wait for (IB's AckReq) */
    uint16_t last = qp->tx_seq + 1 == qp->next_seq ? SC_WIRE_FLAG_ACK_REQ : 0;
    struct sc_hdr hdr = {
        .op = wire_op[item->opcode],
        .flags = (uint16_t)(item->flags | last | (with_ack ? SC_WIRE_FLAG_ACK : 0)),
        .seq = (uint32_t)item->seq, .length = item->length, .rkey = item->rkey, .imm = item->imm,
        .addr = item->addr, .arg1 = item->arg1, .arg2 = item->arg2, .ack = with_ack ? ack : 0,
    };
    struct sc_frame *frame = sc_frame_new(qp->ctx, &hdr);
    if (!frame) return NULL;
    if (sc_wire_payload_length(&hdr)) {
        if (item->inline_data) { /* copied: the frame may outlive the entry (a flush while it is sent) */
            uint8_t *copy = sc_frame_inline(frame, item->length);
            if (!copy) {
                sc_frame_free(frame);
                return NULL;
            }
            memcpy(copy, item->inline_data, item->length);
        } else {
            struct sc_span *spans = sc_spans_alloc(&frame->payload, item->local.count);
            if (!spans) {
                sc_frame_free(frame);
                return NULL;
            }
            for (uint32_t i = 0; i < item->local.count; i++) { /* the frame holds the memory too */
                spans[i] = item->local.at[i];
                spans[i].mr->refs++;
            }
            frame->payload.count = item->local.count;
        }
    }
    sc_frame_seal(frame);
    qp->tx_seq++;
    return frame;
}

/* The internal sequence number a response names, if it names a request already sent. */
static int outstanding(struct sc_qp *qp, uint32_t wire_seq, uint64_t *seq) {
    if (!qp->sq_count) return 0;
    uint64_t base = at(qp, 0)->seq;
    *seq = base + ((wire_seq - base) & SEQ_MASK);
    return *seq < qp->tx_seq;
}

static void complete_upto(struct sc_qp *qp, uint64_t seq) {
    int progressed = 0;
    while (qp->sq_count && at(qp, 0)->seq <= seq) {
        struct sc_sq_item done;
        move_item(&done, at(qp, 0));
        qp->sq_head = (qp->sq_head + 1) % qp->cap.max_send_wr;
        qp->sq_count--;
        progressed = 1;
        if (done.signaled) sc_qp_complete_send(qp, &done, WC_SUCCESS);
        release(&done);
    }
    if (progressed) sc_req_arm(qp);
}

void sc_req_on_ack(struct sc_qp *qp, uint32_t wire_seq) {
    uint64_t seq;
    if (outstanding(qp, wire_seq, &seq)) complete_upto(qp, seq);
}

void sc_req_on_nak(struct sc_qp *qp, uint32_t wire_seq, uint32_t syndrome, uint64_t rnr_timer) {
    uint64_t seq;
    if (!outstanding(qp, wire_seq, &seq)) return;
    complete_upto(qp, seq - 1);
    if (!qp->sq_count || qp->state == SC_QPS_ERR) return;
    struct sc_sq_item *item = at(qp, 0);
    if (syndrome != SC_WIRE_NAK_RNR) {
        fail(qp, 0, syndrome >= 1 && syndrome <= WC_GENERAL_ERR ? (int)syndrome : WC_REM_OP_ERR);
        return;
    }
    if (qp->rnr_retry != SC_RNR_FOREVER && item->rnr_tries >= qp->rnr_retry) {
        fail(qp, 0, WC_RNR_RETRY_EXC_ERR);
        return;
    }
    item->rnr_tries++;
    qp->tx_seq = item->seq; /* go back: the responder drops everything after the NAK'd request */
    qp->rnr_wait = 1;
    qp->deadline = 0;
    sc_timer_set(qp, T_RNR, sc_now() + (int64_t)rnr_delay_us[rnr_timer & 31] * 1000);
}

void sc_req_rnr_resume(struct sc_qp *qp) {
    qp->rnr_wait = 0;
    sc_req_arm(qp);
    sc_qp_pump(qp);
}

int sc_req_read_targets(struct sc_qp *qp, const struct sc_hdr *hdr, struct sc_spans *out) {
    uint64_t seq;
    if (!outstanding(qp, hdr->seq, &seq)) return 0;
    struct sc_sq_item *item = at(qp, (uint32_t)(seq - at(qp, 0)->seq));
    if (item->opcode != WR_RDMA_READ || hdr->length != item->length || item->error) return 0;
    struct sc_span *spans = sc_spans_alloc(out, item->local.count);
    if (!spans) return 0;
    for (uint32_t i = 0; i < item->local.count; i++) {
        spans[i] = item->local.at[i];
        spans[i].mr->refs++;
    }
    out->count = item->local.count;
    return 1;
}

void sc_req_on_read_response(struct sc_qp *qp, const struct sc_hdr *hdr, int placed) {
    uint64_t seq;
    if (!outstanding(qp, hdr->seq, &seq)) return;
    if (!placed) fail(qp, (uint32_t)(seq - at(qp, 0)->seq), WC_BAD_RESP_ERR);
    else complete_upto(qp, seq);
}

void sc_req_on_atomic_response(struct sc_qp *qp, const struct sc_hdr *hdr) {
    uint64_t seq;
    if (!outstanding(qp, hdr->seq, &seq)) return;
    uint32_t index = (uint32_t)(seq - at(qp, 0)->seq);
    struct sc_sq_item *item = at(qp, index);
    if (!is_atomic(item->opcode) || item->local.count != 1 || item->local.at[0].len != 8) {
        fail(qp, index, WC_BAD_RESP_ERR);
        return;
    }
    memcpy(item->local.at[0].ptr, &hdr->arg1, 8); /* the host's byte order, as the application reads it */
    complete_upto(qp, seq);
}

void sc_req_flush(struct sc_qp *qp, int push) {
    while (qp->sq_count) {
        struct sc_sq_item done;
        move_item(&done, at(qp, 0));
        qp->sq_head = (qp->sq_head + 1) % qp->cap.max_send_wr;
        qp->sq_count--;
        if (push) sc_qp_complete_send(qp, &done, WC_WR_FLUSH_ERR);
        release(&done);
    }
    qp->tx_seq = qp->next_seq;
    qp->rnr_wait = 0;
    qp->deadline = 0;
    sc_timer_set(qp, T_DEADLINE, 0);
    sc_timer_set(qp, T_RNR, 0);
}

/* -- the ack deadline -------------------------------------------------------------------------------- */

void sc_req_arm(struct sc_qp *qp) {
    /* only the deadline moves; the timer stays where it is and, when it fires early, is set again for
     * the next look, so the busy path costs no wake-up of the progress thread */
    if (!qp->sq_count || !qp->ack_timeout_ns || qp->rnr_wait) {
        qp->deadline = 0;
        return;
    }
    int64_t now = sc_now();
    qp->deadline = now + (int64_t)qp->ack_timeout_ns;
    qp->look = now + (int64_t)qp->retry_period_ns;
    sc_path_reset(&qp->path);
    if (!qp->timer[T_DEADLINE]) sc_timer_set(qp, T_DEADLINE, qp->look);
}

void sc_req_check_deadline(struct sc_qp *qp) {
    /* once per retry period without an ack: if TCP shows the path alive the deadline starts over (the
     * wait is on the remote host, as behind an RNIC that acked); past the deadline, RETRY_EXC_ERR */
    if (qp->deadline && sc_now() >= qp->look && qp->conn) sc_conn_read_pending(qp->conn);
    if (!qp->deadline || !qp->sq_count || !qp->ack_timeout_ns) return;
    int64_t now = sc_now(), period = (int64_t)qp->retry_period_ns;
    if (now >= qp->look) {
        int alive = qp->conn ? sc_path_alive(&qp->path, qp->conn->fd) : 0;
        if (alive == 1) qp->deadline = now + (int64_t)qp->ack_timeout_ns;
        else if (alive == -1 && qp->deadline < now + period) qp->deadline = now + period;
        if (now >= qp->deadline) {
            fail(qp, 0, WC_RETRY_EXC_ERR);
            return;
        }
        qp->look = now + period < qp->deadline ? now + period : qp->deadline;
    }
    sc_timer_set(qp, T_DEADLINE, qp->look);
}
