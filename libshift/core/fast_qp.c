/* A shift QP's fast mode: posting on the path in use (with that path's keys on a backup) with the ledger
 * kept here, its completions taken and released in posting order, and the hand-over of the ledger to the
 * Python failover layer and back. */
#include <stdlib.h>
#include <string.h>

#include "fast_internal.h"
#include "internal.h" /* ibverbs' numbers */

int sf_two_sided(uint32_t opcode) { return opcode == WR_SEND || opcode == WR_SEND_IMM || opcode == WR_RDMA_WRITE_IMM; }

int sf_remote_keyed(uint32_t opcode) { return opcode != WR_SEND && opcode != WR_SEND_IMM; }

sf_qp *sf_qp_new(sf_ctx *ctx, sf_cq *send_cq, sf_cq *recv_cq, uint32_t max_send_wr, uint32_t max_recv_wr,
                 uint32_t max_sge, uint32_t max_inline, int sig_all) {
    sf_qp *qp = calloc(1, sizeof *qp);
    if (!qp)
        return NULL;
    qp->ctx = ctx;
    qp->send_cq = send_cq;
    qp->recv_cq = recv_cq;
    qp->sig_all = sig_all;
    qp->next_id = 1;
    qp->translated = calloc(max_sge ? max_sge : 1, sizeof *qp->translated);
    if (!qp->translated || sf_queue_init(&qp->sq, max_send_wr, max_sge, max_inline) ||
        sf_queue_init(&qp->rq, max_recv_wr, max_sge, 0)) {
        sf_qp_free(qp);
        return NULL;
    }
    return qp;
}

int sf_qp_add_path(sf_qp *qp, int path, void *provider_qp, uint32_t qpn) {
    if (path < 0 || path >= qp->ctx->paths || sf_ctx_register(qp->ctx, path, qpn, qp))
        return -1;
    qp->on[path] = provider_qp;
    qp->qpn[path] = qpn;
    return 0;
}

void sf_qp_free(sf_qp *qp) {
    if (!qp)
        return;
    sf_switch_forget(qp);
    for (int path = 0; path < SF_PATHS; path++)
        if (qp->on[path])
            sf_ctx_unregister(qp->ctx, path, qp->qpn[path]);
    sf_queue_fini(&qp->sq);
    sf_queue_fini(&qp->rq);
    for (int path = 0; path < SF_PATHS; path++)
        sf_keymap_fini(&qp->rkeys[path]);
    free(qp->translated);
    free(qp);
}

int sf_qp_set_rkey(sf_qp *qp, int path, uint32_t rkey, uint32_t path_rkey) {
    if (path <= 0 || path >= qp->ctx->paths)
        return -1;
    return sf_keymap_set(&qp->rkeys[path], rkey, path_rkey);
}

int sf_qp_mode(const sf_qp *qp) { return qp->mode; }

int sf_qp_path(const sf_qp *qp) { return qp->path; }

uint32_t sf_qp_inline_kept(sf_qp *qp) {
    uint32_t kept = 0;
    for (uint32_t i = 0; i < qp->sq.count; i++)
        kept += sf_queue_at(&qp->sq, i)->inline_len > 0;
    return kept;
}

/* -- posting ------------------------------------------------------------------------------------------------ */

/* Whether the QP has used rkey before; if not, it is remembered (the oldest of SF_SEEN_RKEYS forgotten). */
static int seen_rkey(sf_qp *qp, uint32_t rkey) {
    for (uint32_t i = 0; i < qp->seen; i++)
        if (qp->seen_rkeys[i] == rkey)
            return 1;
    qp->seen_rkeys[qp->seen_next] = rkey;
    qp->seen_next = (qp->seen_next + 1) % SF_SEEN_RKEYS;
    if (qp->seen < SF_SEEN_RKEYS)
        qp->seen++;
    return 0;
}

/* An inline send's bytes, read where the provider has just read them from (it accepted the post). */
static void keep_inline(struct sf_queue *q, struct sf_entry *e) {
    uint32_t length = 0;
    for (uint32_t i = 0; i < e->wr.num_sge; i++)
        length += e->wr.sg[i].length;
    if (!length || length > q->max_inline)
        return;
    uint8_t *at = e->inline_copy;
    for (uint32_t i = 0; i < e->wr.num_sge; i++) {
        memcpy(at, (const void *)(uintptr_t)e->wr.sg[i].addr, e->wr.sg[i].length);
        at += e->wr.sg[i].length;
    }
    e->inline_len = length;
}

/* The SGEs of a WR going out on the QP's path: as they are on the default path, else with the path's lkeys
 * (an lkey without a twin goes out as it is, and the provider judges it, as without shift), in `room`. */
const struct sc_sge *sf_qp_on_path(sf_qp *qp, const struct sc_sge *sg, uint32_t n, struct sc_sge *room) {
    if (qp->path == 0)
        return sg;
    for (uint32_t i = 0; i < n; i++) {
        room[i] = sg[i];
        sf_keymap_get(&qp->ctx->lkeys[qp->path], sg[i].lkey, &room[i].lkey);
    }
    return room;
}

enum sf_post sf_qp_post_send(sf_qp *qp, const struct sc_send_wr *wr, enum sc_post_error *err) {
    if (qp->mode != SF_MODE_FAST)
        return SF_NOT_FAST;
    uint32_t rkey = wr->rkey;
    if (qp->path != 0 && sf_remote_keyed(wr->opcode) && !sf_keymap_get(&qp->rkeys[qp->path], wr->rkey, &rkey))
        return SF_NOT_FAST; /* the failover layer looks the peer's key up */
    int held = qp->phase == SF_HANDSHAKE; /* posted with the replay, once the peer's count is in */
    if (held && (wr->send_flags & SEND_INLINE))
        return SF_NOT_FAST; /* its bytes would need a registered copy on the path: the failover layer's pool */
    struct sf_entry *e = sf_queue_reserve(&qp->sq);
    if (!e)
        return SF_QUEUE_FULL;
    if (sf_entry_fill(&qp->sq, e, wr)) {
        *err = SC_POST_SGES;
        return SF_REFUSED;
    }
    if (!held) {
        struct sc_send_wr provider = e->wr;
        provider.wr_id = qp->next_id;
        provider.send_flags |= SEND_SIGNALED; /* every WR's fate must be known here */
        provider.rkey = rkey;
        provider.sg = sf_qp_on_path(qp, e->wr.sg, e->wr.num_sge, qp->translated);
        int posted = 0;
        *err = qp->ctx->dp->post_send(qp->on[qp->path], &provider, 1, &posted);
        if (*err != SC_POST_OK)
            return SF_REFUSED;
    }
    e->id = qp->next_id++;
    e->is_send = 1;
    e->posted = !held;
    e->signaled = qp->sig_all || (wr->send_flags & SEND_SIGNALED);
    if (sf_two_sided(wr->opcode))
        e->index = qp->sent_two_sided++;
    if (wr->send_flags & SEND_INLINE)
        keep_inline(&qp->sq, e);
    qp->sq.count++;
    if (qp->path != 0) {
        sf_ctx_heat_backups(qp->ctx); /* its completion comes there: every pass reads the backups meanwhile */
        return SF_POSTED;
    }
    return sf_remote_keyed(wr->opcode) && !seen_rkey(qp, wr->rkey) ? SF_POSTED_NEW_RKEY : SF_POSTED;
}

enum sf_post sf_qp_post_recv(sf_qp *qp, const struct sc_recv_wr *wr, enum sc_post_error *err) {
    if (qp->mode != SF_MODE_FAST)
        return SF_NOT_FAST;
    struct sf_entry *e = sf_queue_reserve(&qp->rq);
    if (!e)
        return SF_QUEUE_FULL;
    struct sc_send_wr as_send = {.wr_id = wr->wr_id, .num_sge = wr->num_sge, .sg = wr->sg};
    if (sf_entry_fill(&qp->rq, e, &as_send)) {
        *err = SC_POST_SGES;
        return SF_REFUSED;
    }
    struct sc_recv_wr provider = {.wr_id = qp->next_id, .num_sge = wr->num_sge,
                                  .sg = sf_qp_on_path(qp, e->wr.sg, e->wr.num_sge, qp->translated)};
    int posted = 0;
    *err = qp->ctx->dp->post_recv(qp->on[qp->path], &provider, 1, &posted);
    if (*err != SC_POST_OK)
        return SF_REFUSED;
    e->id = qp->next_id++;
    e->posted = e->signaled = 1;
    qp->rq.count++;
    return SF_POSTED;
}

enum sc_post_error sf_qp_post_raw_send(sf_qp *qp, int path, const struct sc_send_wr *wrs, int n, int *posted) {
    *posted = 0;
    if (path < 0 || path >= SF_PATHS || !qp->on[path])
        return SC_POST_STATE;
    return qp->ctx->dp->post_send(qp->on[path], wrs, n, posted);
}

enum sc_post_error sf_qp_post_raw_recv(sf_qp *qp, int path, const struct sc_recv_wr *wrs, int n, int *posted) {
    *posted = 0;
    if (path < 0 || path >= SF_PATHS || !qp->on[path])
        return SC_POST_STATE;
    return qp->ctx->dp->post_recv(qp->on[path], wrs, n, posted);
}

/* -- completions -------------------------------------------------------------------------------------------- */

/* Something for the failover layer: the ledger goes to it, and the completion waits for it, in order. */
void sf_qp_to_python(sf_qp *qp, int path, const struct sc_wc *wc) {
    qp->mode = SF_MODE_PYTHON;
    struct sf_deferred item = {.kind = SF_DEFER_WC, .path = (uint32_t)path, .wc = *wc};
    sf_ctx_defer(qp->ctx, &item);
}

/* Hand the application every completion at the heads of the queues, in posting order. */
void sf_qp_release(sf_qp *qp) {
    int overflowed = 0;
    struct sf_entry *e;
    while ((e = sf_queue_pop_done(&qp->sq)))
        if (e->signaled || e->wc.status)
            overflowed |= sf_cq_push(qp->send_cq, &e->wc) < 0;
    while ((e = sf_queue_pop_done(&qp->rq)))
        overflowed |= sf_cq_push(qp->recv_cq, &e->wc) < 0;
    if (overflowed) { /* the QP must fail, as on an RNIC: that is the failover layer's to do */
        qp->mode = SF_MODE_PYTHON;
        struct sf_deferred item = {.kind = SF_DEFER_OVERFLOW, .wc = {.qp_num = qp->qpn[0]}};
        sf_ctx_defer(qp->ctx, &item);
    }
}

/* An error completion of an application WR: on a path being stopped or left the WR is still outstanding
 * (the switch settles or replays it), on the path in use it is the failover layer's to judge. */
static void failed(sf_qp *qp, int path, const struct sc_wc *wc) {
    if (path == qp->path && qp->phase != SF_STOPPING) {
        sf_qp_to_python(qp, path, wc);
        return;
    }
    struct sf_entry *e = sf_queue_find(wc->opcode & WCO_RECV ? &qp->rq : &qp->sq, wc->wr_id);
    if (!e) /* ibverbs leaves an error's opcode undefined: look in both queues */
        e = sf_queue_find(wc->opcode & WCO_RECV ? &qp->sq : &qp->rq, wc->wr_id);
    if (e && !e->done && !e->failed_with)
        e->failed_with = wc->status;
}

void sf_qp_complete(sf_qp *qp, int path, const struct sc_wc *wc) {
    if (qp->mode != SF_MODE_FAST) {
        sf_qp_to_python(qp, path, wc);
        return;
    }
    if (wc->wr_id >= SF_CONTROL_IDS) {
        if (!sf_switch_control(qp, path, wc))
            sf_qp_to_python(qp, path, wc);
        return;
    }
    if (wc->status) {
        failed(qp, path, wc);
        return;
    }
    if (path != qp->path)
        return; /* a path left: what completed there after it was drained is settled by the counts */
    int is_recv = (wc->opcode & WCO_RECV) != 0;
    struct sf_entry *e = sf_queue_find(is_recv ? &qp->rq : &qp->sq, wc->wr_id);
    if (!e || e->done)
        return; /* none of ours any more (as the Python ledger drops an id it no longer has) */
    e->done = 1;
    e->wc = *wc;
    e->wc.wr_id = e->wr.wr_id;
    e->wc.qp_num = qp->qpn[0];
    if (is_recv)
        qp->received++;
    sf_qp_release(qp);
}

/* -- hand-over ---------------------------------------------------------------------------------------------- */

int sf_qp_export(sf_qp *qp, struct sf_ledger_view *out) {
    if (qp->news_count)
        return 1;
    out->sq_count = sf_queue_export(&qp->sq);
    out->rq_count = sf_queue_export(&qp->rq);
    out->sq = qp->sq.scratch;
    out->rq = qp->rq.scratch;
    out->next_id = qp->next_id;
    out->sent_two_sided = qp->sent_two_sided;
    out->received = qp->received;
    qp->mode = SF_MODE_PYTHON;
    sf_switch_export(qp); /* a switch under way here is the failover layer's to finish now */
    return 0;
}

int sf_qp_import(sf_qp *qp, const struct sf_entry *entry) {
    if (qp->mode != SF_MODE_PYTHON)
        return -1;
    return sf_queue_import(entry->is_send ? &qp->sq : &qp->rq, entry);
}

void sf_qp_import_done(sf_qp *qp, int path, uint64_t next_id, int64_t sent_two_sided, int64_t received) {
    qp->path = path > 0 && path < qp->ctx->paths && qp->on[path] ? path : 0;
    qp->next_id = next_id;
    qp->sent_two_sided = sent_two_sided;
    qp->received = received;
    qp->mode = SF_MODE_FAST;
    qp->phase = SF_STEADY; /* handed back only in the steady state, whatever a switch here had begun */
}

void sf_qp_import_abort(sf_qp *qp) {
    qp->sq.head = qp->sq.count = 0;
    qp->rq.head = qp->rq.count = 0;
}
