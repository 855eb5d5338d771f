/* The responder half of a QP: the receive queue, and the checks and placement of incoming requests.
 *
 * Requests are executed in order: one whose sequence number is not the expected one is dropped unread
 * (after an RNR NAK the requester goes back and sends again). Every remote access is checked against the
 * rkey, the bounds, the MR's and the QP's access flags before a byte is placed; a violation is NAK'd with
 * REM_ACCESS_ERR, nothing is written, and the QP goes to ERR, as on an RNIC.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static struct sc_rq_item *at(struct sc_qp *qp, uint32_t index) {
    return &qp->rq[(qp->rq_head + index) % qp->cap.max_recv_wr];
}

static void move_item(struct sc_rq_item *dst, struct sc_rq_item *src) {
    *dst = *src;
    if (src->buffers.at == src->buffers.inline_at) dst->buffers.at = dst->buffers.inline_at;
}

enum sc_post_error sc_resp_post(struct sc_qp *qp, const struct sc_recv_wr *wr) {
    if (qp->rq_count >= qp->cap.max_recv_wr) return SC_POST_QUEUE_FULL;
    if (wr->num_sge > qp->cap.max_recv_sge) return SC_POST_SGES;
    struct sc_rq_item *item = at(qp, qp->rq_count);
    memset(item, 0, sizeof *item);
    struct sc_span *spans = sc_spans_alloc(&item->buffers, wr->num_sge);
    if (!spans) return SC_POST_NOMEM;
    for (uint32_t i = 0; i < wr->num_sge; i++) {
        const struct sc_sge *sge = &wr->sg[i];
        item->capacity += sge->length;
        struct sc_mr *mr = sc_mr_local(qp->ctx, qp->pd_id, sge->lkey);
        if (!mr || !(mr->access & ACCESS_LOCAL_WRITE) ||
            !sc_mr_span(mr, sge->addr, sge->length, &spans[item->buffers.count]))
            item->denied = 1;
        else item->buffers.count++;
    }
    item->wr_id = wr->wr_id;
    qp->rq_count++;
    return SC_POST_OK;
}

static void pop(struct sc_qp *qp, struct sc_rq_item *out) {
    move_item(out, at(qp, 0));
    qp->rq_head = (qp->rq_head + 1) % qp->cap.max_recv_wr;
    qp->rq_count--;
}

void sc_resp_flush(struct sc_qp *qp, int push) {
    while (qp->rq_count) {
        struct sc_rq_item done;
        pop(qp, &done);
        if (push) {
            struct sc_wc wc = {.wr_id = done.wr_id, .status = WC_WR_FLUSH_ERR, .opcode = WCO_RECV,
                               .qp_num = qp->qpn};
            sc_qp_complete_recv(qp, &wc, 0);
        }
        sc_spans_release(&done.buffers);
    }
    uint32_t seq;
    sc_resp_take_ack(qp, &seq);
}

int sc_resp_take_ack(struct sc_qp *qp, uint32_t *seq) {
    int had = qp->has_ack;
    *seq = qp->ack_seq;
    qp->has_ack = 0;
    qp->unacked = 0;
    qp->ack_now = 0;
    return had;
}

static uint32_t needed_access(unsigned op) {
    switch (op) {
    case SC_OP_WRITE:
    case SC_OP_WRITE_IMM: return ACCESS_REMOTE_WRITE;
    case SC_OP_READ_REQ: return ACCESS_REMOTE_READ;
    case SC_OP_CMP_SWP:
    case SC_OP_FETCH_ADD: return ACCESS_REMOTE_ATOMIC;
    default: return 0;
    }
}

static int is_atomic(unsigned op) { return op == SC_OP_CMP_SWP || op == SC_OP_FETCH_ADD; }

static int needs_recv(unsigned op) { return op == SC_OP_SEND || op == SC_OP_SEND_IMM || op == SC_OP_WRITE_IMM; }

/* The remote memory a request names, referenced, if keys, bounds and access flags allow it. */
static int remote(struct sc_qp *qp, const struct sc_hdr *hdr, struct sc_span *out) {
    uint32_t access = needed_access(hdr->op);
    if (!(qp->access & access)) return 0;
    uint64_t length = is_atomic(hdr->op) ? 8 : hdr->length;
    if (is_atomic(hdr->op) && hdr->addr % 8) return 0;
    struct sc_mr *mr = sc_mr_remote(qp->ctx, qp->pd_id, hdr->rkey);
    if (!mr || (mr->access & access) != access) return 0;
    return sc_mr_span(mr, hdr->addr, length, out);
}

static void respond(struct sc_qp *qp, const struct sc_hdr *hdr) {
    struct sc_frame *frame = sc_frame_new(qp->ctx, hdr);
    if (frame) sc_qp_send_response(qp, frame);
}

static int nak(struct sc_qp *qp, uint32_t seq, uint32_t status) {
    respond(qp, &(struct sc_hdr){.op = SC_OP_NAK, .seq = seq, .imm = status});
    sc_qp_enter_error(qp);
    return 0;
}

static int fail_recv(struct sc_qp *qp, const struct sc_hdr *hdr, uint32_t local, uint32_t remote_status) {
    struct sc_rq_item done;
    pop(qp, &done);
    sc_spans_release(&done.buffers);
    struct sc_wc wc = {.wr_id = done.wr_id, .status = local, .opcode = WCO_RECV, .qp_num = qp->qpn};
    sc_qp_complete_recv(qp, &wc, 0);
    return nak(qp, hdr->seq, remote_status);
}

int sc_resp_on_request(struct sc_qp *qp, const struct sc_hdr *hdr, struct sc_spans *targets) {
    qp->accepted = 0;
    if (hdr->seq != qp->expected) return 0;
    unsigned op = hdr->op;
    struct sc_span target = {0};
    if (needed_access(op) && !remote(qp, hdr, &target)) return nak(qp, hdr->seq, WC_REM_ACCESS_ERR);
    if (target.mr) sc_mr_put(target.mr); /* looked at again when the frame is done, or placed below */
    if (needs_recv(op) && !qp->rq_count) {
        respond(qp, &(struct sc_hdr){.op = SC_OP_NAK, .seq = hdr->seq, .imm = SC_WIRE_NAK_RNR,
                                     .arg1 = qp->min_rnr_timer});
        return 0;
    }
    if (op == SC_OP_SEND || op == SC_OP_SEND_IMM) {
        struct sc_rq_item *recv = at(qp, 0);
        if (recv->denied) return fail_recv(qp, hdr, WC_LOC_PROT_ERR, WC_REM_OP_ERR);
        if (hdr->length > recv->capacity) return fail_recv(qp, hdr, WC_LOC_LEN_ERR, WC_REM_INV_REQ_ERR);
        qp->accepted = 1;
        struct sc_span *spans = sc_spans_alloc(targets, recv->buffers.count);
        if (!spans) return 0;
        uint32_t left = hdr->length, n = 0; /* the scatter list cut to exactly the message */
        for (uint32_t i = 0; i < recv->buffers.count && (left || n == 0); i++) {
            spans[n] = recv->buffers.at[i];
            if (spans[n].len > left) spans[n].len = left;
            left -= spans[n].len;
            spans[n++].mr->refs++;
        }
        targets->count = n;
        return 1;
    }
    qp->accepted = 1;
    if (op != SC_OP_WRITE && op != SC_OP_WRITE_IMM) return 0;
    struct sc_span *spans = sc_spans_alloc(targets, 1);
    if (!spans || !remote(qp, hdr, &spans[0])) return 0;
    targets->count = 1;
    return 1;
}

static uint64_t atomic(struct sc_qp *qp, const struct sc_hdr *hdr) {
    struct sc_span target;
    if (!remote(qp, hdr, &target)) return 0; /* checked in sc_resp_on_request, nothing ran since */
    uint64_t old;
    memcpy(&old, target.ptr, 8);
    if (hdr->op == SC_OP_FETCH_ADD) {
        uint64_t sum = old + hdr->arg1;
        memcpy(target.ptr, &sum, 8);
    } else if (old == hdr->arg1) {
        memcpy(target.ptr, &hdr->arg2, 8);
    }
    sc_mr_put(target.mr);
    return old;
}

static void complete_recv(struct sc_qp *qp, const struct sc_hdr *hdr) {
    struct sc_rq_item done;
    pop(qp, &done);
    sc_spans_release(&done.buffers);
    int with_imm = hdr->op == SC_OP_SEND_IMM || hdr->op == SC_OP_WRITE_IMM;
    struct sc_wc wc = {
        .wr_id = done.wr_id, .status = WC_SUCCESS,
        .opcode = hdr->op == SC_OP_WRITE_IMM ? WCO_RECV_RDMA_WITH_IMM : WCO_RECV, .qp_num = qp->qpn,
        .byte_len = hdr->length, .imm_data = with_imm ? hdr->imm : 0,
        .wc_flags = with_imm ? WC_FLAG_WITH_IMM : 0, .src_qp = qp->remote_qpn,
    };
    sc_qp_complete_recv(qp, &wc, (hdr->flags & SC_WIRE_FLAG_SOLICITED) != 0);
}

void sc_resp_on_request_done(struct sc_qp *qp, const struct sc_hdr *hdr, int placed) {
    if (!qp->accepted || qp->state == SC_QPS_ERR) return; /* refused (NAK sent), or dropped for a retry */
    qp->accepted = 0;
    unsigned op = hdr->op;
    if (sc_wire_payload_length(hdr) && !placed) return;
    if (op == SC_OP_READ_REQ) {
        struct sc_frame *frame = sc_frame_new(qp->ctx, &(struct sc_hdr){.op = SC_OP_READ_RESP, .seq = hdr->seq,
                                                                .length = hdr->length});
        if (!frame) return;
        struct sc_span *spans = sc_spans_alloc(&frame->payload, 1);
        if (spans && remote(qp, hdr, &spans[0])) frame->payload.count = 1;
        sc_frame_seal(frame);
        if (frame->total != SC_WIRE_HEADER_SIZE + (uint64_t)hdr->length) { /* cannot happen: checked */
            sc_frame_free(frame);
            nak(qp, hdr->seq, WC_REM_ACCESS_ERR);
            return;
        }
        sc_qp_send_response(qp, frame);
    } else if (is_atomic(op)) {
        respond(qp, &(struct sc_hdr){.op = SC_OP_ATOMIC_RESP, .seq = hdr->seq, .arg1 = atomic(qp, hdr)});
    } else {
        qp->has_ack = 1;
        qp->ack_seq = hdr->seq;
        qp->unacked++;
        qp->ack_now |= (hdr->flags & SC_WIRE_FLAG_ACK_REQ) != 0;
    }
    if (needs_recv(op)) complete_recv(qp, hdr);
    qp->expected++;
}
