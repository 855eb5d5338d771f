/* Unit tests of the core's verbs backend (verbs_core.h) on two RDMA devices of one machine, RC between
 * them, and of the data path table (datapath.h) over both backends: test_verbs DEV_A GID_INDEX_A DEV_B
 * GID_INDEX_B; without arguments, the table over the tcp engine alone (a host without devices).
 * tests/core/test_verbs_c.py runs it (in the Soft-RoCE VM on rxe0 and rxe1) under ASan and UBSan.
 * Prints "N passed, M failed"; exits non-zero on a failure. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "../datapath.h"
#include "../verbs_core.h"
#include "pair.h"

#define CHECK_DETAIL sv_error()
#include "check.h"

enum { WITH_IMM = WC_FLAG_WITH_IMM, QPS_INIT = SC_QPS_INIT, QPS_RTS = SC_QPS_RTS, QPS_ERR = SC_QPS_ERR };
enum { ALL_ACCESS = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC };
#define MEM 65536
#define WAIT_MS 30000 /* TCG runs the guest ten times slower than the host */

struct side {
    sv_ctx *ctx;
    sv_pd *pd;
    sv_chan *chan;
    sv_cq *cq;
    sv_mr *mr;
    sv_qp *qp;
    uint8_t *mem;
    int gid_index;
    uint32_t psn;
};

static int side_open(struct side *s, const char *name, int gid_index, uint64_t cookie) {
    memset(s, 0, sizeof *s);
    s->gid_index = gid_index;
    s->psn = 0x100 + (uint32_t)cookie;
    struct sc_cap cap = {16, 16, 2, 2, 64};
    if (!(s->ctx = sv_ctx_open(name, 1)) || !(s->pd = sv_pd_new(s->ctx)) || !(s->chan = sv_chan_new(s->ctx)) ||
        !(s->cq = sv_cq_new(s->ctx, 64, s->chan, cookie)) || !(s->mem = aligned_alloc(4096, MEM)) ||
        !(s->mr = sv_mr_reg(s->pd, s->mem, MEM, ALL_ACCESS)) ||
        !(s->qp = sv_qp_new(s->pd, s->cq, s->cq, &cap, 0)))
        return 0;
    memset(s->mem, 0, MEM);
    return 1;
}

static void side_close(struct side *s) {
    if (s->qp) CHECK(sv_qp_free(s->qp) == 0);
    if (s->cq) CHECK(sv_cq_free(s->cq) == 0);
    if (s->chan) CHECK(sv_chan_free(s->chan) == 0);
    if (s->mr) CHECK(sv_mr_dereg(s->mr) == 0);
    if (s->pd) sv_pd_free(s->pd);
    if (s->ctx) sv_ctx_free(s->ctx);
    free(s->mem);
}

/* from RESET to RTS towards peer */
static int side_connect(struct side *s, const struct side *peer) {
    struct sv_port mine, theirs;
    struct sv_dest dest = {.qpn = sv_qp_num(peer->qp), .sgid_index = (uint32_t)s->gid_index};
    if (sv_ctx_port(s->ctx, &mine) || sv_ctx_port(peer->ctx, &theirs) ||
        sv_ctx_gid(peer->ctx, peer->gid_index, dest.gid))
        return 0;
    dest.lid = theirs.lid;
    dest.mtu = mine.active_mtu < theirs.active_mtu ? mine.active_mtu : theirs.active_mtu;
    return sv_qp_to_init(s->qp, ALL_ACCESS) == 0 && sv_qp_state(s->qp) == QPS_INIT &&
           sv_qp_to_rtr(s->qp, &dest, peer->psn, 1, 4) == 0 && sv_qp_to_rts(s->qp, 14, 7, 7, s->psn, 4) == 0;
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int dp_wait_wc(const struct sc_dp *dp, void *cq, struct sc_wc *wc) {
    for (int64_t end = now_ms() + WAIT_MS; now_ms() < end;) {
        int got = dp->cq_poll(cq, 1, wc);
        if (got) return got == 1;
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static int wait_wc(sv_cq *cq, struct sc_wc *wc) { return dp_wait_wc(&sc_dp_verbs, cq, wc); }

static struct sc_sge sge(const struct side *s, uint32_t offset, uint32_t length) {
    return (struct sc_sge){(uint64_t)(uintptr_t)(s->mem + offset), length, sv_mr_lkey(s->mr)};
}

static uint64_t remote(const struct side *s, uint32_t offset) { return (uint64_t)(uintptr_t)(s->mem + offset); }

static int post_one(sv_qp *qp, const struct sc_send_wr *wr) {
    int posted;
    return sv_qp_post_send(qp, wr, 1, &posted) == SC_POST_OK && posted == 1;
}

static int post_recv_at(struct side *s, uint64_t wr_id, uint32_t offset) {
    struct sc_sge sg = sge(s, offset, 256);
    struct sc_recv_wr wr = {.wr_id = wr_id, .num_sge = 1, .sg = &sg};
    int posted;
    return sv_qp_post_recv(s->qp, &wr, 1, &posted) == SC_POST_OK && posted == 1;
}

/* Two sides on the devices argv names, connected; 0 when that failed (side_close closes what opened). */
static int pair_open(struct side *a, struct side *b, char **argv) {
    memset(b, 0, sizeof *b);
    int opened = side_open(a, argv[1], atoi(argv[2]), 1) && side_open(b, argv[3], atoi(argv[4]), 2);
    CHECK(opened);
    int connected = opened && side_connect(a, b) && side_connect(b, a);
    CHECK(connected);
    CHECK(connected && sv_qp_state(a->qp) == QPS_RTS && sv_qp_state(b->qp) == QPS_RTS);
    return connected;
}

static void test_a_missing_device_is_an_error(void) {
    CHECK(sv_available());
    CHECK(sv_ctx_open("no-such-device", 1) == NULL);
    CHECK(strstr(sv_error(), "no RDMA device called no-such-device") != NULL);
}

static void test_send_with_imm_wakes_the_channel(struct side *a, struct side *b) {
    memcpy(a->mem, "hello", 5);
    CHECK(post_recv_at(b, 7, 1024));
    CHECK(sv_cq_req_notify(b->cq, 0) == 0);
    struct pollfd pfd = {.fd = sv_chan_fd(b->chan), .events = POLLIN};
    CHECK(poll(&pfd, 1, 0) == 0); /* nothing yet */
    struct sc_sge sg = sge(a, 0, 5);
    struct sc_send_wr wr = {.wr_id = 1, .opcode = WR_SEND_IMM, .send_flags = SEND_SIGNALED, .imm_data = 0x01020304,
                            .num_sge = 1, .sg = &sg};
    CHECK(post_one(a->qp, &wr));
    CHECK(poll(&pfd, 1, WAIT_MS) == 1); /* the fd wakes a poller for the completion */
    uint64_t cookie = 0;
    CHECK(sv_chan_take(b->chan, &cookie) == 1 && cookie == 2);
    struct sc_wc wc;
    CHECK(wait_wc(b->cq, &wc) && wc.wr_id == 7 && wc.status == WC_SUCCESS && wc.opcode == WCO_RECV &&
          wc.byte_len == 5 && (wc.wc_flags & WITH_IMM) && wc.imm_data == 0x01020304 &&
          wc.qp_num == sv_qp_num(b->qp) && wc.src_qp == 0);
    CHECK(memcmp(b->mem + 1024, "hello", 5) == 0);
    CHECK(wait_wc(a->cq, &wc) && wc.wr_id == 1 && wc.status == WC_SUCCESS && wc.opcode == WCO_SEND);
    CHECK(sv_chan_take(b->chan, &cookie) == 0); /* taken: nothing left */
}

static void test_write_read_and_write_with_imm(struct side *a, struct side *b) {
    memcpy(a->mem + 64, "written", 7);
    struct sc_sge sg = sge(a, 64, 7);
    struct sc_send_wr write = {.wr_id = 2, .opcode = WR_RDMA_WRITE, .send_flags = SEND_SIGNALED, .rkey = sv_mr_rkey(b->mr),
                               .remote_addr = remote(b, 2048), .num_sge = 1, .sg = &sg};
    CHECK(post_one(a->qp, &write));
    struct sc_wc wc;
    CHECK(wait_wc(a->cq, &wc) && wc.wr_id == 2 && wc.status == WC_SUCCESS && wc.opcode == WCO_RDMA_WRITE);
    CHECK(memcmp(b->mem + 2048, "written", 7) == 0);

    memcpy(b->mem + 4096, "far away", 8);
    struct sc_sge into = sge(a, 128, 8);
    struct sc_send_wr read = {.wr_id = 3, .opcode = WR_RDMA_READ, .send_flags = SEND_SIGNALED, .rkey = sv_mr_rkey(b->mr),
                              .remote_addr = remote(b, 4096), .num_sge = 1, .sg = &into};
    CHECK(post_one(a->qp, &read));
    CHECK(wait_wc(a->cq, &wc) && wc.wr_id == 3 && wc.status == WC_SUCCESS && wc.opcode == WCO_RDMA_READ &&
          wc.byte_len == 8);
    CHECK(memcmp(a->mem + 128, "far away", 8) == 0);

    CHECK(post_recv_at(b, 8, 1024));
    struct sc_send_wr with_imm = write;
    with_imm.wr_id = 4;
    with_imm.opcode = WR_RDMA_WRITE_IMM;
    with_imm.imm_data = 77;
    with_imm.remote_addr = remote(b, 3000);
    with_imm.send_flags = SEND_SIGNALED | SEND_INLINE;
    CHECK(post_one(a->qp, &with_imm));
    CHECK(wait_wc(a->cq, &wc) && wc.wr_id == 4 && wc.status == WC_SUCCESS);
    CHECK(wait_wc(b->cq, &wc) && wc.wr_id == 8 && wc.opcode == WCO_RECV_RDMA_WITH_IMM && wc.imm_data == 77 &&
          wc.byte_len == 7);
    CHECK(memcmp(b->mem + 3000, "written", 7) == 0);
}

static void test_atomics(struct side *a, struct side *b) {
    uint64_t forty = 40, got;
    memcpy(b->mem + 8192, &forty, 8);
    struct sc_sge into = sge(a, 256, 8);
    struct sc_send_wr add = {.wr_id = 5, .opcode = WR_FETCH_ADD, .send_flags = SEND_SIGNALED,
                             .rkey = sv_mr_rkey(b->mr), .remote_addr = remote(b, 8192), .compare_add = 2,
                             .num_sge = 1, .sg = &into};
    CHECK(post_one(a->qp, &add));
    struct sc_wc wc;
    CHECK(wait_wc(a->cq, &wc) && wc.wr_id == 5 && wc.status == WC_SUCCESS && wc.opcode == WCO_FETCH_ADD);
    memcpy(&got, a->mem + 256, 8);
    CHECK(got == 40);
    memcpy(&got, b->mem + 8192, 8);
    CHECK(got == 42);
    struct sc_send_wr swap = add;
    swap.wr_id = 6;
    swap.opcode = WR_CMP_SWP;
    swap.compare_add = 42;
    swap.swap = 7;
    CHECK(post_one(a->qp, &swap));
    CHECK(wait_wc(a->cq, &wc) && wc.wr_id == 6 && wc.status == WC_SUCCESS && wc.opcode == WCO_COMP_SWAP);
    memcpy(&got, b->mem + 8192, 8);
    CHECK(got == 7);
}

/* WRITEs (no receive needed, unsignaled: no WC) and WRs the backend refuses before the device sees them */
static void test_refusals(struct side *a, const struct side *b) {
    struct sc_sge sg[3] = {sge(a, 0, 8), sge(a, 8, 8), sge(a, 16, 8)};
    struct sc_send_wr wrs[2] = {
        {.wr_id = 9, .opcode = WR_RDMA_WRITE, .rkey = sv_mr_rkey(b->mr), .remote_addr = remote(b, 12288),
         .num_sge = 1, .sg = sg},
        {.wr_id = 10, .opcode = WR_RDMA_WRITE, .rkey = sv_mr_rkey(b->mr), .remote_addr = remote(b, 12288),
         .num_sge = 3, .sg = sg},
    };
    struct sc_cap cap;
    sv_qp_cap(a->qp, &cap);
    CHECK(cap.max_send_wr >= 16 && cap.max_send_sge >= 2 && cap.max_inline_data >= 64);
    int posted = -1;
    enum sc_post_error err = sv_qp_post_send(a->qp, wrs, 2, &posted);
    CHECK(err == (cap.max_send_sge < 3 ? SC_POST_SGES : SC_POST_OK) && posted == (err ? 1 : 2));
    struct sc_send_wr odd = {.wr_id = 11, .opcode = 99, .num_sge = 1, .sg = sg};
    CHECK(sv_qp_post_send(a->qp, &odd, 1, &posted) == SC_POST_OPCODE && posted == 0);
    odd.opcode = WR_FETCH_ADD; /* an atomic on 16 bytes */
    odd.num_sge = 2;
    CHECK(sv_qp_post_send(a->qp, &odd, 1, &posted) == SC_POST_ATOMIC && posted == 0);
    struct sc_sge big = sge(a, 0, cap.max_inline_data + 1);
    struct sc_send_wr inl = {.wr_id = 12, .opcode = WR_SEND, .send_flags = SEND_INLINE, .num_sge = 1, .sg = &big};
    CHECK(sv_qp_post_send(a->qp, &inl, 1, &posted) == SC_POST_INLINE && posted == 0);
}

static void test_channel_wait_and_wake(struct side *a) {
    uint64_t cookie = 0;
    int64_t t0 = now_ms();
    CHECK(sv_chan_wait(a->chan, 50, 1, &cookie) == 0);
    CHECK(now_ms() - t0 >= 50);
    sv_chan_wake(a->chan);
    sv_chan_wake(a->chan);
    CHECK(sv_chan_wait(a->chan, WAIT_MS, 0, &cookie) == 2);
    CHECK(sv_chan_take(a->chan, &cookie) == 0); /* two wakes before a take are one */
    struct sv_event event;
    CHECK(sv_ctx_event(a->ctx, &event) == 0); /* none, and the call does not block */
}

static void test_a_bad_rkey_is_a_remote_access_error(struct side *a, struct side *b) {
    uint8_t before[64];
    memcpy(before, b->mem + 16384, sizeof before);
    struct sc_sge sg = sge(a, 0, 8);
    struct sc_send_wr write = {.wr_id = 20, .opcode = WR_RDMA_WRITE, .send_flags = SEND_SIGNALED,
                               .rkey = sv_mr_rkey(b->mr) ^ 0x80, .remote_addr = remote(b, 16384),
                               .num_sge = 1, .sg = &sg};
    CHECK(post_one(a->qp, &write));
    struct sc_wc wc;
    CHECK(wait_wc(a->cq, &wc) && wc.wr_id == 20 && wc.status == WC_REM_ACCESS_ERR);
    CHECK(memcmp(before, b->mem + 16384, sizeof before) == 0);
    CHECK(sv_qp_state(a->qp) == QPS_ERR);
    write.wr_id = 21;
    write.rkey = sv_mr_rkey(b->mr);
    int posted;
    enum sc_post_error err = sv_qp_post_send(a->qp, &write, 1, &posted);
    CHECK(err == SC_POST_OK); /* an ERR QP takes the post and flushes it */
    CHECK(wait_wc(a->cq, &wc) && wc.wr_id == 21 && wc.status == WC_WR_FLUSH_ERR);
}

/* -- the data path table (datapath.h): one scenario, either backend ---------------------------------- */

/* One side of a connected pair as the table sees it: its QP, CQ and channel, and its memory's keys. */
struct end {
    void *qp, *cq, *chan;
    uint8_t *mem;
    uint32_t lkey, rkey;
    uint64_t cookie;
};

static void exercise(const struct sc_dp *dp, const struct end *a, const struct end *b) {
    struct sc_sge into = {(uint64_t)(uintptr_t)(b->mem + 1024), 256, b->lkey};
    struct sc_recv_wr recv = {.wr_id = 30, .num_sge = 1, .sg = &into};
    int posted;
    CHECK(dp->post_recv(b->qp, &recv, 1, &posted) == SC_POST_OK && posted == 1);
    CHECK(dp->cq_req_notify(b->cq, 0) == 0);
    memcpy(a->mem, "table", 5);
    struct sc_sge from = {(uint64_t)(uintptr_t)a->mem, 5, a->lkey};
    struct sc_send_wr send = {.wr_id = 31, .opcode = WR_SEND_IMM, .send_flags = SEND_SIGNALED, .imm_data = 5,
                              .num_sge = 1, .sg = &from};
    CHECK(dp->post_send(a->qp, &send, 1, &posted) == SC_POST_OK && posted == 1);
    struct pollfd pfd = {.fd = dp->chan_fd(b->chan), .events = POLLIN};
    CHECK(poll(&pfd, 1, WAIT_MS) == 1);
    uint64_t cookie = 0;
    CHECK(dp->chan_take(b->chan, &cookie) == 1 && cookie == b->cookie);
    struct sc_wc wc;
    CHECK(dp_wait_wc(dp, b->cq, &wc) && wc.wr_id == 30 && wc.status == WC_SUCCESS && wc.opcode == WCO_RECV &&
          wc.imm_data == 5 && wc.byte_len == 5 && memcmp(b->mem + 1024, "table", 5) == 0);
    CHECK(dp_wait_wc(dp, a->cq, &wc) && wc.wr_id == 31 && wc.status == WC_SUCCESS && wc.opcode == WCO_SEND);

    struct sc_send_wr write = {.wr_id = 32, .opcode = WR_RDMA_WRITE, .send_flags = SEND_SIGNALED, .rkey = b->rkey,
                               .remote_addr = (uint64_t)(uintptr_t)(b->mem + 2048), .num_sge = 1, .sg = &from};
    CHECK(dp->post_send(a->qp, &write, 1, &posted) == SC_POST_OK);
    CHECK(dp_wait_wc(dp, a->cq, &wc) && wc.wr_id == 32 && wc.status == WC_SUCCESS &&
          memcmp(b->mem + 2048, "table", 5) == 0);

    dp->chan_wake(a->chan);
    CHECK(dp->chan_wait(a->chan, WAIT_MS, 0, &cookie) == 2);
    CHECK(dp->qp_to_err(a->qp) == 0 && dp->qp_state(a->qp) == SC_QPS_ERR);
    write.wr_id = 33;
    CHECK(dp->post_send(a->qp, &write, 1, &posted) == SC_POST_OK); /* flushed */
    CHECK(dp_wait_wc(dp, a->cq, &wc) && wc.wr_id == 33 && wc.status == WC_WR_FLUSH_ERR);
}

static void test_the_table_over_verbs(struct side *a, struct side *b) {
    struct end ea = {a->qp, a->cq, a->chan, a->mem, sv_mr_lkey(a->mr), sv_mr_rkey(a->mr), 1};
    struct end eb = {b->qp, b->cq, b->chan, b->mem, sv_mr_lkey(b->mr), sv_mr_rkey(b->mr), 2};
    exercise(&sc_dp_verbs, &ea, &eb);
}

static void test_the_table_over_tcp(void) {
    static uint8_t ma[MEM], mb[MEM];
    int fds[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) == 0);
    sc_ctx *ca = sc_ctx_new(), *cb = sc_ctx_new();
    sc_pd *pa = sc_pd_new(ca), *pb = sc_pd_new(cb);
    sc_chan *chan_a = sc_chan_new(ca), *chan_b = sc_chan_new(cb);
    sc_cq *cq_a = sc_cq_new(ca, 64, chan_a, 1), *cq_b = sc_cq_new(cb, 64, chan_b, 2);
    sc_mr *ra = sc_mr_reg(pa, ma, MEM, ALL_ACCESS), *rb = sc_mr_reg(pb, mb, MEM, ALL_ACCESS);
    struct end ea = {qp_on_fd(pa, cq_a, fds[0], 1, 2), cq_a, chan_a, ma, sc_mr_lkey(ra), sc_mr_rkey(ra), 1};
    struct end eb = {qp_on_fd(pb, cq_b, fds[1], 2, 1), cq_b, chan_b, mb, sc_mr_lkey(rb), sc_mr_rkey(rb), 2};
    exercise(&sc_dp_tcp, &ea, &eb);
    sc_ctx_free(ca); /* frees every object of the context */
    sc_ctx_free(cb);
}

int main(int argc, char **argv) {
    if (argc != 1 && argc != 5) {
        fprintf(stderr, "usage: %s [DEV_A GID_INDEX_A DEV_B GID_INDEX_B]\n", argv[0]);
        return 2;
    }
    test_the_table_over_tcp();
    test_a_missing_device_is_an_error();
    if (argc == 1) {
        printf("%d passed, %d failed\n", passed, failed);
        return failed ? 1 : 0;
    }
    struct side a, b;
    if (pair_open(&a, &b, argv)) {
        test_send_with_imm_wakes_the_channel(&a, &b);
        test_write_read_and_write_with_imm(&a, &b);
        test_atomics(&a, &b);
        test_refusals(&a, &b);
        test_channel_wait_and_wake(&a);
        test_a_bad_rkey_is_a_remote_access_error(&a, &b);
    }
    side_close(&a);
    side_close(&b);
    if (pair_open(&a, &b, argv)) test_the_table_over_verbs(&a, &b); /* fresh QPs: those above ended in ERR */
    side_close(&a);
    side_close(&b);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
