/* The context's timers: a binary min-heap of the QPs that have one armed, keyed by each QP's earliest.
 *
 * A QP has three timers (ack deadline, RNR retry, delayed ACK) and sits in the heap at most once, so a pass
 * finds what is due in O(1) and fires each due QP in O(log n), whatever the number of idle QPs. Every timer
 * is set through sc_timer_set, which keeps the heap in order. The heap has room for every QP of the context
 * (sc_timers_reserve at sc_qp_new), so arming a timer never allocates and never fails.
 */
#include <stdlib.h>

#include "internal.h"

static int64_t earliest(const struct sc_qp *qp) {
    int64_t due = 0;
    for (int i = 0; i < SC_NTIMERS; i++)
        if (qp->timer[i] && (!due || qp->timer[i] < due)) due = qp->timer[i];
    return due;
}

static void place(struct sc_ctx *ctx, uint32_t pos, struct sc_qp *qp) {
    ctx->heap[pos] = qp;
    qp->heap_pos = pos + 1;
}

static void sift_up(struct sc_ctx *ctx, uint32_t pos) {
    struct sc_qp *qp = ctx->heap[pos];
    while (pos > 0) {
        uint32_t parent = (pos - 1) / 2;
        if (ctx->heap[parent]->due <= qp->due) break;
        place(ctx, pos, ctx->heap[parent]);
        pos = parent;
    }
    place(ctx, pos, qp);
}

static void sift_down(struct sc_ctx *ctx, uint32_t pos) {
    struct sc_qp *qp = ctx->heap[pos];
    for (;;) {
        uint32_t child = 2 * pos + 1;
        if (child >= ctx->heap_len) break;
        if (child + 1 < ctx->heap_len && ctx->heap[child + 1]->due < ctx->heap[child]->due) child++;
        if (qp->due <= ctx->heap[child]->due) break;
        place(ctx, pos, ctx->heap[child]);
        pos = child;
    }
    place(ctx, pos, qp);
}

static void heap_remove(struct sc_ctx *ctx, struct sc_qp *qp) {
    uint32_t pos = qp->heap_pos - 1;
    qp->heap_pos = 0;
    struct sc_qp *last = ctx->heap[--ctx->heap_len];
    if (last == qp) return;
    place(ctx, pos, last);
    sift_down(ctx, pos);
    sift_up(ctx, last->heap_pos - 1);
}

int sc_timers_reserve(struct sc_ctx *ctx, uint32_t qps) {
    if (qps <= ctx->heap_cap) return 1;
    uint32_t cap = ctx->heap_cap ? ctx->heap_cap : 64;
    while (cap < qps) cap *= 2;
    struct sc_qp **grown = realloc(ctx->heap, cap * sizeof *grown);
    if (!grown) return 0;
    ctx->heap = grown;
    ctx->heap_cap = cap;
    return 1;
}

void sc_timer_set(struct sc_qp *qp, int which, int64_t due) {
    struct sc_ctx *ctx = qp->ctx;
    qp->timer[which] = due;
    int64_t before = qp->due;
    qp->due = earliest(qp);
    if (qp->due == before) return;
    if (!qp->due) heap_remove(ctx, qp);
    else if (!qp->heap_pos) {
        ctx->heap[ctx->heap_len++] = qp; /* room was reserved for every QP */
        sift_up(ctx, ctx->heap_len - 1);
    } else if (qp->due < before) sift_up(ctx, qp->heap_pos - 1);
    else sift_down(ctx, qp->heap_pos - 1);
    /* the progress thread's wait must end by the new deadline: its timerfd says when, without waking it */
    if (qp->due && ctx->sleep_until && qp->due < ctx->sleep_until) {
        sc_engine_arm(ctx, qp->due);
        ctx->sleep_until = qp->due;
    }
}

int64_t sc_timers_first(const struct sc_ctx *ctx) { return ctx->heap_len ? ctx->heap[0]->due : 0; }

void sc_timers_fire(struct sc_ctx *ctx, int64_t now) {
    /* a handler arms its next timer after now, so each QP is fired once; the bound is a second guard */
    for (uint32_t n = ctx->heap_len; n && ctx->heap_len && ctx->heap[0]->due <= now; n--)
        sc_qp_fire_timers(ctx->heap[0], now);
}
