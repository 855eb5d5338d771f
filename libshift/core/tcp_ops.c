/* The tcp engine's data path as a datapath.h table. */
#include "datapath.h"

static enum sc_post_error post_send(void *qp, const struct sc_send_wr *wrs, int n, int *posted) {
    return sc_qp_post_send(qp, wrs, n, posted);
}
static enum sc_post_error post_recv(void *qp, const struct sc_recv_wr *wrs, int n, int *posted) {
    return sc_qp_post_recv(qp, wrs, n, posted);
}
static int qp_state(void *qp) { return sc_qp_state(qp); }
static int qp_to_err(void *qp) {
    sc_qp_to_err(qp);
    return 0;
}
static int cq_poll(void *cq, int n, struct sc_wc *out) { return sc_cq_poll(cq, n, out); }
static int cq_peek(void *cq, int n, struct sc_wc *out) { return sc_cq_peek(cq, n, out); }
static int cq_look(void *cq, int n, struct sc_wc *out) { return sc_cq_look(cq, n, out); }
static int cq_req_notify(void *cq, int solicited_only) {
    sc_cq_req_notify(cq, solicited_only);
    return 0;
}
static int chan_fd(const void *chan) { return sc_chan_fd(chan); }
static int chan_take(void *chan, uint64_t *cookie) { return sc_chan_take(chan, cookie); }
static int chan_wait(void *chan, int timeout_ms, int drive, uint64_t *cookie) {
    return sc_chan_wait(chan, timeout_ms, drive, cookie);
}
static void chan_wake(void *chan) { sc_chan_wake(chan); }

const struct sc_dp sc_dp_tcp = {.name = "tcp",
                                .post_send = post_send,
                                .post_recv = post_recv,
                                .qp_state = qp_state,
                                .qp_to_err = qp_to_err,
                                .cq_poll = cq_poll,
                                .cq_peek = cq_peek,
                                .cq_look = cq_look,
                                .cq_req_notify = cq_req_notify,
                                .chan_fd = chan_fd,
                                .chan_take = chan_take,
                                .chan_wait = chan_wait,
                                .chan_wake = chan_wake};
