/* Test helpers shared by the unit tests and the fuzz target: a QP in RTS on a socket of the caller's. */
#ifndef SHIFT_CORE_TESTS_PAIR_H
#define SHIFT_CORE_TESTS_PAIR_H

#include "../internal.h"

/* A QP of pd brought to RTS over fd (its connection), towards a peer called remote_qpn. */
static inline sc_qp *qp_on_fd(sc_pd *pd, sc_cq *cq, int fd, uint32_t qpn, uint32_t remote_qpn) {
    struct sc_cap cap = {16, 16, 4, 4, 64};
    sc_qp *qp = sc_qp_new(pd, cq, cq, &cap, 0, -1, qpn, 0x7f000001);
    sc_qp_to_init(qp, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC);
    sc_qp_to_rtr(qp, 0x7f000001, remote_qpn, 100, 1, -1, 0);
    pthread_mutex_lock(&pd->ctx->lock);
    qp->conn = sc_conn_new(pd->ctx, qp, fd);
    pthread_mutex_unlock(&pd->ctx->lock);
    sc_qp_to_rts(qp, 2000000000ull, 500000000ull, 7, 100);
    return qp;
}

#endif
