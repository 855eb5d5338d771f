/* The failover of a fast-mode shift QP, made in the core with no Python in the way, on the thread that
 * meets its cause: the link watch's, or the one whose pass takes the peer's count (docs/core.md, "The
 * switch in the core"). The same steps as the failover layer's (libshift/shift/switch.py), for a QP in its
 * steady state whose path fails.
 *
 * Leave: the path in use goes to ERR and its CQs are drained (what completed there counts, what failed
 * stays outstanding), the receives move to the new path, our count of completed two-sided receives goes
 * to the peer there (an RDMA_WRITE_WITH_IMM into its control receive). Resume, when the peer's count is
 * in: the sends it has complete without a second execution (and every plain WRITE before the last of
 * them: RC order), READs and the rest go again on the new path, in order; an atomic in flight completes
 * with its error (fail-closed). Sends posted meanwhile are held and go with the replay.
 *
 * It moves only to a backup path, and only when everything outstanding can go there from here (the peer's
 * keys on that path known, no inline copy to replay): anything else (a failback, a key to look up, a
 * second switch during a handshake, an error) is the failover layer's, which the QP's news keeps in step.
 * Triggers: the link of the path in use seen down (the link watch's bit, raised from its own thread), and
 * the peer's count on a backup path. sf_qp_complete only queues work, so a switch's drain never starts
 * another switch inside it: the context's work list is run after each pass, until it is empty. */
#include <stdlib.h>
#include <string.h>

#include "fast_internal.h"
#include "internal.h" /* ibverbs' numbers */

enum { NOTIFY_RECV = 0, NOTIFY_SEND = 1 }; /* the failover layer's control wr_ids, above SF_CONTROL_IDS */
#define COUNT_MASK 0xFFFFFFFFu              /* the count travels as a 32-bit immediate */

static uint32_t bit(int path) { return 1u << path; }

void sf_qp_set_armed(sf_qp *qp, int path, int armed) {
    if (path < 0 || path >= qp->ctx->paths)
        return;
    qp->armed = armed ? qp->armed | bit(path) : qp->armed & ~bit(path);
}

void sf_qp_set_target(sf_qp *qp, int path, uint64_t addr, uint32_t rkey) {
    if (path < 0 || path >= qp->ctx->paths)
        return;
    qp->target_addr[path] = addr;
    qp->target_rkey[path] = rkey;
}

int sf_qp_news(sf_qp *qp, struct sf_news *out, int max) {
    int n = (int)qp->news_count < max ? (int)qp->news_count : max;
    memcpy(out, qp->news, (size_t)n * sizeof *out);
    memmove(qp->news, qp->news + n, (qp->news_count - (uint32_t)n) * sizeof *qp->news);
    qp->news_count -= (uint32_t)n;
    return n;
}

static void tell(sf_qp *qp, const struct sf_news *news) {
    qp->news[qp->news_count++] = *news; /* room checked before the switch began */
    qp->ctx->news = 1;
}

int sf_ctx_take_news(sf_ctx *ctx) {
    int news = ctx->news;
    ctx->news = 0;
    return news;
}

/* -- the work list ----------------------------------------------------------------------------------------- */

void sf_switch_want(sf_qp *qp, uint32_t why) {
    sf_ctx *ctx = qp->ctx;
    qp->wants |= why;
    if (qp->queued)
        return;
    qp->queued = 1;
    qp->next_work = NULL;
    if (ctx->work_tail)
        ctx->work_tail->next_work = qp;
    else
        ctx->work = qp;
    ctx->work_tail = qp;
}

void sf_switch_forget(sf_qp *qp) {
    sf_ctx *ctx = qp->ctx;
    if (!qp->queued)
        return;
    sf_qp *before = NULL;
    for (sf_qp *at = ctx->work; at; before = at, at = at->next_work)
        if (at == qp) {
            if (before)
                before->next_work = qp->next_work;
            else
                ctx->work = qp->next_work;
            if (ctx->work_tail == qp)
                ctx->work_tail = before;
            break;
        }
    qp->queued = 0;
}

/* The peer's count on `path`, not acted on here, to the failover layer as the completion it came in (the
 * ledger goes with it). */
static void count_to_python(sf_qp *qp, int path) {
    struct sc_wc wc = {.wr_id = SF_CONTROL_IDS + NOTIFY_RECV, .opcode = WCO_RECV_RDMA_WITH_IMM,
                       .qp_num = qp->qpn[path], .imm_data = qp->peer_count[path], .wc_flags = WC_FLAG_WITH_IMM};
    qp->counted &= ~bit(path);
    sf_qp_to_python(qp, path, &wc);
}

void sf_switch_export(sf_qp *qp) {
    sf_switch_forget(qp);
    for (int path = 0; path < qp->ctx->paths; path++)
        if (qp->counted & bit(path))
            count_to_python(qp, path);
    qp->wants = 0;
    qp->phase = SF_STEADY; /* a handshake begun here goes on in Python (its news told it where it is) */
}

/* -- posting a list on the new path -------------------------------------------------------------------------- */

/* Post the entries (all sends or all receives, in order) on the QP's path with its keys, as one list: one
 * lock and one write in the tcp transport. 0, or -1 when the backend refused one or memory ran out. */
static int post_entries(sf_qp *qp, struct sf_entry **entries, uint32_t n, int sends) {
    if (!n)
        return 0;
    uint32_t sges = 0;
    for (uint32_t i = 0; i < n; i++)
        sges += entries[i]->wr.num_sge;
    struct sc_send_wr *wrs = calloc(n, sizeof *wrs);
    struct sc_recv_wr *recvs = calloc(n, sizeof *recvs);
    struct sc_sge *room = calloc(sges ? sges : 1, sizeof *room);
    int failed = !wrs || !recvs || !room;
    for (uint32_t i = 0, at = 0; !failed && i < n; i++) {
        struct sf_entry *e = entries[i];
        const struct sc_sge *sg = sf_qp_on_path(qp, e->wr.sg, e->wr.num_sge, room + at);
        if (sg != room + at && e->wr.num_sge) /* the default path: the entry's own SGEs */
            memcpy(room + at, sg, e->wr.num_sge * sizeof *room);
        wrs[i] = e->wr;
        wrs[i].wr_id = e->id;
        wrs[i].send_flags |= SEND_SIGNALED;
        wrs[i].sg = room + at;
        if (qp->path && sf_remote_keyed(e->wr.opcode))
            sf_keymap_get(&qp->rkeys[qp->path], e->wr.rkey, &wrs[i].rkey); /* checked before the switch */
        recvs[i] = (struct sc_recv_wr){.wr_id = e->id, .num_sge = e->wr.num_sge, .sg = room + at};
        at += e->wr.num_sge;
        e->posted = 1;
    }
    int posted = 0;
    if (!failed)
        failed = (sends ? qp->ctx->dp->post_send(qp->on[qp->path], wrs, (int)n, &posted)
                        : qp->ctx->dp->post_recv(qp->on[qp->path], recvs, (int)n, &posted)) != SC_POST_OK;
    free(wrs);
    free(recvs);
    free(room);
    return failed ? -1 : 0;
}

/* The not-done entries of a queue, in order, into a new array (*n of them); NULL only without memory. */
static struct sf_entry **pending(struct sf_queue *q, uint32_t *n) {
    struct sf_entry **out = calloc(q->count ? q->count : 1, sizeof *out);
    *n = 0;
    for (uint32_t i = 0; out && i < q->count; i++) {
        struct sf_entry *e = sf_queue_at(q, i);
        if (!e->done)
            out[(*n)++] = e;
    }
    return out;
}

/* The QP cannot go on (a post on the new path refused, no memory): the failover layer fails it, as when
 * its CQ overflows. */
static void must_fail(sf_qp *qp) {
    qp->mode = SF_MODE_PYTHON;
    qp->phase = SF_STEADY;
    struct sf_deferred item = {.kind = SF_DEFER_OVERFLOW, .wc = {.qp_num = qp->qpn[0]}};
    sf_ctx_defer(qp->ctx, &item);
}

/* -- the switch ------------------------------------------------------------------------------------------------ */

/* Whether everything outstanding can go to backup `to` from here (else the failover layer switches). */
static int can_go(sf_qp *qp, int to) {
    if (to <= 0 || to >= qp->ctx->paths || !(qp->armed & bit(to)) || !qp->on[to] ||
        qp->news_count + 2 > SF_NEWS_MAX || qp->mode != SF_MODE_FAST || qp->phase != SF_STEADY)
        return 0;
    for (uint32_t i = 0; i < qp->sq.count; i++) {
        struct sf_entry *e = sf_queue_at(&qp->sq, i);
        uint32_t key;
        if (e->done)
            continue;
        if (e->inline_len || (sf_remote_keyed(e->wr.opcode) && !sf_keymap_get(&qp->rkeys[to], e->wr.rkey, &key)))
            return 0;
    }
    return 1;
}

/* The first armed path other than the one in use whose link is not seen down: where a failure goes. */
static int escape(sf_qp *qp) {
    for (int path = 0; path < qp->ctx->paths; path++)
        if (path != qp->path && (qp->armed & bit(path)) && !sf_ctx_link_is_down(qp->ctx, path))
            return path;
    return -1;
}

static void resume(sf_qp *qp);

static void switch_to(sf_qp *qp, int to, uint32_t reason) {
    sf_ctx *ctx = qp->ctx;
    int left = qp->path;
    struct sf_news news = {.kind = SF_NEWS_SWITCHED, .left = (uint32_t)left, .to = (uint32_t)to, .reason = reason,
                           .at_ns = sf_now_ns()};
    qp->phase = SF_STOPPING;
    sf_ctx_heat_backups(ctx); /* the peer's count and the replay's acks come on the backup paths */
    ctx->dp->qp_to_err(qp->on[left]); /* nothing more lands on the old path: our receive count is final */
    sf_ctx_drain_cq(ctx, qp->send_cq->on[left], left);
    sf_ctx_drain_cq(ctx, left ? ctx->control[left] : qp->recv_cq->on[left], left); /* where its receives complete */
    if (qp->mode != SF_MODE_FAST) {
        qp->phase = SF_STEADY;
        return; /* its CQ overflowed meanwhile: the failover layer fails it */
    }
    news.stopped_ns = sf_now_ns();
    qp->path = to;
    qp->armed &= ~bit(left);
    qp->counted &= ~bit(left); /* a count on the path left belongs to a handshake that is over */
    uint32_t n;
    struct sf_entry **receives = pending(&qp->rq, &n);
    if (!receives || post_entries(qp, receives, n, 0)) {
        free(receives);
        must_fail(qp);
        return;
    }
    free(receives);
    news.moved = n;
    struct sc_send_wr count = {.wr_id = SF_CONTROL_IDS + NOTIFY_SEND, .opcode = WR_RDMA_WRITE_IMM,
                               .send_flags = SEND_SIGNALED, .imm_data = (uint32_t)qp->received & COUNT_MASK,
                               .rkey = qp->target_rkey[to], .remote_addr = qp->target_addr[to]};
    int posted = 0;
    news.then_ns = sf_now_ns();
    if (ctx->dp->post_send(qp->on[to], &count, 1, &posted) != SC_POST_OK) {
        must_fail(qp);
        return;
    }
    qp->phase = SF_HANDSHAKE;
    sf_ctx_heat_backups(ctx); /* the peer's count comes there: every pass reads it meanwhile */
    tell(qp, &news);
    if (qp->counted & bit(to))
        resume(qp);
}

/* The completion of a send that finished without one of its own on the path in use. */
static void settle(sf_qp *qp, struct sf_entry *e, uint32_t status) {
    static const uint32_t opcodes[] = {
        [WR_RDMA_WRITE] = WCO_RDMA_WRITE, [WR_RDMA_WRITE_IMM] = WCO_RDMA_WRITE, [WR_SEND] = WCO_SEND,
        [WR_SEND_IMM] = WCO_SEND,         [WR_RDMA_READ] = WCO_RDMA_READ,       [WR_CMP_SWP] = WCO_COMP_SWAP,
        [WR_FETCH_ADD] = WCO_FETCH_ADD,
    };
    uint32_t length = 0;
    for (uint32_t i = 0; i < e->wr.num_sge; i++)
        length += e->wr.sg[i].length;
    e->done = 1;
    e->wc = (struct sc_wc){.wr_id = e->wr.wr_id, .status = status, .qp_num = qp->qpn[0], .byte_len = length,
                           .opcode = e->wr.opcode <= WR_FETCH_ADD ? opcodes[e->wr.opcode] : WCO_SEND};
}

static void resume(sf_qp *qp) {
    struct sf_news news = {.kind = SF_NEWS_RESUMED, .left = (uint32_t)qp->path, .to = (uint32_t)qp->path,
                           .at_ns = qp->counted_at[qp->path]};
    qp->counted &= ~bit(qp->path);
    /* the peer's full count from its low 32 bits: it lies within our two-sided sends */
    int64_t has = qp->sent_two_sided - (int64_t)(uint32_t)((uint64_t)qp->sent_two_sided - qp->peer_count[qp->path]);
    uint32_t n, replays = 0;
    struct sf_entry **sends = pending(&qp->sq, &n);
    if (!sends) {
        must_fail(qp);
        return;
    }
    int64_t last = -1; /* the last pending send the peer has received */
    for (uint32_t i = 0; i < n; i++)
        if (sends[i]->index >= 0 && sends[i]->index < has)
            last = i;
    for (uint32_t i = 0; i < n; i++) {
        struct sf_entry *e = sends[i];
        if (e->wr.opcode == WR_CMP_SWP || e->wr.opcode == WR_FETCH_ADD)
            settle(qp, e, e->failed_with ? e->failed_with : WC_WR_FLUSH_ERR);
        else if ((int64_t)i <= last && e->wr.opcode != WR_RDMA_READ)
            settle(qp, e, WC_SUCCESS);
        else {
            news.moved += e->posted; /* posted before, on a path since stopped */
            sends[replays++] = e;
        }
    }
    int failed = post_entries(qp, sends, replays, 1);
    free(sends);
    if (failed) {
        must_fail(qp);
        return;
    }
    news.then_ns = sf_now_ns();
    qp->phase = SF_STEADY;
    tell(qp, &news);
    sf_qp_release(qp);
}

/* -- what starts one ----------------------------------------------------------------------------------------- */

int sf_switch_control(sf_qp *qp, int path, const struct sc_wc *wc) {
    uint64_t which = wc->wr_id - SF_CONTROL_IDS;
    if (qp->phase == SF_STOPPING && path == qp->path)
        return 1; /* the path being left: its handshake is over, its flushes expected */
    if (wc->status)
        return path != qp->path && !(qp->armed & bit(path)); /* on a path already left: nothing new */
    if (which == NOTIFY_SEND)
        return 1; /* our count went out */
    if (which != NOTIFY_RECV)
        return 0; /* the re-arm protocol's messages and probes */
    if (path == qp->path && qp->phase == SF_STEADY)
        return 1; /* a count on the path in use outside a handshake: nothing to settle */
    int follows = qp->phase == SF_STEADY && can_go(qp, path); /* the peer moved there: follow it */
    int resumes = qp->phase == SF_HANDSHAKE && path == qp->path;
    if (!follows && !resumes)
        return 0;
    qp->peer_count[path] = wc->imm_data;
    qp->counted_at[path] = sf_now_ns();
    qp->counted |= bit(path);
    sf_switch_want(qp, SF_WANT_COUNT);
    return 1;
}

/* The links seen down since the last pass: every fast-mode QP on one of them is to leave it. */
static void links_seen(sf_ctx *ctx) {
    uint32_t down = __atomic_load_n(&ctx->links_down, __ATOMIC_ACQUIRE);
    uint32_t fresh = down & ~ctx->links_acted;
    if (!fresh)
        return;
    ctx->links_acted = down;
    for (uint32_t i = 0; i < ctx->table_cap; i++) {
        sf_qp *qp = ctx->table[i].qp;
        if (qp && ctx->table[i].key >> 24 == 0 && (fresh & bit(qp->path))) /* each QP once: by its default QPN */
            sf_switch_want(qp, SF_WANT_LEAVE);
    }
}

static void act(sf_qp *qp) {
    uint32_t wants = qp->wants;
    qp->wants = 0;
    if (qp->mode != SF_MODE_FAST)
        return; /* the failover layer's meanwhile: the event reaches it too */
    if (qp->phase == SF_HANDSHAKE && (qp->counted & bit(qp->path))) {
        resume(qp);
        return;
    }
    if (qp->phase != SF_STEADY)
        return;
    if ((wants & SF_WANT_LEAVE) && sf_ctx_link_is_down(qp->ctx, qp->path)) {
        int to = escape(qp);
        if (to > 0 && can_go(qp, to))
            switch_to(qp, to, SF_REASON_NIC_EVENT);
        return; /* else no backup here, or a failback's path: the failover layer's, when the event reaches it */
    }
    for (int path = 1; path < qp->ctx->paths; path++)
        if ((qp->counted & bit(path)) && path != qp->path) {
            if (can_go(qp, path))
                switch_to(qp, path, SF_REASON_PEER);
            else /* no longer possible here (a post since needs a key looked up): the failover layer's */
                count_to_python(qp, path);
            return;
        }
}

void sf_switch_work(sf_ctx *ctx) {
    links_seen(ctx);
    sf_qp *qp;
    while ((qp = ctx->work)) {
        ctx->work = qp->next_work;
        if (!ctx->work)
            ctx->work_tail = NULL;
        qp->queued = 0;
        act(qp);
    }
}
