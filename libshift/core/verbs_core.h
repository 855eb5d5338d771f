/* The core's verbs backend: RC queue pairs on an RDMA device, driving libibverbs directly.
 *
 * The data path has the tcp engine's shape (shift_core.h): the same sc_send_wr, sc_recv_wr, sc_wc and
 * sc_cap, the same post refusals and the same channel calls (a cookie per CQ, an fd to wait on, a take that
 * never blocks, a wake), so that one layer above (the failover layer of issue 18's item 3) drives either
 * through sv_dp / sc_dp (datapath.h). What differs is how a QP finds its peer: a GID and a QPN here,
 * sockets there. imm_data is the host's number in both (the wire's big-endian is this file's business).
 *
 * libibverbs is opened with dlopen on the first call (verbs_lib.c); every call that can fail returns NULL
 * or an errno, and sv_error() says what failed, for this thread. The device makes the progress: there is
 * no progress thread and no lock here; libibverbs' objects are thread-safe. A caller frees an object only
 * after those made on it (QPs, then CQs, then channels, MRs, PDs, then the context).
 */
#ifndef SHIFT_CORE_VERBS_CORE_H
#define SHIFT_CORE_VERBS_CORE_H

#include <stdint.h>

#include "shift_core.h"

typedef struct sv_ctx sv_ctx;
typedef struct sv_pd sv_pd;
typedef struct sv_mr sv_mr;
typedef struct sv_cq sv_cq;
typedef struct sv_chan sv_chan;
typedef struct sv_qp sv_qp;

/* What a QP needs of its port, and what a peer's endpoint carries. */
struct sv_port {
    uint32_t state, active_mtu, lid, link_layer, gid_tbl_len; /* ibverbs' numbers */
};

/* The peer of a QP going to RTR: a GID on RoCE (through sgid_index of the local port), a LID on IB. */
struct sv_dest {
    uint8_t gid[16];
    uint32_t qpn, lid, sgid_index, mtu; /* mtu: ibv_mtu (1: 256 ... 5: 4096) */
};

/* An asynchronous event of the device (ibv_event_type), and whose: a QP's number, a port, or a CQ's cookie. */
struct sv_event {
    uint32_t type, qp_num, port;
    uint64_t cq_cookie;
};

/* 1 when libibverbs can be loaded, else 0 (sv_error() says why). */
int sv_available(void);
/* The last failure of this thread's calls, one line. */
const char *sv_error(void);

/* The device called name, its port port. */
sv_ctx *sv_ctx_open(const char *name, uint8_t port);
void sv_ctx_free(sv_ctx *ctx);
int sv_ctx_port(sv_ctx *ctx, struct sv_port *out);
int sv_ctx_gid(sv_ctx *ctx, int index, uint8_t out[16]);
/* The async event fd (non-blocking): readable while sv_ctx_event has something. 1: an event, 0: none. */
int sv_ctx_event_fd(const sv_ctx *ctx);
int sv_ctx_event(sv_ctx *ctx, struct sv_event *out);

sv_pd *sv_pd_new(sv_ctx *ctx);
void sv_pd_free(sv_pd *pd);

/* The device's keys: deregistration is immediate (the device holds no reference once it returns). */
sv_mr *sv_mr_reg(sv_pd *pd, void *addr, uint64_t length, uint32_t access);
uint32_t sv_mr_lkey(const sv_mr *mr);
uint32_t sv_mr_rkey(const sv_mr *mr);
int sv_mr_dereg(sv_mr *mr);

/* A completion channel: its fd is readable while an event or a wake-up may be waiting. */
sv_chan *sv_chan_new(sv_ctx *ctx);
int sv_chan_fd(const sv_chan *chan);
/* As sc_chan_take: 1 and the CQ's cookie (the event is acknowledged), 2: woken, 0: nothing now. */
int sv_chan_take(sv_chan *chan, uint64_t *cookie);
/* As sc_chan_wait; drive means nothing here (the device progresses by itself), so it never returns 3. */
int sv_chan_wait(sv_chan *chan, int timeout_ms, int drive, uint64_t *cookie);
void sv_chan_wake(sv_chan *chan);
int sv_chan_free(sv_chan *chan);

sv_cq *sv_cq_new(sv_ctx *ctx, uint32_t cqe, sv_chan *chan, uint64_t cookie);
/* The entries the device granted (at least cqe: rxe rounds up). */
uint32_t sv_cq_cqe(const sv_cq *cq);
/* Up to n completions into out, oldest first; -1 once the device has said the CQ overflowed. */
int sv_cq_poll(sv_cq *cq, int n, struct sc_wc *out);
int sv_cq_req_notify(sv_cq *cq, int solicited_only);
int sv_cq_free(sv_cq *cq);

/* An RC QP; cap is what to ask for, sv_qp_cap what the device granted (at least that). */
sv_qp *sv_qp_new(sv_pd *pd, sv_cq *send_cq, sv_cq *recv_cq, const struct sc_cap *cap, int sq_sig_all);
uint32_t sv_qp_num(const sv_qp *qp);
void sv_qp_cap(const sv_qp *qp, struct sc_cap *out);
/* The state as the device has it (an RNIC moves a QP to ERR by itself); -1 when it cannot be queried. */
int sv_qp_state(sv_qp *qp);
/* The state the last transition set (what posts are checked against, as libibverbs' own checks are). */
int sv_qp_last_state(const sv_qp *qp);
/* The transitions: 0, or an errno from the device. */
int sv_qp_to_init(sv_qp *qp, uint32_t access);
int sv_qp_to_rtr(sv_qp *qp, const struct sv_dest *dest, uint32_t rq_psn, uint8_t min_rnr_timer,
                 uint8_t max_dest_rd_atomic);
int sv_qp_to_rts(sv_qp *qp, uint8_t timeout, uint8_t retry_cnt, uint8_t rnr_retry, uint32_t sq_psn,
                 uint8_t max_rd_atomic);
/* RTS to RTS with another min_rnr_timer (what RTS to RTS may change). */
int sv_qp_set_min_rnr_timer(sv_qp *qp, uint8_t min_rnr_timer);
int sv_qp_to_err(sv_qp *qp);
int sv_qp_reset(sv_qp *qp);
/* As sc_qp_post_send / sc_qp_post_recv; SC_POST_DEVICE: the device refused it (sv_error() says why). */
enum sc_post_error sv_qp_post_send(sv_qp *qp, const struct sc_send_wr *wrs, int n, int *posted);
enum sc_post_error sv_qp_post_recv(sv_qp *qp, const struct sc_recv_wr *wrs, int n, int *posted);
int sv_qp_free(sv_qp *qp);

#endif
