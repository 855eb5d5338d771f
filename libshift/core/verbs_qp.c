/* The verbs backend's RC QPs: create, the transitions RC needs, and posting the core's work requests.
 *
 * A post is checked first as the tcp engine checks it (state, opcode, SGEs, inline bytes, an atomic's one
 * 8-byte SGE), so both backends refuse the same WRs with the same reasons; what the device refuses after
 * that is SC_POST_QUEUE_FULL (ENOMEM) or SC_POST_DEVICE. sc_sge is laid out as ibv_sge, so SGE lists pass
 * as they are; WRs are converted on the stack, SV_POST_BATCH at a time.
 */
#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "verbs_internal.h"

#define SV_POST_BATCH 16
#define SV_HOP_LIMIT 64 /* RoCE v2 crosses routers */

static_assert(sizeof(struct sc_sge) == sizeof(struct ibv_sge) &&
                  offsetof(struct sc_sge, addr) == offsetof(struct ibv_sge, addr) &&
                  offsetof(struct sc_sge, length) == offsetof(struct ibv_sge, length) &&
                  offsetof(struct sc_sge, lkey) == offsetof(struct ibv_sge, lkey),
              "sc_sge must be ibv_sge's layout");

sv_qp *sv_qp_new(sv_pd *pd, sv_cq *send_cq, sv_cq *recv_cq, const struct sc_cap *cap, int sq_sig_all) {
    const struct sv_lib *lib = pd->ctx->lib;
    sv_qp *qp = calloc(1, sizeof *qp);
    if (!qp) return sv_fail("QP: %s", strerror(ENOMEM));
    struct ibv_qp_init_attr init = {
        .qp_context = qp,
        .send_cq = send_cq->ibv,
        .recv_cq = recv_cq->ibv,
        .cap = {cap->max_send_wr, cap->max_recv_wr, cap->max_send_sge, cap->max_recv_sge, cap->max_inline_data},
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = sq_sig_all,
    };
    qp->ctx = pd->ctx;
    qp->sq_sig_all = sq_sig_all;
    qp->ibv = lib->create_qp(pd->ibv, &init);
    if (!qp->ibv) {
        free(qp);
        return sv_fail("ibv_create_qp: %s", strerror(errno));
    }
    /* what the device granted: ibv_create_qp's write-back is not the whole story on every provider */
    struct ibv_qp_attr attr;
    int err = lib->query_qp(qp->ibv, &attr, IBV_QP_CAP, &init);
    if (err) {
        sv_fail("ibv_query_qp: %s", strerror(err));
        lib->destroy_qp(qp->ibv);
        free(qp);
        return NULL;
    }
    qp->cap = (struct sc_cap){attr.cap.max_send_wr, attr.cap.max_recv_wr, attr.cap.max_send_sge,
                              attr.cap.max_recv_sge, attr.cap.max_inline_data};
    return qp;
}

uint32_t sv_qp_num(const sv_qp *qp) { return qp->ibv->qp_num; }
void sv_qp_cap(const sv_qp *qp, struct sc_cap *out) { *out = qp->cap; }

int sv_qp_last_state(const sv_qp *qp) { return qp->ibv->state; }

int sv_qp_state(sv_qp *qp) {
    struct ibv_qp_attr attr;
    struct ibv_qp_init_attr init;
    int err = qp->ctx->lib->query_qp(qp->ibv, &attr, IBV_QP_STATE, &init);
    if (err) {
        sv_fail("ibv_query_qp: %s", strerror(err));
        return -1;
    }
    return attr.qp_state;
}

static int modify(sv_qp *qp, struct ibv_qp_attr *attr, int mask, const char *what) {
    int err = qp->ctx->lib->modify_qp(qp->ibv, attr, mask | IBV_QP_STATE);
    if (err) sv_fail("QP %u: modify_qp to %s: %s", qp->ibv->qp_num, what, strerror(err));
    return err;
}

int sv_qp_to_init(sv_qp *qp, uint32_t access) {
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_INIT, .port_num = qp->ctx->port,
                               .qp_access_flags = (unsigned)access};
    return modify(qp, &attr, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
}

int sv_qp_to_rtr(sv_qp *qp, const struct sv_dest *dest, uint32_t rq_psn, uint8_t min_rnr_timer,
                 uint8_t max_dest_rd_atomic) {
    struct ibv_qp_attr attr = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = dest->mtu,
        .dest_qp_num = dest->qpn,
        .rq_psn = rq_psn & 0xFFFFFF,
        .max_dest_rd_atomic = max_dest_rd_atomic,
        .min_rnr_timer = min_rnr_timer,
        .ah_attr = {.dlid = (uint16_t)dest->lid, .port_num = qp->ctx->port},
    };
    if (qp->ctx->link_layer == IBV_LINK_LAYER_ETHERNET) { /* no LIDs on Ethernet: the GID in a GRH */
        attr.ah_attr.is_global = 1;
        memcpy(attr.ah_attr.grh.dgid.raw, dest->gid, 16);
        attr.ah_attr.grh.sgid_index = (uint8_t)dest->sgid_index;
        attr.ah_attr.grh.hop_limit = SV_HOP_LIMIT;
    }
    int mask = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
               IBV_QP_MIN_RNR_TIMER;
    return modify(qp, &attr, mask, "RTR");
}

int sv_qp_to_rts(sv_qp *qp, uint8_t timeout, uint8_t retry_cnt, uint8_t rnr_retry, uint32_t sq_psn,
                 uint8_t max_rd_atomic) {
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_RTS, .timeout = timeout, .retry_cnt = retry_cnt,
                               .rnr_retry = rnr_retry, .sq_psn = sq_psn & 0xFFFFFF,
                               .max_rd_atomic = max_rd_atomic};
    int mask = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
    return modify(qp, &attr, mask, "RTS");
}

int sv_qp_set_min_rnr_timer(sv_qp *qp, uint8_t min_rnr_timer) {
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_RTS, .min_rnr_timer = min_rnr_timer};
    return modify(qp, &attr, IBV_QP_MIN_RNR_TIMER, "RTS");
}

int sv_qp_to_err(sv_qp *qp) {
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_ERR};
    return modify(qp, &attr, 0, "ERR");
}

int sv_qp_reset(sv_qp *qp) {
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_RESET};
    return modify(qp, &attr, 0, "RESET");
}

static int is_atomic(uint32_t opcode) {
    return opcode == IBV_WR_ATOMIC_CMP_AND_SWP || opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

/* The tcp engine's checks of one send WR (requester.c). */
static enum sc_post_error check_send(const sv_qp *qp, const struct sc_send_wr *wr) {
    if (wr->opcode > IBV_WR_ATOMIC_FETCH_AND_ADD) return SC_POST_OPCODE;
    if (wr->num_sge > qp->cap.max_send_sge) return SC_POST_SGES;
    uint64_t length = 0;
    for (uint32_t i = 0; i < wr->num_sge; i++) length += wr->sg[i].length;
    if (length > UINT32_MAX) return SC_POST_SGES;
    int reads = wr->opcode == IBV_WR_RDMA_READ || is_atomic(wr->opcode);
    if ((wr->send_flags & IBV_SEND_INLINE) && !reads && length > qp->cap.max_inline_data) return SC_POST_INLINE;
    if (is_atomic(wr->opcode) && (wr->num_sge != 1 || length != 8)) return SC_POST_ATOMIC;
    return SC_POST_OK;
}

static void to_ibv(const struct sc_send_wr *in, struct ibv_send_wr *out) {
    memset(out, 0, sizeof *out);
    out->wr_id = in->wr_id;
    out->sg_list = (struct ibv_sge *)(uintptr_t)in->sg; /* the device only reads it */
    out->num_sge = (int)in->num_sge;
    out->opcode = in->opcode;
    out->send_flags = in->send_flags;
    if (in->opcode == IBV_WR_SEND_WITH_IMM || in->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
        out->imm_data = htonl(in->imm_data);
    if (is_atomic(in->opcode)) {
        out->wr.atomic.remote_addr = in->remote_addr;
        out->wr.atomic.rkey = in->rkey;
        out->wr.atomic.compare_add = in->compare_add;
        out->wr.atomic.swap = in->swap;
    } else {
        out->wr.rdma.remote_addr = in->remote_addr;
        out->wr.rdma.rkey = in->rkey;
    }
}

/* What the device's refusal means: ENOMEM is a full queue, anything else the device's own reason. */
static enum sc_post_error refused(const sv_qp *qp, const char *verb, int err) {
    if (err == ENOMEM) return SC_POST_QUEUE_FULL;
    sv_fail("QP %u: %s: %s", qp->ibv->qp_num, verb, strerror(err));
    return SC_POST_DEVICE;
}

enum sc_post_error sv_qp_post_send(sv_qp *qp, const struct sc_send_wr *wrs, int n, int *posted) {
    *posted = 0;
    enum ibv_qp_state state = qp->ibv->state; /* what the last modify set, as libibverbs' checks use */
    if (state != IBV_QPS_RTS && state != IBV_QPS_SQD && state != IBV_QPS_SQE && state != IBV_QPS_ERR)
        return SC_POST_STATE;
    struct ibv_send_wr batch[SV_POST_BATCH];
    while (*posted < n) {
        enum sc_post_error err = SC_POST_OK;
        int count = 0;
        for (; count < SV_POST_BATCH && *posted + count < n; count++) {
            const struct sc_send_wr *wr = &wrs[*posted + count];
            if ((err = check_send(qp, wr)) != SC_POST_OK) break;
            to_ibv(wr, &batch[count]);
            batch[count].next = NULL;
            if (count) batch[count - 1].next = &batch[count];
        }
        struct ibv_send_wr *bad = NULL;
        int rc = count ? ibv_post_send(qp->ibv, batch, &bad) : 0;
        if (rc) {
            if (bad) *posted += (int)(bad - batch); /* those before the refused one went in */
            return refused(qp, "ibv_post_send", rc);
        }
        *posted += count;
        if (err) return err;
    }
    return SC_POST_OK;
}

enum sc_post_error sv_qp_post_recv(sv_qp *qp, const struct sc_recv_wr *wrs, int n, int *posted) {
    *posted = 0;
    if (qp->ibv->state == IBV_QPS_RESET) return SC_POST_STATE;
    struct ibv_recv_wr batch[SV_POST_BATCH];
    while (*posted < n) {
        enum sc_post_error err = SC_POST_OK;
        int count = 0;
        for (; count < SV_POST_BATCH && *posted + count < n; count++) {
            const struct sc_recv_wr *wr = &wrs[*posted + count];
            if (wr->num_sge > qp->cap.max_recv_sge) {
                err = SC_POST_SGES;
                break;
            }
            batch[count] = (struct ibv_recv_wr){.wr_id = wr->wr_id,
                                                .sg_list = (struct ibv_sge *)(uintptr_t)wr->sg,
                                                .num_sge = (int)wr->num_sge};
            if (count) batch[count - 1].next = &batch[count];
        }
        struct ibv_recv_wr *bad = NULL;
        int rc = count ? ibv_post_recv(qp->ibv, batch, &bad) : 0;
        if (rc) {
            if (bad) *posted += (int)(bad - batch); /* those before the refused one went in */
            return refused(qp, "ibv_post_recv", rc);
        }
        *posted += count;
        if (err) return err;
    }
    return SC_POST_OK;
}

int sv_qp_free(sv_qp *qp) {
    int err = qp->ctx->lib->destroy_qp(qp->ibv);
    if (err) {
        sv_fail("ibv_destroy_qp: %s", strerror(err));
        return err;
    }
    free(qp);
    return 0;
}
