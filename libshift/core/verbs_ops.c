/* The verbs backend's data path as a datapath.h table. */
#include "datapath.h"
#include "verbs_core.h"

static enum sc_post_error post_send(void *qp, const struct sc_send_wr *wrs, int n, int *posted) {
    return sv_qp_post_send(qp, wrs, n, posted);
}
static enum sc_post_error post_recv(void *qp, const struct sc_recv_wr *wrs, int n, int *posted) {
    return sv_qp_post_recv(qp, wrs, n, posted);
}
static int qp_state(void *qp) { return sv_qp_state(qp); }
static int qp_to_err(void *qp) { return sv_qp_to_err(qp); }
static int cq_poll(void *cq, int n, struct sc_wc *out) { return sv_cq_poll(cq, n, out); }
static int cq_req_notify(void *cq, int solicited_only) { return sv_cq_req_notify(cq, solicited_only); }
static int chan_fd(const void *chan) { return sv_chan_fd(chan); }
static int chan_take(void *chan, uint64_t *cookie) { return sv_chan_take(chan, cookie); }
static int chan_wait(void *chan, int timeout_ms, int drive, uint64_t *cookie) {
    return sv_chan_wait(chan, timeout_ms, drive, cookie);
}
static void chan_wake(void *chan) { sv_chan_wake(chan); }

/* a device's CQ fills by itself (the RNIC, or rxe's kernel threads): a peek and a look are a poll */
const struct sc_dp sc_dp_verbs = {.name = "verbs",
                                  .post_send = post_send,
                                  .post_recv = post_recv,
                                  .qp_state = qp_state,
                                  .qp_to_err = qp_to_err,
                                  .cq_poll = cq_poll,
                                  .cq_peek = cq_poll,
                                  .cq_look = cq_poll,
                                  .cq_req_notify = cq_req_notify,
                                  .chan_fd = chan_fd,
                                  .chan_take = chan_take,
                                  .chan_wait = chan_wait,
                                  .chan_wake = chan_wake};
