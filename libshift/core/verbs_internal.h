/* The verbs backend's objects, shared by verbs.c, verbs_cq.c and verbs_qp.c: each wraps its libibverbs
 * object and keeps what the backend's calls need beside it. */
#ifndef SHIFT_CORE_VERBS_INTERNAL_H
#define SHIFT_CORE_VERBS_INTERNAL_H

#include "verbs_core.h"
#include "verbs_lib.h"

struct sv_ctx {
    const struct sv_lib *lib;
    struct ibv_context *ibv;
    uint8_t port;
    uint32_t link_layer;
};

struct sv_pd {
    struct sv_ctx *ctx;
    struct ibv_pd *ibv;
};

struct sv_mr {
    struct sv_ctx *ctx;
    struct ibv_mr *ibv;
};

struct sv_chan {
    struct sv_ctx *ctx;
    struct ibv_comp_channel *ibv;
    int wakefd; /* sv_chan_wake's eventfd */
    int epfd;   /* the fd callers wait on: the channel's and the wake-up's at once */
};

struct sv_cq {
    struct sv_ctx *ctx;
    struct ibv_cq *ibv;
    uint64_t cookie;
    volatile int overflowed; /* set by sv_ctx_event on the device's CQ_ERR */
};

struct sv_qp {
    struct sv_ctx *ctx;
    struct ibv_qp *ibv;
    struct sc_cap cap;
    int sq_sig_all;
};

/* Makes fd non-blocking: 0, or an errno. */
int sv_nonblock(int fd);

#endif
