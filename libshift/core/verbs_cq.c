/* The verbs backend's CQs and completion channels.
 *
 * A channel's fd is an epoll fd over libibverbs' channel fd and an eventfd of its own, so that one fd is
 * readable for an event and for sv_chan_wake alike, as the tcp engine's channel is. Each event is
 * acknowledged as it is taken: a CQ can then be destroyed at any time without waiting on a count.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "verbs_internal.h"

#define SV_POLL_BATCH 32

static int watch(int epfd, int fd) {
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) ? errno : 0;
}

sv_chan *sv_chan_new(sv_ctx *ctx) {
    sv_chan *chan = calloc(1, sizeof *chan);
    if (!chan) return sv_fail("completion channel: %s", strerror(ENOMEM));
    chan->ctx = ctx;
    chan->wakefd = chan->epfd = -1;
    int err = 0;
    chan->ibv = ctx->lib->create_comp_channel(ctx->ibv);
    if (!chan->ibv) err = errno ? errno : ENOMEM;
    if (!err) err = sv_nonblock(chan->ibv->fd);
    if (!err && (chan->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) err = errno;
    if (!err && (chan->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) err = errno;
    if (!err) err = watch(chan->epfd, chan->ibv->fd);
    if (!err) err = watch(chan->epfd, chan->wakefd);
    if (err) {
        sv_chan_free(chan);
        return sv_fail("completion channel: %s", strerror(err));
    }
    return chan;
}

int sv_chan_fd(const sv_chan *chan) { return chan->epfd; }

int sv_chan_take(sv_chan *chan, uint64_t *cookie) {
    struct ibv_cq *ibv;
    void *context;
    if (chan->ctx->lib->get_cq_event(chan->ibv, &ibv, &context) == 0) {
        chan->ctx->lib->ack_cq_events(ibv, 1);
        *cookie = ((struct sv_cq *)context)->cookie;
        return 1;
    }
    uint64_t count;
    return read(chan->wakefd, &count, sizeof count) == sizeof count ? 2 : 0;
}

int sv_chan_wait(sv_chan *chan, int timeout_ms, int drive, uint64_t *cookie) {
    (void)drive;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t end = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000 + timeout_ms;
    int got, left = timeout_ms;
    while (!(got = sv_chan_take(chan, cookie)) && left != 0) {
        struct epoll_event ev[2];
        if (epoll_wait(chan->epfd, ev, 2, left) < 0 && errno != EINTR) {
            sv_fail("epoll_wait: %s", strerror(errno));
            return 0;
        }
        if (timeout_ms >= 0) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            int64_t rest = end - ((int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000);
            left = rest > 0 ? (int)rest : 0;
        }
    }
    return got;
}

void sv_chan_wake(sv_chan *chan) {
    uint64_t one = 1;
    while (write(chan->wakefd, &one, sizeof one) < 0 && errno == EINTR) {
    }
}

int sv_chan_free(sv_chan *chan) {
    int err = chan->ibv ? chan->ctx->lib->destroy_comp_channel(chan->ibv) : 0;
    if (err) { /* EBUSY: a CQ still uses it */
        sv_fail("ibv_destroy_comp_channel: %s", strerror(err));
        return err;
    }
    if (chan->wakefd >= 0) close(chan->wakefd);
    if (chan->epfd >= 0) close(chan->epfd);
    free(chan);
    return 0;
}

sv_cq *sv_cq_new(sv_ctx *ctx, uint32_t cqe, sv_chan *chan, uint64_t cookie) {
    sv_cq *cq = calloc(1, sizeof *cq);
    if (!cq) return sv_fail("CQ: %s", strerror(ENOMEM));
    cq->ctx = ctx;
    cq->cookie = cookie;
    cq->ibv = ctx->lib->create_cq(ctx->ibv, (int)cqe, cq, chan ? chan->ibv : NULL, 0);
    if (!cq->ibv) {
        free(cq);
        return sv_fail("ibv_create_cq(%u entries): %s", cqe, strerror(errno));
    }
    return cq;
}

static void convert(const struct ibv_wc *in, struct sc_wc *out) {
    *out = (struct sc_wc){
        .wr_id = in->wr_id,
        .status = in->status,
        .opcode = in->opcode,
        .qp_num = in->qp_num,
        .byte_len = in->byte_len,
        .imm_data = in->wc_flags & IBV_WC_WITH_IMM ? ntohl(in->imm_data) : 0,
        .wc_flags = in->wc_flags,
        .src_qp = in->src_qp,
    };
}

uint32_t sv_cq_cqe(const sv_cq *cq) { return (uint32_t)cq->ibv->cqe; }

int sv_cq_poll(sv_cq *cq, int n, struct sc_wc *out) {
    if (cq->overflowed) return -1;
    struct ibv_wc wc[SV_POLL_BATCH];
    int got = 0;
    while (got < n) {
        int want = n - got < SV_POLL_BATCH ? n - got : SV_POLL_BATCH;
        int some = ibv_poll_cq(cq->ibv, want, wc);
        if (some < 0) return -1;
        for (int i = 0; i < some; i++) convert(&wc[i], &out[got + i]);
        got += some;
        if (some < want) break;
    }
    return got;
}

int sv_cq_req_notify(sv_cq *cq, int solicited_only) {
    int err = ibv_req_notify_cq(cq->ibv, solicited_only);
    if (err) sv_fail("ibv_req_notify_cq: %s", strerror(err));
    return err;
}

int sv_cq_free(sv_cq *cq) {
    int err = cq->ctx->lib->destroy_cq(cq->ibv);
    if (err) { /* EBUSY: a QP still uses it */
        sv_fail("ibv_destroy_cq: %s", strerror(err));
        return err;
    }
    free(cq);
    return 0;
}
