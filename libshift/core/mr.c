/* Protection domains, memory regions and their keys: every access a transfer makes is looked up here.
 *
 * Keys are random nonzero 32-bit numbers, unique in the context, so that a stale or guessed key is very
 * unlikely to name an MR. An MR is referenced by the key table while registered and by every span that
 * points into it, so a transfer under way when the application deregisters never writes freed memory.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "internal.h"

static uint32_t bucket(uint32_t key) { return (key * 2654435761u) >> 20; } /* 12 bits: SC_KEY_BUCKETS */

static struct sc_mr *find_lkey(struct sc_ctx *ctx, uint32_t key) {
    for (struct sc_mr *mr = ctx->keys_l[bucket(key)]; mr; mr = mr->next_lkey)
        if (mr->lkey == key) return mr;
    return NULL;
}

static struct sc_mr *find_rkey(struct sc_ctx *ctx, uint32_t key) {
    for (struct sc_mr *mr = ctx->keys_r[bucket(key)]; mr; mr = mr->next_rkey)
        if (mr->rkey == key) return mr;
    return NULL;
}

static uint32_t new_key(struct sc_ctx *ctx) {
    for (;;) {
        uint32_t key = 0;
        if (getrandom(&key, sizeof key, 0) != (ssize_t)sizeof key) key = (uint32_t)rand();
        if (key && !find_lkey(ctx, key) && !find_rkey(ctx, key)) return key;
    }
}

sc_pd *sc_pd_new(sc_ctx *ctx) {
    sc_pd *pd = calloc(1, sizeof *pd);
    if (!pd) return NULL;
    pthread_mutex_lock(&ctx->lock);
    pd->ctx = ctx;
    pd->id = ++ctx->next_pd;
    pd->next = ctx->pds;
    if (ctx->pds) ctx->pds->prev = pd;
    ctx->pds = pd;
    pthread_mutex_unlock(&ctx->lock);
    return pd;
}

static void unregister(struct sc_mr *mr) {
    struct sc_ctx *ctx = mr->ctx;
    if (!mr->registered) return;
    mr->registered = 0;
    struct sc_mr **at = &ctx->keys_l[bucket(mr->lkey)];
    while (*at != mr) at = &(*at)->next_lkey;
    *at = mr->next_lkey;
    at = &ctx->keys_r[bucket(mr->rkey)];
    while (*at != mr) at = &(*at)->next_rkey;
    *at = mr->next_rkey;
    mr->refs--;
}

void sc_pd_free(sc_pd *pd) {
    struct sc_ctx *ctx = pd->ctx;
    pthread_mutex_lock(&ctx->lock);
    for (struct sc_mr *mr = ctx->mrs; mr; mr = mr->next)
        if (mr->pd_id == pd->id) unregister(mr);
    if (pd->prev) pd->prev->next = pd->next;
    else ctx->pds = pd->next;
    if (pd->next) pd->next->prev = pd->prev;
    pthread_mutex_unlock(&ctx->lock);
    free(pd);
}

sc_mr *sc_mr_reg(sc_pd *pd, void *addr, uint64_t length, uint32_t access) {
    struct sc_ctx *ctx = pd->ctx;
    sc_mr *mr = calloc(1, sizeof *mr);
    if (!mr) return NULL;
    pthread_mutex_lock(&ctx->lock);
    mr->ctx = ctx;
    mr->pd_id = pd->id;
    mr->addr = addr;
    mr->length = length;
    mr->access = access;
    mr->lkey = new_key(ctx);
    mr->next_lkey = ctx->keys_l[bucket(mr->lkey)];
    ctx->keys_l[bucket(mr->lkey)] = mr;
    mr->rkey = new_key(ctx);
    mr->next_rkey = ctx->keys_r[bucket(mr->rkey)];
    ctx->keys_r[bucket(mr->rkey)] = mr;
    mr->registered = 1;
    mr->refs = 1;
    mr->next = ctx->mrs;
    if (ctx->mrs) ctx->mrs->prev = mr;
    ctx->mrs = mr;
    pthread_mutex_unlock(&ctx->lock);
    return mr;
}

uint32_t sc_mr_lkey(const sc_mr *mr) { return mr->lkey; }

uint32_t sc_mr_rkey(const sc_mr *mr) { return mr->rkey; }

void sc_mr_dereg(sc_mr *mr) {
    pthread_mutex_lock(&mr->ctx->lock);
    unregister(mr);
    pthread_mutex_unlock(&mr->ctx->lock);
}

static void unlink_mr(struct sc_mr *mr) {
    struct sc_ctx *ctx = mr->ctx;
    if (mr->prev) mr->prev->next = mr->next;
    else ctx->mrs = mr->next;
    if (mr->next) mr->next->prev = mr->prev;
}

int sc_mr_try_free(sc_mr *mr) {
    struct sc_ctx *ctx = mr->ctx;
    pthread_mutex_lock(&ctx->lock);
    unregister(mr);
    int idle = mr->refs == 0;
    if (idle) unlink_mr(mr);
    pthread_mutex_unlock(&ctx->lock);
    if (idle) free(mr);
    return idle;
}

void sc_mr_free_all(struct sc_ctx *ctx) {
    while (ctx->pds) {
        struct sc_pd *pd = ctx->pds;
        ctx->pds = pd->next;
        free(pd);
    }
    while (ctx->mrs) {
        struct sc_mr *mr = ctx->mrs;
        ctx->mrs = mr->next;
        free(mr);
    }
}

struct sc_mr *sc_mr_local(struct sc_ctx *ctx, uint32_t pd_id, uint32_t lkey) {
    struct sc_mr *mr = find_lkey(ctx, lkey);
    return mr && mr->pd_id == pd_id ? mr : NULL;
}

struct sc_mr *sc_mr_remote(struct sc_ctx *ctx, uint32_t pd_id, uint32_t rkey) {
    struct sc_mr *mr = find_rkey(ctx, rkey);
    return mr && mr->pd_id == pd_id ? mr : NULL;
}

int sc_mr_span(struct sc_mr *mr, uint64_t addr, uint64_t len, struct sc_span *out) {
    uint64_t base = (uint64_t)(uintptr_t)mr->addr;
    if (addr < base || len > mr->length || addr - base > mr->length - len || len > UINT32_MAX) return 0;
    out->ptr = mr->addr + (addr - base);
    out->len = (uint32_t)len;
    out->mr = mr;
    mr->refs++;
    return 1;
}

void sc_mr_put(struct sc_mr *mr) { mr->refs--; }

struct sc_span *sc_spans_alloc(struct sc_spans *spans, uint32_t count) {
    spans->count = 0;
    if (count <= SC_INLINE_SPANS) {
        spans->at = spans->inline_at;
        return spans->at;
    }
    spans->at = calloc(count, sizeof *spans->at);
    return spans->at;
}

void sc_spans_release(struct sc_spans *spans) {
    for (uint32_t i = 0; i < spans->count; i++)
        if (spans->at[i].mr) sc_mr_put(spans->at[i].mr);
    if (spans->at && spans->at != spans->inline_at) free(spans->at);
    spans->at = NULL;
    spans->count = 0;
}
