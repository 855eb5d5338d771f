/* The fast path's context: which QP a provider completion belongs to, the CQs a pass of progress reads,
 * the backup paths' schedule, and the deferred queue of what Python must see. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fast_internal.h"
#include "priority.h"

int64_t sf_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

sf_ctx *sf_ctx_new(const struct sc_dp *dp, int paths) {
    if (paths < 1 || paths > SF_PATHS)
        return NULL;
    sf_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return NULL;
    if (sc_mutex_init(&ctx->lock, 1)) {
        free(ctx);
        return NULL;
    }
    ctx->dp = dp;
    ctx->paths = paths;
    return ctx;
}

void sf_ctx_lock(sf_ctx *ctx) { pthread_mutex_lock(&ctx->lock); }

void sf_ctx_unlock(sf_ctx *ctx) { pthread_mutex_unlock(&ctx->lock); }

void sf_ctx_links_act(void *arg) {
    sf_ctx *ctx = arg;
    pthread_mutex_lock(&ctx->lock);
    sf_switch_work(ctx);
    pthread_mutex_unlock(&ctx->lock);
}

void sf_ctx_free(sf_ctx *ctx) {
    if (!ctx)
        return;
    free(ctx->cqs);
    free(ctx->table);
    free(ctx->deferred);
    for (int path = 0; path < SF_PATHS; path++)
        sf_keymap_fini(&ctx->lkeys[path]);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

void sf_ctx_set_control(sf_ctx *ctx, int path, void *cq) {
    if (path > 0 && path < ctx->paths)
        ctx->control[path] = cq;
}

int sf_ctx_set_lkey(sf_ctx *ctx, int path, uint32_t lkey, uint32_t path_lkey) {
    if (path <= 0 || path >= ctx->paths)
        return -1;
    return sf_keymap_set(&ctx->lkeys[path], lkey, path_lkey);
}

void sf_ctx_drop_lkey(sf_ctx *ctx, int path, uint32_t lkey) {
    if (path > 0 && path < ctx->paths)
        sf_keymap_del(&ctx->lkeys[path], lkey);
}

int sf_ctx_lkey(const sf_ctx *ctx, int path, uint32_t lkey, uint32_t *path_lkey) {
    return path > 0 && path < ctx->paths && sf_keymap_get(&ctx->lkeys[path], lkey, path_lkey);
}

/* -- the QP table ---------------------------------------------------------------------------------------- */

static uint32_t key_of(int path, uint32_t qpn) { return (uint32_t)path << 24 | (qpn & 0xFFFFFF); }

static struct sf_qp_slot *slot_of(sf_ctx *ctx, uint32_t key) {
    uint32_t mask = ctx->table_cap - 1;
    for (uint32_t i = (key * 2654435761u) & mask;; i = (i + 1) & mask)
        if (ctx->table[i].key == key || ctx->table[i].key == 0)
            return &ctx->table[i];
}

static int grow_table(sf_ctx *ctx) {
    struct sf_qp_slot *old = ctx->table;
    uint32_t old_cap = ctx->table_cap;
    uint32_t cap = old_cap ? old_cap * 2 : 64;
    ctx->table = calloc(cap, sizeof *ctx->table);
    if (!ctx->table) {
        ctx->table = old;
        return -1;
    }
    ctx->table_cap = cap;
    ctx->table_used = 0;
    for (uint32_t i = 0; i < old_cap; i++)
        if (old[i].qp) { /* removed slots are left behind */
            *slot_of(ctx, old[i].key) = old[i];
            ctx->table_used++;
        }
    free(old);
    return 0;
}

sf_qp *sf_ctx_lookup(sf_ctx *ctx, int path, uint32_t qpn) {
    if (!ctx->table_cap)
        return NULL;
    return slot_of(ctx, key_of(path, qpn))->qp;
}

int sf_ctx_register(sf_ctx *ctx, int path, uint32_t qpn, sf_qp *qp) {
    if ((ctx->table_used + 1) * 2 > ctx->table_cap && grow_table(ctx))
        return -1;
    struct sf_qp_slot *slot = slot_of(ctx, key_of(path, qpn));
    if (slot->key == 0)
        ctx->table_used++;
    slot->key = key_of(path, qpn);
    slot->qp = qp;
    return 0;
}

void sf_ctx_unregister(sf_ctx *ctx, int path, uint32_t qpn) {
    if (ctx->table_cap)
        slot_of(ctx, key_of(path, qpn))->qp = NULL; /* the key stays: later probes go past it */
}

/* -- the CQs a pass reads ----------------------------------------------------------------------------------- */

int sf_ctx_add_cq(sf_ctx *ctx, sf_cq *cq) {
    if (ctx->ncqs == ctx->cqs_cap) {
        uint32_t cap = ctx->cqs_cap ? ctx->cqs_cap * 2 : 8;
        sf_cq **grown = realloc(ctx->cqs, cap * sizeof *grown);
        if (!grown)
            return -1;
        ctx->cqs = grown;
        ctx->cqs_cap = cap;
    }
    ctx->cqs[ctx->ncqs++] = cq;
    return 0;
}

void sf_ctx_remove_cq(sf_ctx *ctx, sf_cq *cq) {
    for (uint32_t i = 0; i < ctx->ncqs; i++)
        if (ctx->cqs[i] == cq) {
            memmove(&ctx->cqs[i], &ctx->cqs[i + 1], (ctx->ncqs - i - 1) * sizeof *ctx->cqs);
            ctx->ncqs--;
            return;
        }
}

/* -- the deferred queue ------------------------------------------------------------------------------------- */

int sf_ctx_defer(sf_ctx *ctx, const struct sf_deferred *item) {
    if (ctx->deferred_count == ctx->deferred_cap) {
        uint32_t cap = ctx->deferred_cap ? ctx->deferred_cap * 2 : 64;
        struct sf_deferred *grown = malloc(cap * sizeof *grown);
        if (!grown)
            return -1;
        for (uint32_t i = 0; i < ctx->deferred_count; i++)
            grown[i] = ctx->deferred[(ctx->deferred_head + i) % ctx->deferred_cap];
        free(ctx->deferred);
        ctx->deferred = grown;
        ctx->deferred_cap = cap;
        ctx->deferred_head = 0;
    }
    ctx->deferred[(ctx->deferred_head + ctx->deferred_count++) % ctx->deferred_cap] = *item;
    return 0;
}

int sf_ctx_next_deferred(sf_ctx *ctx, struct sf_deferred *out) {
    if (!ctx->deferred_count)
        return 0;
    *out = ctx->deferred[ctx->deferred_head];
    ctx->deferred_head = (ctx->deferred_head + 1) % ctx->deferred_cap;
    ctx->deferred_count--;
    return 1;
}

int sf_ctx_has_deferred(const sf_ctx *ctx) { return ctx->deferred_count > 0; }

int sf_ctx_next_deferred_on(sf_ctx *ctx, int path, uint32_t qpn, struct sf_deferred *out) {
    uint32_t cap = ctx->deferred_cap;
    for (uint32_t i = 0; i < ctx->deferred_count; i++) {
        struct sf_deferred *item = &ctx->deferred[(ctx->deferred_head + i) % cap];
        if (item->kind != SF_DEFER_WC || item->path != (uint32_t)path || item->wc.qp_num != qpn)
            continue;
        *out = *item;
        for (uint32_t j = i; j + 1 < ctx->deferred_count; j++) /* close the gap: the rest keep their order */
            ctx->deferred[(ctx->deferred_head + j) % cap] = ctx->deferred[(ctx->deferred_head + j + 1) % cap];
        ctx->deferred_count--;
        return 1;
    }
    return 0;
}

int sf_ctx_backup_hot(const sf_ctx *ctx) { return sf_now_ns() < ctx->backup_hot; }

void sf_ctx_heat_backups(sf_ctx *ctx) {
    int64_t now = sf_now_ns();
    ctx->backup_hot = now + SF_BACKUP_HOT_NS;
    ctx->looking_until = now + SF_SWITCH_LOOK_NS;
}

/* -- progress ----------------------------------------------------------------------------------------------- */

typedef int (*take_fn)(void *cq, int n, struct sc_wc *out);

/* Every completion of one provider CQ to its QP, taken by `take`: driving its transport (a poll, a look) or
 * taking only what its progress thread has made (a peek); 1 if any came, -1 if the CQ overflowed. */
static int drain(sf_ctx *ctx, void *provider_cq, int path, take_fn take) {
    /* a switch made during the pass drains the path it leaves: its completions come here again, never a
     * switch inside another one (sf_qp_complete only queues work) */
    struct sc_wc wcs[SF_POLL_BATCH];
    int got = 0, n;
    if (!provider_cq)
        return 0;
    do {
        n = take(provider_cq, SF_POLL_BATCH, wcs);
        if (n < 0)
            return -1;
        for (int i = 0; i < n; i++) {
            sf_qp *qp = sf_ctx_lookup(ctx, path, wcs[i].qp_num);
            if (qp)
                sf_qp_complete(qp, path, &wcs[i]);
        }
        got |= n > 0;
    } while (n == SF_POLL_BATCH);
    return got;
}

int sf_ctx_drain_cq(sf_ctx *ctx, void *provider_cq, int path) {
    return drain(ctx, provider_cq, path, ctx->dp->cq_poll);
}

int sf_ctx_drain(sf_ctx *ctx, sf_cq *cq, int path) {
    if (path < 0 || path >= ctx->paths)
        return 0;
    int got = drain(ctx, cq ? cq->on[path] : ctx->control[path], path, ctx->dp->cq_poll);
    sf_switch_work(ctx); /* a peer's count taken here must not wait for the next pass */
    return got;
}

void sf_ctx_controls_act(void *arg) {
    sf_ctx *ctx = arg;
    pthread_mutex_lock(&ctx->lock);
    for (int path = 1; path < ctx->paths; path++)
        drain(ctx, ctx->control[path], path, ctx->dp->cq_peek); /* made by the thread calling */
    sf_switch_work(ctx);
    pthread_mutex_unlock(&ctx->lock);
}

uint32_t *sf_ctx_link_word(sf_ctx *ctx) { return &ctx->links_down; }

void sf_ctx_link_down(sf_ctx *ctx, int path) {
    if (path >= 0 && path < ctx->paths)
        __atomic_fetch_or(&ctx->links_down, 1u << path, __ATOMIC_RELEASE);
}

int sf_ctx_link_is_down(const sf_ctx *ctx, int path) {
    return path >= 0 && path < ctx->paths && (__atomic_load_n(&ctx->links_down, __ATOMIC_ACQUIRE) >> path & 1);
}

void sf_ctx_link_up(sf_ctx *ctx, int path) {
    if (path < 0 || path >= ctx->paths)
        return;
    __atomic_fetch_and(&ctx->links_down, ~(1u << path), __ATOMIC_RELEASE);
    ctx->links_acted &= ~(1u << path);
}

int sf_ctx_progress(sf_ctx *ctx, int everything) {
    int64_t now = sf_now_ns();
    /* the backup paths: in a switch's first moments (and for the watchers), looked at: a pass that leaves
     * their progress threads awake, so that either thread takes the peer's count and the replay's acks
     * the moment it can, where a drive would park the thread for SC_DRIVE_GRACE_NS and leave them to the
     * caller's next poll; then, while hot, driven (the caller moves the traffic on its own thread, the
     * progress thread not woken per frame); else only what their progress threads have made (a peer's
     * count, an error) is taken, which costs a lock */
    take_fn backup = ctx->dp->cq_peek;
    if (ctx->paths > 1 && (everything || now < ctx->looking_until))
        backup = ctx->dp->cq_look;
    else if (ctx->paths > 1 && now < ctx->backup_hot)
        backup = ctx->dp->cq_poll;
    int moved = 0, overflow = 0, got;
    for (uint32_t i = 0; i < ctx->ncqs; i++) {
        sf_cq *cq = ctx->cqs[i];
        overflow |= drain(ctx, cq->on[0], 0, ctx->dp->cq_poll) < 0;
        for (int path = 1; path < ctx->paths; path++) {
            got = drain(ctx, cq->on[path], path, backup);
            overflow |= got < 0;
            moved |= got > 0;
        }
    }
    for (int path = 1; path < ctx->paths; path++) {
        got = drain(ctx, ctx->control[path], path, backup);
        overflow |= got < 0;
        moved |= got > 0;
    }
    if (moved)
        ctx->backup_hot = now + SF_BACKUP_HOT_NS;
    sf_switch_work(ctx);
    return overflow ? -1 : 0;
}
