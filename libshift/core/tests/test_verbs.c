/* Unit tests of the core's verbs backend (verbs_core.h) on two RDMA devices of one machine, RC between
 * them: test_verbs DEV_A GID_INDEX_A DEV_B GID_INDEX_B (tests/core/test_verbs_c.py runs it in the Soft-RoCE
 * VM on rxe0 and rxe1, under ASan and UBSan). Prints "N passed, M failed"; exits non-zero on a failure. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../verbs_core.h"

static int passed, failed;

#define CHECK(cond)                                                                                  \
    do {                                                                                             \
        if (cond) passed++;                                                                          \
        else {                                                                                       \
            failed++;                                                                                \
            fprintf(stderr, "%s:%d: %s: check failed: %s (%s)\n", __FILE__, __LINE__, __func__, #cond, \
                    sv_error());                                                                     \
        }                                                                                            \
    } while (0)

/* ibverbs' numbers the tests use (libshift.vocabulary.enums) */
enum { WR_WRITE = 0, WR_WRITE_IMM = 1, WR_SEND = 2, WR_SEND_IMM = 3, WR_READ = 4, WR_CMP_SWP = 5,
       WR_FETCH_ADD = 6 };
enum { WC_SUCCESS = 0, WC_FLUSH = 5, WC_REM_ACCESS = 10 };
enum { WCO_SEND = 0, WCO_WRITE = 1, WCO_READ = 2, WCO_CMP_SWP = 3, WCO_FETCH_ADD = 4, WCO_RECV = 128,
       WCO_RECV_IMM = 129 };
enum { SIGNALED = 2, INLINE = 8, WITH_IMM = 2, QPS_INIT = 1, QPS_RTS = 3, QPS_ERR = 6 };
enum { ALL_ACCESS = 1 | 2 | 4 | 8 };
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

static int wait_wc(sv_cq *cq, struct sc_wc *wc) {
    for (int64_t end = now_ms() + WAIT_MS; now_ms() < end;) {
        int got = sv_cq_poll(cq, 1, wc);
        if (got) return got == 1;
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

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
    struct sc_send_wr wr = {.wr_id = 1, .opcode = WR_SEND_IMM, .send_flags = SIGNALED, .imm_data = 0x01020304,
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
    struct sc_send_wr write = {.wr_id = 2, .opcode = WR_WRITE, .send_flags = SIGNALED, .rkey = sv_mr_rkey(b->mr),
                               .remote_addr = remote(b, 2048), .num_sge = 1, .sg = &sg};
    CHECK(post_one(a->qp, &write));
    struct sc_wc wc;
    CHECK(wait_wc(a->cq, &wc) && wc.wr_id == 2 && wc.status == WC_SUCCESS && wc.opcode == WCO_WRITE);
    CHECK(memcmp(b->mem + 2048, "written", 7) == 0);

    memcpy(b->mem + 4096, "far away", 8);
    struct sc_sge into = sge(a, 128, 8);
    struct sc_send_wr read = {.wr_id = 3, .opcode = WR_READ, .send_flags = SIGNALED, .rkey = sv_mr_rkey(b->mr),
                              .remote_addr = remote(b, 4096), .num_sge = 1, .sg = &into};
    CHECK(post_one(a->qp, &read));
    CHECK(wait_wc(a->cq, &wc) && wc.wr_id == 3 && wc.status == WC_SUCCESS && wc.opcode == WCO_READ &&
          wc.byte_len == 8);
    CHECK(memcmp(a->mem + 128, "far away", 8) == 0);

    CHECK(post_recv_at(b, 8, 1024));
    struct sc_send_wr with_imm = write;
    with_imm.wr_id = 4;
    with_imm.opcode = WR_WRITE_IMM;
    with_imm.imm_data = 77;
    with_imm.remote_addr = remote(b, 3000);
    with_imm.send_flags = SIGNALED | INLINE;
    CHECK(post_one(a->qp, &with_imm));
    CHECK(wait_wc(a->cq, &wc) && wc.wr_id == 4 && wc.status == WC_SUCCESS);
    CHECK(wait_wc(b->cq, &wc) && wc.wr_id == 8 && wc.opcode == WCO_RECV_IMM && wc.imm_data == 77 &&
          wc.byte_len == 7);
    CHECK(memcmp(b->mem + 3000, "written", 7) == 0);
}

static void test_atomics(struct side *a, struct side *b) {
    uint64_t forty = 40, got;
    memcpy(b->mem + 8192, &forty, 8);
    struct sc_sge into = sge(a, 256, 8);
    struct sc_send_wr add = {.wr_id = 5, .opcode = WR_FETCH_ADD, .send_flags = SIGNALED,
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
    CHECK(wait_wc(a->cq, &wc) && wc.wr_id == 6 && wc.status == WC_SUCCESS && wc.opcode == WCO_CMP_SWP);
    memcpy(&got, b->mem + 8192, 8);
    CHECK(got == 7);
}

/* WRITEs (no receive needed, unsignaled: no WC) and WRs the backend refuses before the device sees them */
static void test_refusals(struct side *a, const struct side *b) {
    struct sc_sge sg[3] = {sge(a, 0, 8), sge(a, 8, 8), sge(a, 16, 8)};
    struct sc_send_wr wrs[2] = {
        {.wr_id = 9, .opcode = WR_WRITE, .rkey = sv_mr_rkey(b->mr), .remote_addr = remote(b, 12288),
         .num_sge = 1, .sg = sg},
        {.wr_id = 10, .opcode = WR_WRITE, .rkey = sv_mr_rkey(b->mr), .remote_addr = remote(b, 12288),
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
    struct sc_send_wr inl = {.wr_id = 12, .opcode = WR_SEND, .send_flags = INLINE, .num_sge = 1, .sg = &big};
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
    struct sc_send_wr write = {.wr_id = 20, .opcode = WR_WRITE, .send_flags = SIGNALED,
                               .rkey = sv_mr_rkey(b->mr) ^ 0x80, .remote_addr = remote(b, 16384),
                               .num_sge = 1, .sg = &sg};
    CHECK(post_one(a->qp, &write));
    struct sc_wc wc;
    CHECK(wait_wc(a->cq, &wc) && wc.wr_id == 20 && wc.status == WC_REM_ACCESS);
    CHECK(memcmp(before, b->mem + 16384, sizeof before) == 0);
    CHECK(sv_qp_state(a->qp) == QPS_ERR);
    write.wr_id = 21;
    write.rkey = sv_mr_rkey(b->mr);
    int posted;
    enum sc_post_error err = sv_qp_post_send(a->qp, &write, 1, &posted);
    CHECK(err == SC_POST_OK); /* an ERR QP takes the post and flushes it */
    CHECK(wait_wc(a->cq, &wc) && wc.wr_id == 21 && wc.status == WC_FLUSH);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s DEV_A GID_INDEX_A DEV_B GID_INDEX_B\n", argv[0]);
        return 2;
    }
    test_a_missing_device_is_an_error();
    struct side a = {0}, b = {0};
    int opened = side_open(&a, argv[1], atoi(argv[2]), 1) && side_open(&b, argv[3], atoi(argv[4]), 2);
    CHECK(opened);
    if (opened) {
        int connected = side_connect(&a, &b) && side_connect(&b, &a);
        CHECK(connected);
        CHECK(sv_qp_state(a.qp) == QPS_RTS && sv_qp_state(b.qp) == QPS_RTS);
        if (connected) {
            test_send_with_imm_wakes_the_channel(&a, &b);
            test_write_read_and_write_with_imm(&a, &b);
            test_atomics(&a, &b);
            test_refusals(&a, &b);
            test_channel_wait_and_wake(&a);
            test_a_bad_rkey_is_a_remote_access_error(&a, &b);
        }
    }
    side_close(&a);
    side_close(&b);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
