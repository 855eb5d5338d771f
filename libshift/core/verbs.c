/* The verbs backend's device context (by name and port), its PDs and MRs, and its async events. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "verbs_internal.h"

int sv_nonblock(int fd) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return errno;
    return 0;
}

static struct ibv_context *open_named(const struct sv_lib *lib, const char *name) {
    int count = 0;
    struct ibv_device **list = lib->get_device_list(&count);
    if (!list) return sv_fail("no RDMA device called %s (ibv_get_device_list: %s)", name, strerror(errno));
    struct ibv_context *ibv = NULL;
    int found = 0;
    for (int i = 0; i < count && !found; i++) {
        if (strcmp(lib->get_device_name(list[i]), name) != 0) continue;
        found = 1;
        ibv = lib->open_device(list[i]);
        if (!ibv) sv_fail("ibv_open_device(%s): %s", name, strerror(errno));
    }
    lib->free_device_list(list);
    if (!found) sv_fail("no RDMA device called %s (%d devices)", name, count);
    return ibv;
}

sv_ctx *sv_ctx_open(const char *name, uint8_t port) {
    const struct sv_lib *lib = sv_lib();
    if (!lib) return NULL;
    struct ibv_context *ibv = open_named(lib, name);
    if (!ibv) return NULL;
    struct ibv_port_attr attr;
    memset(&attr, 0, sizeof attr);
    int err = lib->query_port(ibv, port, &attr);
    if (!err) err = sv_nonblock(ibv->async_fd);
    sv_ctx *ctx = err ? NULL : calloc(1, sizeof *ctx);
    if (!ctx) {
        lib->close_device(ibv);
        return sv_fail("%s port %u: %s", name, port, strerror(err ? err : ENOMEM));
    }
    ctx->lib = lib;
    ctx->ibv = ibv;
    ctx->port = port;
    ctx->link_layer = attr.link_layer;
    return ctx;
}

void sv_ctx_free(sv_ctx *ctx) {
    ctx->lib->close_device(ctx->ibv);
    free(ctx);
}

int sv_ctx_port(sv_ctx *ctx, struct sv_port *out) {
    struct ibv_port_attr attr;
    memset(&attr, 0, sizeof attr);
    int err = ctx->lib->query_port(ctx->ibv, ctx->port, &attr);
    if (err) {
        sv_fail("ibv_query_port: %s", strerror(err));
        return err;
    }
    *out = (struct sv_port){attr.state, attr.active_mtu, attr.lid, attr.link_layer, (uint32_t)attr.gid_tbl_len};
    return 0;
}

int sv_ctx_gid(sv_ctx *ctx, int index, uint8_t out[16]) {
    union ibv_gid gid;
    if (ctx->lib->query_gid(ctx->ibv, ctx->port, index, &gid)) {
        int err = errno ? errno : EINVAL;
        sv_fail("ibv_query_gid(%d): %s", index, strerror(err));
        return err;
    }
    memcpy(out, gid.raw, 16);
    return 0;
}

int sv_ctx_event_fd(const sv_ctx *ctx) { return ctx->ibv->async_fd; }

int sv_ctx_event(sv_ctx *ctx, struct sv_event *out) {
    struct ibv_async_event event;
    if (ctx->lib->get_async_event(ctx->ibv, &event)) return 0; /* EAGAIN: the fd is non-blocking */
    memset(out, 0, sizeof *out);
    out->type = event.event_type;
    switch (event.event_type) {
    case IBV_EVENT_CQ_ERR: {
        struct sv_cq *cq = event.element.cq->cq_context;
        cq->overflowed = 1;
        out->cq_cookie = cq->cookie;
        break;
    }
    case IBV_EVENT_QP_FATAL: case IBV_EVENT_QP_REQ_ERR: case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST: case IBV_EVENT_SQ_DRAINED: case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR: case IBV_EVENT_QP_LAST_WQE_REACHED:
        out->qp_num = event.element.qp->qp_num;
        break;
    case IBV_EVENT_PORT_ACTIVE: case IBV_EVENT_PORT_ERR: case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE: case IBV_EVENT_SM_CHANGE: case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE:
        out->port = (uint32_t)event.element.port_num;
        break;
    default:
        break;
    }
    ctx->lib->ack_async_event(&event);
    return 1;
}

sv_pd *sv_pd_new(sv_ctx *ctx) {
    sv_pd *pd = calloc(1, sizeof *pd);
    if (!pd) return sv_fail("PD: %s", strerror(ENOMEM));
    pd->ctx = ctx;
    pd->ibv = ctx->lib->alloc_pd(ctx->ibv);
    if (!pd->ibv) {
        free(pd);
        return sv_fail("ibv_alloc_pd: %s", strerror(errno));
    }
    return pd;
}

void sv_pd_free(sv_pd *pd) {
    pd->ctx->lib->dealloc_pd(pd->ibv);
    free(pd);
}

sv_mr *sv_mr_reg(sv_pd *pd, void *addr, uint64_t length, uint32_t access) {
    sv_mr *mr = calloc(1, sizeof *mr);
    if (!mr) return sv_fail("MR: %s", strerror(ENOMEM));
    mr->ctx = pd->ctx;
    mr->ibv = pd->ctx->lib->reg_mr(pd->ibv, addr, length, (int)access);
    if (!mr->ibv) {
        free(mr);
        return sv_fail("ibv_reg_mr(%llu bytes, access 0x%x): %s", (unsigned long long)length, access,
                       strerror(errno));
    }
    return mr;
}

uint32_t sv_mr_lkey(const sv_mr *mr) { return mr->ibv->lkey; }
uint32_t sv_mr_rkey(const sv_mr *mr) { return mr->ibv->rkey; }

int sv_mr_dereg(sv_mr *mr) {
    int err = mr->ctx->lib->dereg_mr(mr->ibv);
    if (err) {
        sv_fail("ibv_dereg_mr: %s", strerror(err));
        return err;
    }
    free(mr);
    return 0;
}
