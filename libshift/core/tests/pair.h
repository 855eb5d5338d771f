/* Test helpers shared by the unit tests and the fuzz target: QPs in RTS on a socket of the caller's. */
#ifndef SHIFT_CORE_TESTS_PAIR_H
#define SHIFT_CORE_TESTS_PAIR_H

#include "../internal.h"

/* A QP of pd in RTS towards a peer called remote_qpn on 127.0.0.1, with no connection yet: with the
 * larger QPN it waits for the peer's, through a listener. */
static inline sc_qp *qp_unconnected(sc_pd *pd, sc_cq *cq, uint32_t qpn, uint32_t remote_qpn) {
    struct sc_cap cap = {16, 16, 4, 4, 64};
    sc_qp *qp = sc_qp_new(pd, cq, cq, &cap, 0, qpn, 0x7f000001);
    sc_qp_to_init(qp, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC);
    sc_qp_to_rtr(qp, 0x7f000001, remote_qpn, 100, 1, -1);
    sc_qp_to_rts(qp, 2000000000ull, 500000000ull, 7, 100);
    return qp;
}

/* qp_unconnected, on fd as its connection: welcomed (the HELLOs exchanged), or still waiting for the
 * peer's answer to its HELLO. */
static inline sc_qp *qp_on_fd_as(sc_pd *pd, sc_cq *cq, int fd, uint32_t qpn, uint32_t remote_qpn, int welcomed) {
    sc_qp *qp = qp_unconnected(pd, cq, qpn, remote_qpn);
    pthread_mutex_lock(&pd->ctx->lock);
    qp->conn = sc_conn_new(pd->ctx, qp, fd);
    qp->welcomed = welcomed;
    pthread_mutex_unlock(&pd->ctx->lock);
    return qp;
}

static inline sc_qp *qp_on_fd(sc_pd *pd, sc_cq *cq, int fd, uint32_t qpn, uint32_t remote_qpn) {
    return qp_on_fd_as(pd, cq, fd, qpn, remote_qpn, 1);
}

#endif
