/* The context and its progress: one epoll set of sockets, one lock, one thread, and passes on callers'
 * threads.
 *
 * The progress thread waits until a socket is ready or the first timer falls due, then makes a pass under
 * the lock. The first deadline is a timerfd in its wait set: a post that arms an earlier one (every post
 * on an idle QP arms its ack deadline) re-arms the timerfd itself, and the thread sleeps on; a wake-up to
 * shorten its wait cost a thread switch per message, and the woken thread, at real-time priority,
 * preempted the poster. A caller whose poll finds its CQ empty makes a non-blocking pass itself, and a
 * blocking channel wait waits on the sockets itself, so the thread that wants the data reads it, with no
 * hand-off between threads. While callers drive like this the progress thread is parked: it waits on its
 * wake-up eventfd and its timerfd alone, for SC_DRIVE_GRACE_NS after the last caller's pass (looking at
 * timers when it ends), so that it neither races the caller for the frame nor costs a wake-up per message.
 * Output that waits for room in a socket unparks it unless a blocking wait is under way: it sends while
 * the caller works. An epoll entry names a watch slot with a generation, never a pointer, so an event that
 * arrives for a connection closed in the meantime is recognised and dropped.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "priority.h"

#define MAX_EVENTS 64
#define WAKE_TAG UINT64_MAX       /* the wake-up eventfd's entry in the progress thread's epoll set */
#define TIMER_TAG (UINT64_MAX - 1) /* the deadline timerfd's */

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

static void dispatch(struct sc_ctx *ctx, const struct epoll_event *events, int n) {
    for (int i = 0; i < n; i++) {
        uint64_t watch = events[i].data.u64;
        uint32_t slot = slot_of(watch);
        if (slot == 0 || slot >= ctx->nwatches) continue;
        struct sc_watch *w = &ctx->watches[slot];
        if (w->gen != (uint32_t)watch) continue; /* closed since epoll reported it */
        uint32_t flags = events[i].events;
        switch (w->kind) {
        case WATCH_CONN:
            sc_conn_ready(w->obj, (flags & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0, (flags & EPOLLOUT) != 0);
            break;
        case WATCH_LISTEN: sc_listen_ready(w->obj); break;
        case WATCH_CONNECTING: sc_qp_connect_ready(w->obj); break;
        default: break;
        }
    }
    sc_timers_fire(ctx, sc_now());
    sc_conn_reap(ctx);
}

static void pass(struct sc_ctx *ctx) {
    struct epoll_event events[MAX_EVENTS];
    int n = epoll_wait(ctx->epfd, events, MAX_EVENTS, 0);
    dispatch(ctx, events, n > 0 ? n : 0);
}

void sc_drive(struct sc_ctx *ctx) {
    ctx->last_drive = sc_now();
    pass(ctx);
}

void sc_look(struct sc_ctx *ctx) { pass(ctx); }

int sc_driven(const struct sc_ctx *ctx, int64_t now) {
    return ctx->drivers || (ctx->last_drive && now - ctx->last_drive < SC_DRIVE_GRACE_NS);
}

void sc_engine_arm(struct sc_ctx *ctx, int64_t until) {
    if (until == ctx->armed_until) return;
    struct itimerspec at = {0}; /* all zero: disarmed */
    if (until != INT64_MAX) {
        at.it_value.tv_sec = until / 1000000000;
        at.it_value.tv_nsec = until % 1000000000; /* a CLOCK_MONOTONIC time is never 0 (which disarms) */
    }
    if (timerfd_settime(ctx->timerfd, TFD_TIMER_ABSTIME, &at, NULL) == 0) ctx->armed_until = until;
}

static int timeout_ms(int64_t until, int64_t now) {
    if (until == INT64_MAX) return -1;
    int64_t ms = until <= now ? 0 : (until - now + 999999) / 1000000;
    return ms > 3600000 ? 3600000 : (int)ms; /* a deadline hours away: look again in an hour */
}

static void *run(void *arg) {
    struct sc_ctx *ctx = arg;
    struct epoll_event events[3];
    sc_thread_prefer_latency(); /* woken by a frame, it runs at once (priority.c) */
    pthread_setname_np(pthread_self(), "shift-progress");
    pthread_mutex_lock(&ctx->lock);
    while (!ctx->stopping) {
        int64_t now = sc_now(), due = sc_timers_first(ctx), until = due ? due : INT64_MAX, look = INT64_MAX;
        int parked = sc_driven(ctx, now) && (ctx->drivers || !ctx->writers);
        if (parked) /* a blocking waiter: look again now and then; a busy poller: when its grace ends */
            look = (ctx->drivers ? now : ctx->last_drive) + SC_DRIVE_GRACE_NS;
        sc_engine_arm(ctx, until);
        ctx->sleep_until = until < look ? until : look;
        ctx->parked = parked;
        pthread_mutex_unlock(&ctx->lock);
        int woken = 0, sockets = 0, expired = 0;
        if (parked) {
            struct pollfd wait[2] = {{.fd = ctx->wakefd, .events = POLLIN}, {.fd = ctx->timerfd, .events = POLLIN}};
            if (poll(wait, 2, timeout_ms(look, now)) > 0) {
                woken = (wait[0].revents & POLLIN) != 0;
                expired = (wait[1].revents & POLLIN) != 0;
            }
        } else {
            int n = epoll_wait(ctx->pfd, events, 3, -1);
            for (int i = 0; i < n; i++) {
                if (events[i].data.u64 == WAKE_TAG) woken = 1;
                else if (events[i].data.u64 == TIMER_TAG) expired = 1;
                else sockets = 1;
            }
        }
        pthread_mutex_lock(&ctx->lock);
        ctx->sleep_until = 0;
        ctx->parked = 0;
        uint64_t count;
        if (woken)
            while (read(ctx->wakefd, &count, sizeof count) < 0 && errno == EINTR) {
            }
        if (expired) { /* read, so that it is not ready again; and no longer armed */
            while (read(ctx->timerfd, &count, sizeof count) < 0 && errno == EINTR) {
            }
            ctx->armed_until = 0;
        }
        if (ctx->stopping) break;
        if (sockets) pass(ctx);
        else {
            sc_timers_fire(ctx, sc_now());
            sc_conn_reap(ctx);
        }
        sc_cq_call_filled(ctx);
    }
    pthread_mutex_unlock(&ctx->lock);
    return NULL;
}

static int add_to(int pfd, int fd, uint64_t tag) {
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = tag};
    return epoll_ctl(pfd, EPOLL_CTL_ADD, fd, &ev);
}

sc_ctx *sc_ctx_new(void) {
    sc_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return NULL;
    ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
    ctx->pfd = epoll_create1(EPOLL_CLOEXEC);
    ctx->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ctx->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (ctx->epfd < 0 || ctx->pfd < 0 || ctx->wakefd < 0 || ctx->timerfd < 0 || sc_mutex_init(&ctx->lock, 0))
        goto fail;
    if (pthread_cond_init(&ctx->called, NULL)) goto fail_locked;
    if (add_to(ctx->pfd, ctx->epfd, 0) || add_to(ctx->pfd, ctx->wakefd, WAKE_TAG) ||
        add_to(ctx->pfd, ctx->timerfd, TIMER_TAG))
        goto fail_cond;
    if (pthread_create(&ctx->thread, NULL, run, ctx)) goto fail_cond;
    return ctx;
fail_cond:
    pthread_cond_destroy(&ctx->called);
fail_locked:
    pthread_mutex_destroy(&ctx->lock);
fail:
    if (ctx->epfd >= 0) close(ctx->epfd);
    if (ctx->pfd >= 0) close(ctx->pfd);
    if (ctx->wakefd >= 0) close(ctx->wakefd);
    if (ctx->timerfd >= 0) close(ctx->timerfd);
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
    sc_listen_free_all(ctx);
    sc_conn_reap(ctx);
    sc_frames_free_spare(ctx);
    sc_cq_free_all(ctx);
    sc_mr_free_all(ctx);
    close(ctx->epfd);
    close(ctx->pfd);
    close(ctx->wakefd);
    close(ctx->timerfd);
    free(ctx->watches);
    free(ctx->heap);
    pthread_cond_destroy(&ctx->called);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

void sc_ctx_progress(sc_ctx *ctx) {
    pthread_mutex_lock(&ctx->lock);
    sc_drive(ctx);
    pthread_mutex_unlock(&ctx->lock);
}

uint64_t sc_ctx_failures(sc_ctx *ctx) {
    pthread_mutex_lock(&ctx->lock);
    uint64_t failures = ctx->failures;
    pthread_mutex_unlock(&ctx->lock);
    return failures;
}
