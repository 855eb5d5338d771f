/* Completion queues and completion channels.
 *
 * A CQ holds at most cqe completions; one more overflows it, as on an RNIC: it is unusable from then on
 * and the QP that pushed goes to ERR. An armed CQ reports once to its channel, whose eventfd then turns
 * readable, so a Python thread can wait on it with the interpreter lock released. A waiter in
 * sc_chan_wait waits on the context's sockets too and makes the pass itself; an event its own pass
 * queues needs no write to the eventfd (it takes the event before the lock is let go), others do.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "internal.h"

static void signal_fd(int fd) {
    uint64_t one = 1;
    while (write(fd, &one, sizeof one) < 0 && errno == EINTR) {
    }
}

static void drain_fd(int fd) {
    uint64_t count;
    while (read(fd, &count, sizeof count) < 0 && errno == EINTR) {
    }
}

sc_chan *sc_chan_new(sc_ctx *ctx) {
    sc_chan *chan = calloc(1, sizeof *chan);
    if (!chan) return NULL;
    chan->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (chan->fd < 0) {
        free(chan);
        return NULL;
    }
    chan->ctx = ctx;
    chan->refs = 1;
    pthread_mutex_lock(&ctx->lock);
    chan->next = ctx->chans;
    if (ctx->chans) ctx->chans->prev = chan;
    ctx->chans = chan;
    pthread_mutex_unlock(&ctx->lock);
    return chan;
}

int sc_chan_fd(const sc_chan *chan) { return chan->fd; }

static void chan_put(struct sc_chan *chan) {
    if (--chan->refs) return;
    struct sc_ctx *ctx = chan->ctx;
    if (chan->prev) chan->prev->next = chan->next;
    else ctx->chans = chan->next;
    if (chan->next) chan->next->prev = chan->prev;
    close(chan->fd);
    free(chan->events);
    free(chan);
}

static void chan_signal(struct sc_chan *chan) {
    if (chan->signalled) return; /* readable already: a second write would wake nobody new */
    signal_fd(chan->fd);
    chan->signalled = 1;
}

static int chan_notify(struct sc_chan *chan, struct sc_cq *cq) {
    if (chan->count == chan->size) {
        uint32_t size = chan->size ? chan->size * 2 : 8;
        struct sc_cq **events = malloc(size * sizeof *events);
        if (!events) return 0;
        for (uint32_t i = 0; i < chan->count; i++) events[i] = chan->events[(chan->head + i) % chan->size];
        free(chan->events);
        chan->events = events;
        chan->head = 0;
        chan->size = size;
    }
    chan->events[(chan->head + chan->count) % chan->size] = cq;
    chan->count++;
    cq->refs++;
    if (chan->ctx->passing_chan != chan) chan_signal(chan);
    return 1;
}

static int chan_take(struct sc_chan *chan, uint64_t *cookie) {
    int got = 0;
    while (chan->count && !got) {
        struct sc_cq *cq = chan->events[chan->head];
        chan->head = (chan->head + 1) % chan->size;
        chan->count--;
        if (!cq->closed) {
            *cookie = cq->cookie;
            got = 1;
        }
        sc_cq_put(cq);
    }
    if (!got && chan->woken) {
        chan->woken = 0;
        got = 2;
    }
    /* the eventfd is readable exactly while something waits to be taken; drained before the lock is
     * let go, so a later event signals again */
    if (chan->count || chan->woken) chan_signal(chan);
    else if (chan->signalled) {
        drain_fd(chan->fd);
        chan->signalled = 0;
    }
    return got;
}

int sc_chan_take(sc_chan *chan, uint64_t *cookie) {
    pthread_mutex_lock(&chan->ctx->lock);
    int got = chan_take(chan, cookie);
    pthread_mutex_unlock(&chan->ctx->lock);
    return got;
}

int sc_chan_wait(sc_chan *chan, int timeout_ms, int drive, uint64_t *cookie) {
    struct sc_ctx *ctx = chan->ctx;
    int64_t now = sc_now(), idle = (int64_t)SC_DRIVE_IDLE_MS * 1000000;
    int64_t end = timeout_ms < 0 ? INT64_MAX : now + (int64_t)timeout_ms * 1000000, idle_end = now + idle;
    struct pollfd fds[2] = {{.fd = chan->fd, .events = POLLIN}, {.fd = ctx->epfd, .events = POLLIN}};
    pthread_mutex_lock(&ctx->lock);
    int got = chan_take(chan, cookie);
    while (!got && (now = sc_now()) < end) {
        /* output waiting for room in a socket is the progress thread's (it sends while this caller
         * works); otherwise this thread waits on the sockets too, no longer than the first timer (it
         * fires it) and the idle limit */
        int driving = drive && !ctx->writers;
        int64_t until = end;
        if (driving) {
            if (now >= idle_end) {
                got = 3;
                break;
            }
            int64_t due = sc_timers_first(ctx);
            if (idle_end < until) until = idle_end;
            if (due && due < until) until = due;
            ctx->drivers++;
        }
        int timeout = until == INT64_MAX ? -1 : until <= now ? 0 : (int)((until - now + 999999) / 1000000);
        pthread_mutex_unlock(&ctx->lock);
        int ready = poll(fds, driving ? 2 : 1, timeout);
        pthread_mutex_lock(&ctx->lock);
        if (driving) {
            ctx->drivers--;
            ctx->passing_chan = chan;
            sc_drive(ctx);
            ctx->passing_chan = NULL;
            if (ready > 0 && fds[1].revents) idle_end = sc_now() + idle;
        } else if (drive) {
            idle_end = sc_now() + idle;
        }
        got = chan_take(chan, cookie);
    }
    if (drive && ctx->writers && ctx->parked) sc_engine_wake(ctx); /* the rest is the thread's to send */
    pthread_mutex_unlock(&ctx->lock);
    return got;
}

void sc_chan_wake(sc_chan *chan) {
    pthread_mutex_lock(&chan->ctx->lock);
    chan->woken = 1;
    chan_signal(chan);
    pthread_mutex_unlock(&chan->ctx->lock);
}

void sc_ctx_wake_waiters(sc_ctx *ctx) {
    pthread_mutex_lock(&ctx->lock);
    for (struct sc_chan *chan = ctx->chans; chan; chan = chan->next) {
        chan->woken = 1;
        chan_signal(chan);
    }
    pthread_mutex_unlock(&ctx->lock);
}

void sc_chan_free(sc_chan *chan) {
    struct sc_ctx *ctx = chan->ctx;
    pthread_mutex_lock(&ctx->lock);
    chan->closed = 1;
    while (chan->count) { /* queued events hold their CQs */
        struct sc_cq *cq = chan->events[chan->head];
        chan->head = (chan->head + 1) % chan->size;
        chan->count--;
        sc_cq_put(cq);
    }
    chan_put(chan);
    pthread_mutex_unlock(&ctx->lock);
}

sc_cq *sc_cq_new(sc_ctx *ctx, uint32_t cqe, sc_chan *chan, uint64_t cookie) {
    sc_cq *cq = calloc(1, sizeof *cq);
    if (!cq) return NULL;
    cq->ring = calloc(cqe ? cqe : 1, sizeof *cq->ring);
    if (!cq->ring) {
        free(cq);
        return NULL;
    }
    cq->ctx = ctx;
    cq->cqe = cqe;
    cq->cookie = cookie;
    cq->refs = 1;
    pthread_mutex_lock(&ctx->lock);
    cq->chan = chan;
    if (chan) chan->refs++;
    cq->next = ctx->cqs;
    if (ctx->cqs) ctx->cqs->prev = cq;
    ctx->cqs = cq;
    pthread_mutex_unlock(&ctx->lock);
    return cq;
}

int sc_cq_push(struct sc_cq *cq, const struct sc_wc *wc, int solicited) {
    if (cq->closed) return 1; /* nobody will poll it: as good as consumed */
    if (cq->overflowed || cq->count >= cq->cqe) __atomic_store_n(&cq->overflowed, 1, __ATOMIC_RELAXED);
    else {
        cq->ring[(cq->head + cq->count) % cq->cqe] = *wc;
        __atomic_store_n(&cq->count, cq->count + 1, __ATOMIC_RELEASE); /* a peek reads it without the lock */
    }
    if (cq->filled) cq->fresh = cq->ctx->fresh = 1;
    int armed = cq->armed;
    int fire = armed != ARMED_NONE &&
               (armed == ARMED_ANY || solicited || wc->status != WC_SUCCESS || cq->overflowed);
    if (fire) {
        cq->armed = ARMED_NONE;
        if (cq->chan && !cq->chan->closed) chan_notify(cq->chan, cq);
    }
    return !cq->overflowed;
}

static int take(struct sc_cq *cq, int n, struct sc_wc *out) {
    if (cq->overflowed) return -1;
    int got = 0;
    while (got < n && cq->count) {
        out[got++] = cq->ring[cq->head];
        cq->head = (cq->head + 1) % cq->cqe;
        __atomic_store_n(&cq->count, cq->count - 1, __ATOMIC_RELAXED);
    }
    return got;
}

enum { PEEK, DRIVE, LOOK };

static int poll_cq(sc_cq *cq, int n, struct sc_wc *out, int how) {
    struct sc_ctx *ctx = cq->ctx;
    /* a peek of a CQ with nothing in it costs no lock: the fast path peeks at every backup path's CQs on
     * every pass (a completion pushed meanwhile is the next peek's, as if this one came a moment earlier) */
    if (how == PEEK && !__atomic_load_n(&cq->count, __ATOMIC_ACQUIRE) &&
        !__atomic_load_n(&cq->overflowed, __ATOMIC_RELAXED))
        return 0;
    pthread_mutex_lock(&ctx->lock);
    if (how != PEEK && !cq->count && !cq->overflowed) { /* a busy poll moves its own data */
        if (how == DRIVE) sc_drive(ctx);
        else sc_look(ctx);
    }
    int got = take(cq, n, out);
    pthread_mutex_unlock(&ctx->lock);
    return got;
}

int sc_cq_poll(sc_cq *cq, int n, struct sc_wc *out) { return poll_cq(cq, n, out, DRIVE); }

int sc_cq_peek(sc_cq *cq, int n, struct sc_wc *out) { return poll_cq(cq, n, out, PEEK); }

int sc_cq_look(sc_cq *cq, int n, struct sc_wc *out) { return poll_cq(cq, n, out, LOOK); }

void sc_cq_req_notify(sc_cq *cq, int solicited_only) {
    pthread_mutex_lock(&cq->ctx->lock);
    cq->armed = solicited_only ? ARMED_SOLICITED : ARMED_ANY;
    pthread_mutex_unlock(&cq->ctx->lock);
}

void sc_cq_put(struct sc_cq *cq) {
    if (--cq->refs) return;
    struct sc_ctx *ctx = cq->ctx;
    if (cq->prev) cq->prev->next = cq->next;
    else ctx->cqs = cq->next;
    if (cq->next) cq->next->prev = cq->prev;
    if (cq->chan) chan_put(cq->chan);
    free(cq->ring);
    free(cq);
}

static void wait_calls(struct sc_ctx *ctx) {
    while (ctx->calling && !pthread_equal(pthread_self(), ctx->thread)) pthread_cond_wait(&ctx->called, &ctx->lock);
}

void sc_cq_set_filled(sc_cq *cq, void (*fn)(void *arg), void *arg) {
    struct sc_ctx *ctx = cq->ctx;
    pthread_mutex_lock(&ctx->lock);
    cq->filled = fn;
    cq->filled_arg = arg;
    cq->fresh = 0;
    if (!fn) wait_calls(ctx);
    pthread_mutex_unlock(&ctx->lock);
}

void sc_cq_call_filled(struct sc_ctx *ctx) {
    enum { MAX_CALLS = 8 }; /* a context's hooked CQs: a shift context's control CQ per backup path */
    struct call {
        void (*fn)(void *);
        void *arg;
    } calls[MAX_CALLS];
    int n = 0;
    if (!ctx->fresh) return;
    ctx->fresh = 0;
    for (struct sc_cq *cq = ctx->cqs; cq; cq = cq->next) {
        if (!cq->fresh) continue;
        cq->fresh = 0;
        if (cq->filled && !cq->closed && n < MAX_CALLS) calls[n++] = (struct call){cq->filled, cq->filled_arg};
        else if (cq->filled && !cq->closed) ctx->fresh = cq->fresh = 1; /* the next pass calls it */
    }
    if (!n) return;
    ctx->calling = 1;
    pthread_mutex_unlock(&ctx->lock);
    for (int i = 0; i < n; i++) calls[i].fn(calls[i].arg);
    pthread_mutex_lock(&ctx->lock);
    ctx->calling = 0;
    pthread_cond_broadcast(&ctx->called);
}

void sc_cq_free(sc_cq *cq) {
    struct sc_ctx *ctx = cq->ctx;
    pthread_mutex_lock(&ctx->lock);
    cq->filled = NULL;
    wait_calls(ctx);
    cq->closed = 1;
    cq->count = 0;
    sc_cq_put(cq);
    pthread_mutex_unlock(&ctx->lock);
}

void sc_cq_free_all(struct sc_ctx *ctx) {
    while (ctx->cqs) {
        struct sc_cq *cq = ctx->cqs;
        ctx->cqs = cq->next;
        free(cq->ring);
        free(cq);
    }
    while (ctx->chans) {
        struct sc_chan *chan = ctx->chans;
        ctx->chans = chan->next;
        close(chan->fd);
        free(chan->events);
        free(chan);
    }
}
