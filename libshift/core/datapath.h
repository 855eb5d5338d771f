/* The data path of either backend behind one table: what a layer above a transport (the failover layer
 * of issue 18's item 3) calls per work request, whichever transport carries the QP. Objects are the
 * backend's own (sc_qp, sc_cq, sc_chan for tcp; sv_qp, sv_cq, sv_chan for verbs), passed as void *:
 * set-up (a QP's peer, its keys) is transport-specific and stays with each backend's own calls. */
#ifndef SHIFT_CORE_DATAPATH_H
#define SHIFT_CORE_DATAPATH_H

#include <stdint.h>

#include "shift_core.h"

struct sc_dp {
    const char *name;
    enum sc_post_error (*post_send)(void *qp, const struct sc_send_wr *wrs, int n, int *posted);
    enum sc_post_error (*post_recv)(void *qp, const struct sc_recv_wr *wrs, int n, int *posted);
    int (*qp_state)(void *qp);
    int (*qp_to_err)(void *qp); /* 0, or an errno */
    int (*cq_poll)(void *cq, int n, struct sc_wc *out);
    int (*cq_peek)(void *cq, int n, struct sc_wc *out); /* what is made, without driving the transport */
    int (*cq_look)(void *cq, int n, struct sc_wc *out); /* driving it, beside the backend's own thread */
    int (*cq_req_notify)(void *cq, int solicited_only); /* 0, or an errno */
    int (*chan_fd)(const void *chan);
    int (*chan_take)(void *chan, uint64_t *cookie);
    int (*chan_wait)(void *chan, int timeout_ms, int drive, uint64_t *cookie);
    void (*chan_wake)(void *chan);
};

extern const struct sc_dp sc_dp_tcp;   /* tcp_ops.c */
extern const struct sc_dp sc_dp_verbs; /* verbs_ops.c */

#endif
