/* The fast path's completion channels (fastpath.h): the events of the armed CQs, and the applications'
 * blocking waits, which make the progress themselves (leader and followers).
 *
 * A ShiftCompChannel's wait in Python cost 18 us per wake-up: arming, a pass, the provider's wait, a pass,
 * the hand-over of the CQ's event through the deferred queue, a condition variable. Here it is one call:
 * the leader arms the default path's provider CQs, makes the pass and waits on the provider channel, all
 * without the interpreter, and the event a pass raises for its own channel is taken before it lets go. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "fast_internal.h"

struct sf_chan {
    sf_ctx *ctx;
    sf_chan *next;     /* the context's channels */
    int fd;            /* eventfd: readable while an event, a wake-up or the lead waits for a follower */
    uint64_t *events;  /* the cookies of the CQs that fired, a ring */
    uint32_t size, head, count;
    int followers;     /* threads waiting on fd */
    int woken, signalled;
};

sf_chan *sf_chan_new(sf_ctx *ctx) {
    sf_chan *chan = calloc(1, sizeof *chan);
    if (!chan)
        return NULL;
    chan->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (chan->fd < 0) {
        free(chan);
        return NULL;
    }
    chan->ctx = ctx;
    chan->next = ctx->chans;
    ctx->chans = chan;
    return chan;
}

void sf_chan_free(sf_chan *chan) {
    if (!chan)
        return;
    sf_ctx *ctx = chan->ctx;
    for (uint32_t i = 0; i < ctx->ncqs; i++)
        if (ctx->cqs[i]->chan == chan)
            ctx->cqs[i]->chan = NULL;
    for (sf_chan **at = &ctx->chans; *at; at = &(*at)->next)
        if (*at == chan) {
            *at = chan->next;
            break;
        }
    close(chan->fd);
    free(chan->events);
    free(chan);
}

static void signal_fd(sf_chan *chan) {
    uint64_t one = 1;
    if (chan->signalled)
        return; /* readable already */
    while (write(chan->fd, &one, sizeof one) < 0 && errno == EINTR) {
    }
    chan->signalled = 1;
}

/* The channel's leader, if it waits on the provider channel (the pass that raised it was another
 * thread's): wake it there. */
static void wake_leader(sf_chan *chan) {
    sf_ctx *ctx = chan->ctx;
    if (ctx->leader == chan && ctx->leading_on)
        ctx->dp->chan_wake(ctx->leading_on);
}

/* Tell whoever waits for the channel: its followers, and its leader. */
static void alert(sf_chan *chan) {
    if (chan->followers)
        signal_fd(chan);
    wake_leader(chan);
}

void sf_chan_raise(sf_chan *chan, uint64_t cookie) {
    if (chan->count == chan->size) {
        uint32_t size = chan->size ? chan->size * 2 : 8;
        uint64_t *events = malloc(size * sizeof *events);
        if (!events) { /* no room to say which: wake the waiters, whose poll finds the completion */
            sf_chan_wake(chan);
            return;
        }
        for (uint32_t i = 0; i < chan->count; i++)
            events[i] = chan->events[(chan->head + i) % chan->size];
        free(chan->events);
        chan->events = events;
        chan->head = 0;
        chan->size = size;
    }
    chan->events[(chan->head + chan->count++) % chan->size] = cookie;
    alert(chan);
}

void sf_chan_wake(sf_chan *chan) {
    chan->woken = 1;
    signal_fd(chan);
    wake_leader(chan);
}

/* An event (SF_WAIT_EVENT), a wake-up (SF_WAIT_WOKEN) or nothing (0). The eventfd is drained when nothing
 * is left for a follower, so that the next alert wakes one again. */
static int take(sf_chan *chan, uint64_t *cookie) {
    int got = 0;
    if (chan->count) {
        *cookie = chan->events[chan->head];
        chan->head = (chan->head + 1) % chan->size;
        chan->count--;
        got = SF_WAIT_EVENT;
    } else if (chan->woken) {
        chan->woken = 0;
        got = SF_WAIT_WOKEN;
    }
    if (chan->signalled && !chan->count && !chan->woken) {
        uint64_t count;
        while (read(chan->fd, &count, sizeof count) < 0 && errno == EINTR) {
        }
        chan->signalled = 0;
    }
    return got;
}

static int ms_until(int64_t until, int64_t now) {
    if (until == INT64_MAX)
        return -1;
    return until <= now ? 0 : (int)((until - now + 999999) / 1000000);
}

/* Arm the default path's provider CQs of the CQs with a channel: the next completion there raises an event
 * on `serve`. */
static void arm(sf_ctx *ctx) {
    for (uint32_t i = 0; i < ctx->ncqs; i++)
        if (ctx->cqs[i]->chan && ctx->cqs[i]->on[0])
            ctx->dp->cq_req_notify(ctx->cqs[i]->on[0], 0);
}

/* One turn of the leader: arm, a pass, then (nothing for it yet) a wait on the provider channel, driving
 * its transport until it has been idle a while (*drive then falls to 0). Under the mutex, let go while it
 * waits. */
static int lead(sf_chan *chan, void *serve, int64_t end, int *drive, uint64_t *cookie) {
    sf_ctx *ctx = chan->ctx;
    uint64_t provider_cookie;
    arm(ctx);
    if (sf_ctx_progress(ctx, 0) < 0 || ctx->deferred_count)
        return SF_WAIT_PASS; /* an overflow is met by Python's pass too */
    int got = take(chan, cookie);
    if (got)
        return got;
    int64_t now = sf_now_ns(), until = end;
    if (ctx->watching && until - now > SF_HANDOFF_NS)
        until = now + SF_HANDOFF_NS; /* either of us may take the other's wake-up */
    ctx->leading_on = serve;
    pthread_mutex_unlock(&ctx->lock);
    int said = ctx->dp->chan_wait(serve, ms_until(until, now), *drive, &provider_cookie);
    pthread_mutex_lock(&ctx->lock);
    ctx->leading_on = NULL;
    if (said == 3)
        *drive = 0; /* idle: the progress thread's turn to read the sockets */
    got = take(chan, cookie);
    /* the provider's wake-up with nothing of ours: another thread's alert, or the provider channel closing */
    return got || said != 2 ? got : SF_WAIT_WOKEN;
}

/* One turn of a follower: wait on the channel's eventfd for an event, a wake-up or the lead; while a backup
 * path is hot, no longer than that (then it may lead). */
static void follow(sf_chan *chan, int64_t end) {
    sf_ctx *ctx = chan->ctx;
    int64_t now = sf_now_ns(), until = end;
    if (!ctx->leader && ctx->backup_hot > now && ctx->backup_hot < until)
        until = ctx->backup_hot;
    struct pollfd pfd = {.fd = chan->fd, .events = POLLIN};
    chan->followers++;
    pthread_mutex_unlock(&ctx->lock);
    poll(&pfd, 1, ms_until(until, now));
    pthread_mutex_lock(&ctx->lock);
    chan->followers--;
}

/* The leader left: a follower of any channel leads next. */
static void hand_on(sf_ctx *ctx) {
    for (sf_chan *other = ctx->chans; other; other = other->next)
        if (other->followers) {
            signal_fd(other);
            return;
        }
}

int sf_chan_wait(sf_chan *chan, void *serve, int timeout_ms, uint64_t *cookie) {
    sf_ctx *ctx = chan->ctx;
    int64_t end = timeout_ms < 0 ? INT64_MAX : sf_now_ns() + (int64_t)timeout_ms * 1000000;
    int got, drive = 1, leading = 0;
    pthread_mutex_lock(&ctx->lock);
    for (;;) {
        got = take(chan, cookie);
        if (!got && ctx->deferred_count)
            got = SF_WAIT_PASS;
        if (got || sf_now_ns() >= end)
            break;
        if (!leading && serve && !ctx->leader && !sf_ctx_backup_hot(ctx)) {
            ctx->leader = chan;
            leading = 1;
        }
        if (leading && sf_ctx_backup_hot(ctx)) { /* the watchers make the progress now */
            ctx->leader = NULL;
            leading = 0;
        }
        if (leading) {
            got = lead(chan, serve, end, &drive, cookie);
            if (got)
                break;
        } else {
            follow(chan, end);
        }
    }
    if (leading) {
        ctx->leader = NULL;
        ctx->led_ns = sf_now_ns();
        hand_on(ctx);
    }
    pthread_mutex_unlock(&ctx->lock);
    return got;
}

int64_t sf_ctx_watch_begin(sf_ctx *ctx) {
    int64_t rest = SF_SERVE_GRACE_NS;
    if (!ctx->leader)
        rest = ctx->led_ns ? ctx->led_ns + SF_SERVE_GRACE_NS - sf_now_ns() : 0;
    if (rest > 0)
        return rest;
    ctx->watching = 1;
    return 0;
}

void sf_ctx_watch_end(sf_ctx *ctx) { ctx->watching = 0; }
