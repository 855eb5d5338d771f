/* The application's CQ of the fast path: completions released by its QPs, held to its cqe as an RNIC's
 * CQ is (past it the CQ has overflowed for good), and the arming of its channel. */
#include <stdlib.h>

#include "fast_internal.h"

sf_cq *sf_cq_new(sf_ctx *ctx, uint32_t cqe, void *const *path_cqs, uint64_t cookie, sf_chan *chan) {
    sf_cq *cq = calloc(1, sizeof *cq);
    if (!cq)
        return NULL;
    cq->ctx = ctx;
    cq->cqe = cqe ? cqe : 1;
    cq->cookie = cookie;
    cq->chan = chan;
    for (int path = 0; path < ctx->paths; path++)
        cq->on[path] = path_cqs[path];
    cq->ready = calloc(cq->cqe, sizeof *cq->ready);
    if (!cq->ready || sf_ctx_add_cq(ctx, cq)) {
        free(cq->ready);
        free(cq);
        return NULL;
    }
    return cq;
}

void sf_cq_free(sf_cq *cq) {
    if (!cq)
        return;
    sf_ctx_remove_cq(cq->ctx, cq);
    free(cq->ready);
    free(cq);
}

int sf_cq_push(sf_cq *cq, const struct sc_wc *wc) {
    if (cq->overflowed || cq->count >= cq->cqe)
        cq->overflowed = 1;
    else
        cq->ready[(cq->head + cq->count++) % cq->cqe] = *wc;
    if (cq->armed && cq->chan) /* an overflow too: a waiter must wake to meet the error */
        sf_chan_raise(cq->chan, cq->cookie);
    cq->armed = 0;
    return cq->overflowed ? -1 : 0;
}

int sf_cq_take(sf_cq *cq, int n, struct sc_wc *out) {
    if (cq->overflowed)
        return -1;
    int got = 0;
    while (got < n && cq->count) {
        out[got++] = cq->ready[cq->head];
        cq->head = (cq->head + 1) % cq->cqe;
        cq->count--;
    }
    return got;
}

uint32_t sf_cq_ready(const sf_cq *cq) { return cq->count; }

void sf_cq_arm(sf_cq *cq) { cq->armed = 1; }
