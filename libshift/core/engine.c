/* The context and its progress: one epoll set, one lock, one thread, and passes on callers' threads.
 *
 * The progress thread waits in epoll until a socket is ready or the first timer falls due, then makes a
 * pass under the lock. A caller whose poll finds its CQ empty makes a non-blocking pass itself, so a busy
 * poller reads its own socket with no hand-off between threads. Both may see the same readiness; the
 * second finds nothing to read. An epoll entry names a watch slot with a generation, never a pointer, so
 * an event that arrives for a connection closed in the meantime is recognised and dropped.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define MAX_EVENTS 64

int64_t sc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint32_t slot_of(uint64_t watch) { return (uint32_t)(watch >> 32); }

uint64_t sc_watch_add(struct sc_ctx *ctx, int fd, int kind, void *obj, int want_write) {
    uint32_t slot = 1; /* slot 0 is never used: a watch of 0 means none */
    while (slot < ctx->nwatches && ctx->watches[slot].kind != WATCH_FREE) slot++;
    if (slot >= ctx->nwatches) {
        uint32_t size = ctx->nwatches ? ctx->nwatches * 2 : 64;
        struct sc_watch *grown = realloc(ctx->watches, size * sizeof *grown);
        if (!grown) return 0;
        memset(grown + ctx->nwatches, 0, (size - ctx->nwatches) * sizeof *grown);
        ctx->watches = grown;
        slot = ctx->nwatches ? ctx->nwatches : 1;
        ctx->nwatches = size;
    }
    struct sc_watch *w = &ctx->watches[slot];
    w->gen++;
    w->kind = kind;
    w->obj = obj;
    uint64_t watch = ((uint64_t)slot << 32) | w->gen;
    struct epoll_event ev = {.events = EPOLLIN | (want_write ? EPOLLOUT : 0), .data.u64 = watch};
    if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        w->kind = WATCH_FREE;
        return 0;
    }
    return watch;
}

void sc_watch_mod(struct sc_ctx *ctx, int fd, uint64_t watch, int want_write) {
    struct epoll_event ev = {.events = EPOLLIN | (want_write ? EPOLLOUT : 0), .data.u64 = watch};
    epoll_ctl(ctx->epfd, EPOLL_CTL_MOD, fd, &ev);
}

void sc_watch_del(struct sc_ctx *ctx, int fd, uint64_t watch) {
    if (!watch) return;
    epoll_ctl(ctx->epfd, EPOLL_CTL_DEL, fd, NULL);
    struct sc_watch *w = &ctx->watches[slot_of(watch)];
    w->kind = WATCH_FREE;
    w->obj = NULL;
}

void sc_engine_wake(struct sc_ctx *ctx) {
    uint64_t one = 1;
    while (write(ctx->wakefd, &one, sizeof one) < 0 && errno == EINTR) {
    }
}

static void dispatch(struct sc_ctx *ctx, const struct epoll_event *events, int n, int progress_thread) {
    for (int i = 0; i < n; i++) {
        uint64_t watch = events[i].data.u64;
        uint32_t slot = slot_of(watch);
        if (slot == 0 || slot >= ctx->nwatches) continue;
        struct sc_watch *w = &ctx->watches[slot];
        if (w->gen != (uint32_t)watch) continue; /* closed since epoll reported it */
        uint32_t flags = events[i].events;
        switch (w->kind) {
        case WATCH_WAKE: {
            /* only the progress thread drains it: the wake-up is for its wait, and a caller's pass that
             * drained it first would leave that thread asleep until its old timeout */
            if (!progress_thread) break;
            uint64_t count;
            while (read(ctx->wakefd, &count, sizeof count) < 0 && errno == EINTR) {
            }
            break;
        }
        case WATCH_CONN:
            sc_conn_ready(w->obj, (flags & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0, (flags & EPOLLOUT) != 0);
            break;
        case WATCH_LISTEN: sc_qp_listen_ready(w->obj); break;
        case WATCH_CONNECTING: sc_qp_connect_ready(w->obj); break;
        default: break;
        }
    }
    sc_timers_fire(ctx, sc_now());
    sc_conn_reap(ctx);
}

void sc_pass(struct sc_ctx *ctx, int timeout_ms) {
    struct epoll_event events[MAX_EVENTS];
    int n = epoll_wait(ctx->epfd, events, MAX_EVENTS, timeout_ms);
    dispatch(ctx, events, n > 0 ? n : 0, 0);
}

static void *run(void *arg) {
    struct sc_ctx *ctx = arg;
    struct epoll_event events[MAX_EVENTS];
    pthread_mutex_lock(&ctx->lock);
    while (!ctx->stopping) {
        int64_t due = sc_timers_first(ctx), now = sc_now();
        int timeout = -1;
        if (due) {
            int64_t ms = due <= now ? 0 : (due - now + 999999) / 1000000;
            timeout = ms > 3600000 ? 3600000 : (int)ms; /* a deadline hours away: look again in an hour */
        }
        ctx->sleep_until = due ? due : INT64_MAX;
        pthread_mutex_unlock(&ctx->lock);
        int n = epoll_wait(ctx->epfd, events, MAX_EVENTS, timeout);
        pthread_mutex_lock(&ctx->lock);
        ctx->sleep_until = 0;
        if (!ctx->stopping) dispatch(ctx, events, n > 0 ? n : 0, 1);
    }
    pthread_mutex_unlock(&ctx->lock);
    return NULL;
}

sc_ctx *sc_ctx_new(void) {
    sc_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return NULL;
    ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
    ctx->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ctx->epfd < 0 || ctx->wakefd < 0 || pthread_mutex_init(&ctx->lock, NULL)) goto fail;
    if (!sc_watch_add(ctx, ctx->wakefd, WATCH_WAKE, NULL, 0)) goto fail_locked;
    if (pthread_create(&ctx->thread, NULL, run, ctx)) goto fail_locked;
    return ctx;
fail_locked:
    pthread_mutex_destroy(&ctx->lock);
fail:
    if (ctx->epfd >= 0) close(ctx->epfd);
    if (ctx->wakefd >= 0) close(ctx->wakefd);
    free(ctx->watches);
    free(ctx);
    return NULL;
}

void sc_ctx_free(sc_ctx *ctx) {
    pthread_mutex_lock(&ctx->lock);
    ctx->stopping = 1;
    sc_engine_wake(ctx);
    pthread_mutex_unlock(&ctx->lock);
    pthread_join(ctx->thread, NULL);
    sc_qp_free_all(ctx);
    sc_conn_reap(ctx);
    sc_cq_free_all(ctx);
    sc_mr_free_all(ctx);
    close(ctx->epfd);
    close(ctx->wakefd);
    free(ctx->watches);
    free(ctx->heap);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

void sc_ctx_progress(sc_ctx *ctx) {
    pthread_mutex_lock(&ctx->lock);
    sc_pass(ctx, 0);
    pthread_mutex_unlock(&ctx->lock);
}

uint64_t sc_ctx_failures(sc_ctx *ctx) {
    pthread_mutex_lock(&ctx->lock);
    uint64_t failures = ctx->failures;
    pthread_mutex_unlock(&ctx->lock);
    return failures;
}
