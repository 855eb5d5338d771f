/* Unit tests of the C core, built with ASan and UBSan by tests/core/test_core_c.py.
 * Prints "N passed, M failed" and exits non-zero on any failure. */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <linux/if.h>
#include <linux/rtnetlink.h>

#include "../fast_internal.h"
#include "../linkwatch.h"
#include "../priority.h"
#include "check.h"
#include "pair.h"

static void test_wire_layout(void) {
    /* the bytes of struct.pack("!BBHIIIIQQQI", 0x5F, 4, 3, 7, 9, 0xAABBCCDD, 5, 0x1122334455667788, 1, 2, 6) */
    static const uint8_t want[SC_WIRE_HEADER_SIZE] = {
        0x5F, 4, 0, 3, 0, 0, 0, 7, 0, 0, 0, 9, 0xAA, 0xBB, 0xCC, 0xDD, 0, 0, 0, 5,
        0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2,
        0, 0, 0, 6,
    };
    struct sc_hdr hdr = {.op = SC_OP_WRITE, .flags = 3, .seq = 7, .length = 9, .rkey = 0xAABBCCDD, .imm = 5,
                         .addr = 0x1122334455667788ull, .arg1 = 1, .arg2 = 2, .ack = 6};
    uint8_t out[SC_WIRE_HEADER_SIZE];
    sc_wire_pack(&hdr, out);
    CHECK(memcmp(out, want, sizeof want) == 0);
    struct sc_hdr back;
    CHECK(sc_wire_parse(out, &back) == SC_WIRE_OK);
    CHECK(back.addr == hdr.addr && back.rkey == hdr.rkey && back.ack == 6 && back.flags == 3);
    CHECK(sc_wire_payload_length(&back) == 9);
}

static void test_wire_refuses_what_it_cannot_frame(void) {
    uint8_t buf[SC_WIRE_HEADER_SIZE];
    struct sc_hdr hdr = {.op = SC_OP_SEND, .length = 1};
    sc_wire_pack(&hdr, buf);
    struct sc_hdr got;
    buf[0] = 0x60;
    CHECK(sc_wire_parse(buf, &got) == SC_WIRE_BAD_MAGIC);
    buf[0] = SC_WIRE_MAGIC;
    for (unsigned op = 0; op < 256; op++) {
        buf[1] = (uint8_t)op;
        int known = (op >= 1 && op <= 8) || (op >= 16 && op <= 20);
        CHECK((sc_wire_parse(buf, &got) == SC_WIRE_OK) == known);
    }
    buf[1] = SC_OP_SEND;
    buf[8] = 0x80;
    buf[11] = 1; /* 2**31 + 1 */
    CHECK(sc_wire_parse(buf, &got) == SC_WIRE_BAD_LENGTH);
    hdr.op = SC_OP_READ_REQ;
    hdr.length = 4096;
    CHECK(sc_wire_payload_length(&hdr) == 0); /* asked for, not sent */
}

static void test_keys_and_bounds(void) {
    sc_ctx *ctx = sc_ctx_new();
    sc_pd *pd = sc_pd_new(ctx), *other = sc_pd_new(ctx);
    static uint8_t mem[4096];
    sc_mr *mr = sc_mr_reg(pd, mem, sizeof mem, ACCESS_LOCAL_WRITE);
    CHECK(mr && sc_mr_lkey(mr) && sc_mr_rkey(mr) && sc_mr_lkey(mr) != sc_mr_rkey(mr));
    pthread_mutex_lock(&ctx->lock);
    CHECK(sc_mr_local(ctx, pd->id, sc_mr_lkey(mr)) == mr);
    CHECK(sc_mr_local(ctx, other->id, sc_mr_lkey(mr)) == NULL); /* another PD's key */
    CHECK(sc_mr_remote(ctx, pd->id, sc_mr_lkey(mr)) == NULL);   /* an lkey is no rkey */
    struct sc_span span;
    uint64_t base = (uint64_t)(uintptr_t)mem;
    CHECK(sc_mr_span(mr, base, 4096, &span) && span.ptr == mem);
    sc_mr_put(mr);
    CHECK(!sc_mr_span(mr, base + 1, 4096, &span));
    CHECK(!sc_mr_span(mr, base - 1, 1, &span));
    CHECK(!sc_mr_span(mr, UINT64_MAX, 2, &span));
    CHECK(sc_mr_span(mr, base + 4096, 0, &span)); /* an empty span at the end is in bounds */
    pthread_mutex_unlock(&ctx->lock);
    sc_mr_dereg(mr);
    CHECK(!sc_mr_try_free(mr)); /* the span above still holds it */
    pthread_mutex_lock(&ctx->lock);
    CHECK(sc_mr_local(ctx, pd->id, sc_mr_lkey(mr)) == NULL);
    sc_mr_put(mr);
    pthread_mutex_unlock(&ctx->lock);
    CHECK(sc_mr_try_free(mr));
    sc_pd_free(other);
    sc_pd_free(pd);
    sc_ctx_free(ctx);
}

static int wait_wc(sc_cq *cq, struct sc_wc *wc) {
    for (int i = 0; i < 20000; i++) {
        if (sc_cq_poll(cq, 1, wc) == 1) return 1;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* Two contexts joined by a socketpair, a QP in RTS on each: a's CQ plain, b's on a channel (cookie 2). */
struct duo {
    sc_ctx *ca, *cb;
    sc_pd *pa, *pb;
    sc_chan *chan;
    sc_cq *qa, *qb;
    sc_mr *ra, *rb;
    sc_qp *a, *b;
};

static struct duo duo_new(uint8_t *ma, uint64_t la, uint8_t *mb, uint64_t lb, uint32_t b_access) {
    struct duo d;
    int fds[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) == 0);
    d.ca = sc_ctx_new();
    d.cb = sc_ctx_new();
    d.pa = sc_pd_new(d.ca);
    d.pb = sc_pd_new(d.cb);
    d.chan = sc_chan_new(d.cb);
    d.qa = sc_cq_new(d.ca, 64, NULL, 1);
    d.qb = sc_cq_new(d.cb, 64, d.chan, 2);
    d.ra = sc_mr_reg(d.pa, ma, la, ACCESS_LOCAL_WRITE);
    d.rb = sc_mr_reg(d.pb, mb, lb, b_access);
    d.a = qp_on_fd(d.pa, d.qa, fds[0], 1, 2);
    d.b = qp_on_fd(d.pb, d.qb, fds[1], 2, 1);
    return d;
}

static void test_a_connected_pair(void) {
    static uint8_t ma[4096], mb[4096];
    struct duo d = duo_new(ma, sizeof ma, mb, sizeof mb,
                           ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC);
    sc_ctx *ca = d.ca, *cb = d.cb;
    sc_pd *pa = d.pa;
    sc_chan *chan = d.chan;
    sc_cq *qa = d.qa, *qb = d.qb;
    sc_mr *ra = d.ra, *rb = d.rb;
    sc_qp *a = d.a, *b = d.b;
    memcpy(ma, "hello", 5);
    struct sc_sge sa = {(uint64_t)(uintptr_t)ma, 5, sc_mr_lkey(ra)}, sb = {(uint64_t)(uintptr_t)mb, 64,
                                                                           sc_mr_lkey(rb)};
    struct sc_recv_wr rwr = {.wr_id = 7, .num_sge = 1, .sg = &sb};
    int posted;
    CHECK(sc_qp_post_recv(b, &rwr, 1, &posted) == SC_POST_OK && posted == 1);
    sc_cq_req_notify(qb, 0);
    struct sc_send_wr send = {.wr_id = 1, .opcode = WR_SEND_IMM, .send_flags = SEND_SIGNALED, .imm_data = 9,
                              .num_sge = 1, .sg = &sa};
    CHECK(sc_qp_post_send(a, &send, 1, &posted) == SC_POST_OK);
    struct sc_wc wc;
    CHECK(wait_wc(qa, &wc) && wc.wr_id == 1 && wc.status == WC_SUCCESS && wc.byte_len == 5);
    uint64_t cookie = 0;
    for (int i = 0; i < 20000 && sc_chan_take(chan, &cookie) != 1; i++) usleep(100);
    CHECK(cookie == 2);
    CHECK(wait_wc(qb, &wc) && wc.wr_id == 7 && wc.imm_data == 9 && wc.wc_flags == WC_FLAG_WITH_IMM);
    CHECK(memcmp(mb, "hello", 5) == 0);

    struct sc_send_wr write = {.wr_id = 2, .opcode = WR_RDMA_WRITE, .send_flags = SEND_SIGNALED,
                               .rkey = sc_mr_rkey(rb), .remote_addr = (uint64_t)(uintptr_t)mb + 100,
                               .num_sge = 1, .sg = &sa};
    CHECK(sc_qp_post_send(a, &write, 1, &posted) == SC_POST_OK);
    CHECK(wait_wc(qa, &wc) && wc.wr_id == 2 && wc.status == WC_SUCCESS && memcmp(mb + 100, "hello", 5) == 0);

    struct sc_sge into = {(uint64_t)(uintptr_t)ma + 8, 8, sc_mr_lkey(ra)};
    memset(mb + 200, 0, 8);
    mb[200] = 40;
    struct sc_send_wr add = {.wr_id = 3, .opcode = WR_FETCH_ADD, .send_flags = SEND_SIGNALED,
                             .rkey = sc_mr_rkey(rb), .remote_addr = (uint64_t)(uintptr_t)mb + 200,
                             .compare_add = 2, .num_sge = 1, .sg = &into};
    CHECK(sc_qp_post_send(a, &add, 1, &posted) == SC_POST_OK);
    CHECK(wait_wc(qa, &wc) && wc.wr_id == 3 && wc.status == WC_SUCCESS && ma[8] == 40 && mb[200] == 42);

    struct sc_send_wr bad = write;
    bad.wr_id = 4;
    bad.remote_addr = (uint64_t)(uintptr_t)mb + 4094; /* past the end */
    uint8_t before[4096];
    memcpy(before, mb, sizeof mb);
    CHECK(sc_qp_post_send(a, &bad, 1, &posted) == SC_POST_OK);
    CHECK(wait_wc(qa, &wc) && wc.wr_id == 4 && wc.status == WC_REM_ACCESS_ERR);
    CHECK(memcmp(before, mb, sizeof mb) == 0);
    CHECK(sc_qp_state(a) == SC_QPS_ERR);
    CHECK(sc_qp_post_send(a, &write, 1, &posted) == SC_POST_OK); /* posted in ERR: a flush */
    CHECK(wait_wc(qa, &wc) && wc.status == WC_WR_FLUSH_ERR);

    sc_qp_free(a);
    sc_qp_free(b);
    sc_mr_dereg(ra);
    CHECK(sc_mr_try_free(ra));
    sc_cq_free(qa);
    sc_pd_free(pa);
    sc_ctx_free(ca);
    sc_ctx_free(cb); /* frees what is left of b's side, rb and the channel included */
}

/* The next frame on a raw socket end, its payload skipped: 1, or 0 if none came within a second. */
static int read_frame(int fd, struct sc_hdr *hdr) {
    uint8_t raw[SC_WIRE_HEADER_SIZE], skip[256];
    size_t got = 0;
    for (int i = 0; i < 10000 && got < sizeof raw; i++) {
        ssize_t n = recv(fd, raw + got, sizeof raw - got, 0);
        if (n > 0) got += (size_t)n;
        else usleep(100);
    }
    if (got < sizeof raw || sc_wire_parse(raw, hdr) != SC_WIRE_OK) return 0;
    for (uint32_t left = sc_wire_payload_length(hdr); left;) {
        ssize_t n = recv(fd, skip, left < sizeof skip ? left : sizeof skip, 0);
        if (n > 0) left -= (uint32_t)n;
        else usleep(100);
    }
    return 1;
}

static void send_frame(int fd, const struct sc_hdr *hdr, const void *payload) {
    uint8_t raw[SC_WIRE_HEADER_SIZE];
    sc_wire_pack(hdr, raw);
    CHECK(send(fd, raw, sizeof raw, 0) == (ssize_t)sizeof raw);
    if (hdr->length) CHECK(send(fd, payload, hdr->length, 0) == (ssize_t)hdr->length);
}

/* One QP of a fresh context on one end of a socketpair, its peer played raw on the other (fds[1]), over a
 * buffer registered with `access`. */
struct raw_peer {
    int fds[2];
    sc_ctx *ctx;
    sc_mr *mr;
    sc_qp *qp;
};

static void raw_peer_open(struct raw_peer *r, uint8_t *mem, uint64_t len, uint32_t access) {
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, r->fds) == 0);
    r->ctx = sc_ctx_new();
    sc_pd *pd = sc_pd_new(r->ctx);
    sc_cq *cq = sc_cq_new(r->ctx, 64, NULL, 1);
    r->mr = sc_mr_reg(pd, mem, len, access);
    r->qp = qp_on_fd(pd, cq, r->fds[0], 1, 2);
}

static void raw_peer_close(struct raw_peer *r) {
    sc_ctx_free(r->ctx); /* frees the QP, its CQ, MR and PD with it */
    close(r->fds[1]);
}

/* IB's AckReq: the requester flags the last request it has queued, and the responder acknowledges such a
 * request in the pass that executed it, not after its delayed-ACK timer (which a plain request waits for
 * unless SC_ACK_BATCH more come). The other end of the QP's socket is played raw. */
static void test_the_last_request_asks_for_its_ack(void) {
    static uint8_t mem[64];
    struct raw_peer r;
    raw_peer_open(&r, mem, sizeof mem, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE);
    sc_ctx *ctx = r.ctx;
    sc_mr *mr = r.mr;
    sc_qp *qp = r.qp;
    int *fds = r.fds;

    struct sc_sge sge = {(uint64_t)(uintptr_t)mem, 4, sc_mr_lkey(mr)};
    struct sc_send_wr writes[2];
    for (int i = 0; i < 2; i++)
        writes[i] = (struct sc_send_wr){.wr_id = (uint64_t)i, .opcode = WR_RDMA_WRITE, .rkey = 5, .num_sge = 1,
                                        .sg = &sge};
    int posted;
    CHECK(sc_qp_post_send(qp, writes, 2, &posted) == SC_POST_OK && posted == 2);
    struct sc_hdr first, second;
    CHECK(read_frame(fds[1], &first) && read_frame(fds[1], &second));
    CHECK(first.op == SC_OP_WRITE && !(first.flags & SC_WIRE_FLAG_ACK_REQ));
    CHECK(second.op == SC_OP_WRITE && (second.flags & SC_WIRE_FLAG_ACK_REQ));

    struct sc_hdr request = {.magic = SC_WIRE_MAGIC, .op = SC_OP_WRITE, .flags = SC_WIRE_FLAG_ACK_REQ,
                             .seq = 100, .length = 4, .rkey = sc_mr_rkey(mr),
                             .addr = (uint64_t)(uintptr_t)mem + 8};
    send_frame(fds[1], &request, "abcd");
    int executed = 0, acked_at_once = 0;
    for (int i = 0; i < 20000 && !executed; i++) {
        pthread_mutex_lock(&ctx->lock);
        executed = qp->expected == 101;
        acked_at_once = executed && !qp->has_ack && !qp->timer[T_ACK];
        pthread_mutex_unlock(&ctx->lock);
        if (!executed) usleep(50);
    }
    CHECK(executed && acked_at_once && memcmp(mem + 8, "abcd", 4) == 0);
    struct sc_hdr ack;
    CHECK(read_frame(fds[1], &ack) && ack.op == SC_OP_ACK && ack.seq == 100);
    raw_peer_close(&r);
}

/* One RTM_NEWLINK (or DELLINK) as the kernel sends it: the header, the ifinfomsg, an IFLA_MTU and (when
 * operstate >= 0) an IFLA_OPERSTATE; its length. */
static size_t link_message(uint8_t *at, uint16_t type, int32_t ifindex, uint32_t flags, int operstate) {
    struct nlmsghdr hdr = {.nlmsg_type = type};
    struct ifinfomsg ifi = {.ifi_family = AF_UNSPEC, .ifi_index = ifindex, .ifi_flags = flags};
    struct rtattr mtu = {.rta_len = RTA_LENGTH(4), .rta_type = IFLA_MTU}, op = {RTA_LENGTH(1), IFLA_OPERSTATE};
    uint32_t mtu_value = 1500;
    size_t len = NLMSG_LENGTH(sizeof ifi);
    memset(at, 0, 64);
    memcpy(at + NLMSG_HDRLEN, &ifi, sizeof ifi);
    memcpy(at + len, &mtu, sizeof mtu);
    memcpy(at + len + sizeof mtu, &mtu_value, 4);
    len += RTA_ALIGN(mtu.rta_len);
    if (operstate >= 0) {
        memcpy(at + len, &op, sizeof op);
        at[len + sizeof op] = (uint8_t)operstate;
        len += RTA_ALIGN(op.rta_len);
    }
    hdr.nlmsg_len = (uint32_t)len;
    memcpy(at, &hdr, sizeof hdr);
    return len;
}

/* The link watch's parser: up needs IFF_UP, carrier and an operstate that carries traffic; only watched
 * links of the right source; a removal; a truncated or lying message ends the parse without a read past
 * the buffer (ASan watches the exact-size copy). */
static void test_the_link_watch_reads_link_messages(void) {
    static uint8_t buf[512];
    struct sc_link watched[] = {{0, 3}, {0, 4}, {1, 3}};
    struct sc_link_event got[8];
    size_t len = 0;
    len += link_message(buf + len, RTM_NEWLINK, 3, IFF_UP | IFF_RUNNING | IFF_LOWER_UP, IF_OPER_UP);
    len += link_message(buf + len, RTM_NEWLINK, 4, IFF_UP, IF_OPER_LOWERLAYERDOWN); /* carrier lost */
    len += link_message(buf + len, RTM_NEWLINK, 9, IFF_UP | IFF_LOWER_UP, IF_OPER_UP); /* not watched */
    len += link_message(buf + len, RTM_NEWLINK, 4, IFF_UP | IFF_LOWER_UP, IF_OPER_DORMANT);
    len += link_message(buf + len, RTM_NEWLINK, 3, IFF_UP | IFF_LOWER_UP, -1); /* no operstate: flags say */
    len += link_message(buf + len, RTM_DELLINK, 4, IFF_UP | IFF_LOWER_UP, IF_OPER_UP);
    CHECK(sc_link_parse(buf, len, 0, watched, 3, got, 8) == 5);
    CHECK(got[0].ifindex == 3 && got[0].up && !got[0].gone && got[0].source == 0);
    CHECK(got[1].ifindex == 4 && !got[1].up);
    CHECK(got[2].ifindex == 4 && !got[2].up);
    CHECK(got[3].ifindex == 3 && got[3].up);
    CHECK(got[4].ifindex == 4 && got[4].gone && !got[4].up);
    CHECK(sc_link_parse(buf, len, 1, watched, 3, got, 8) == 2 && got[0].source == 1); /* ifindex 3 of source 1 */
    CHECK(sc_link_parse(buf, len, 0, watched, 3, got, 2) == 2);                        /* at most max */

    size_t first = link_message(buf, RTM_NEWLINK, 3, IFF_UP | IFF_LOWER_UP, IF_OPER_DOWN);
    for (size_t cut = 0; cut <= first; cut++) { /* every truncation: no event, or the whole message's */
        uint8_t *exact = malloc(cut ? cut : 1);
        memcpy(exact, buf, cut);
        int n = sc_link_parse(exact, cut, 0, watched, 3, got, 8);
        CHECK(cut == first ? n == 1 && !got[0].up : n == 0);
        free(exact);
    }
    struct nlmsghdr lying;
    memcpy(&lying, buf, sizeof lying);
    lying.nlmsg_len = 4096; /* longer than the datagram */
    memcpy(buf, &lying, sizeof lying);
    CHECK(sc_link_parse(buf, first, 0, watched, 3, got, 8) == 0);
    struct rtattr endless = {.rta_len = 0, .rta_type = IFLA_OPERSTATE}; /* an attribute that never ends */
    first = link_message(buf, RTM_NEWLINK, 3, IFF_UP | IFF_LOWER_UP, IF_OPER_DOWN);
    memcpy(buf + NLMSG_LENGTH(sizeof(struct ifinfomsg)), &endless, sizeof endless);
    CHECK(sc_link_parse(buf, first, 0, watched, 3, got, 8) == 1 && got[0].up); /* the flags decide */
}

/* A peek takes what the context's progress thread has made, with no pass of its own: a message arrives
 * at b while nobody on b's side drives (b's CQ is only peeked), and it completes there all the same. */
static int acted[2];
static void count_act(void *arg) { acted[(int *)arg - acted]++; }

/* A link seen down raises its mark's bit and calls its act once per argument, whatever the number of
 * messages or of links that share it; a link up, an unmarked one and another socket's raise nothing. */
static void test_the_link_watch_raises_its_marks(void) {
    uint32_t word = 0, other = 0;
    const struct sc_link watched[4] = {{0, 3}, {0, 4}, {1, 3}, {0, 5}};
    const struct sc_link_mark marks[4] = {
        {&word, 0, count_act, &acted[0]}, {&word, 2, count_act, &acted[0]}, {&other, 1, count_act, &acted[1]},
        {NULL, 0, NULL, NULL}};
    const struct sc_link_event events[5] = {
        {0, 3, 0, 0}, {0, 3, 0, 0}, {0, 4, 0, 1}, {0, 5, 0, 0}, {1, 3, 1, 0}}; /* the last: up */
    sc_link_raise(events, 5, watched, marks, 4);
    CHECK(word == 5 && other == 0 && acted[0] == 1 && acted[1] == 0);
}

static void test_a_peek_takes_what_the_progress_thread_made(void) {
    static uint8_t ma[64], mb[64];
    struct duo d = duo_new(ma, sizeof ma, mb, sizeof mb, ACCESS_LOCAL_WRITE);
    struct sc_sge sa = {(uint64_t)(uintptr_t)ma, 4, sc_mr_lkey(d.ra)}, sb = {(uint64_t)(uintptr_t)mb, 4,
                                                                          sc_mr_lkey(d.rb)};
    struct sc_recv_wr r = {.wr_id = 5, .num_sge = 1, .sg = &sb};
    struct sc_send_wr s = {.wr_id = 6, .opcode = WR_SEND, .send_flags = SEND_SIGNALED, .num_sge = 1, .sg = &sa};
    int posted;
    struct sc_wc wc;
    CHECK(sc_cq_peek(d.qb, 1, &wc) == 0);
    CHECK(sc_qp_post_recv(d.b, &r, 1, &posted) == SC_POST_OK);
    CHECK(sc_qp_post_send(d.a, &s, 1, &posted) == SC_POST_OK);
    int got = 0;
    for (int i = 0; i < 20000 && !got; i++) {
        got = sc_cq_peek(d.qb, 1, &wc);
        if (!got) usleep(100);
    }
    CHECK(got == 1 && wc.wr_id == 5 && wc.status == WC_SUCCESS);
    CHECK(wait_wc(d.qa, &wc) && wc.wr_id == 6);
    sc_ctx_free(d.ca);
    sc_ctx_free(d.cb);
}

/* What a `filled` hook saw: the thread it ran on, whether its context's lock was free. */
struct hook_seen {
    sc_ctx *ctx;
    int calls, lock_free;
    pthread_t thread;
};

static void hook_note(void *arg) {
    struct hook_seen *seen = arg;
    seen->thread = pthread_self();
    seen->lock_free = pthread_mutex_trylock(&seen->ctx->lock) == 0;
    if (seen->lock_free) pthread_mutex_unlock(&seen->ctx->lock);
    __atomic_add_fetch(&seen->calls, 1, __ATOMIC_RELEASE);
}

static int calls_of(struct hook_seen *seen) { return __atomic_load_n(&seen->calls, __ATOMIC_ACQUIRE); }

/* A post arms its ack deadline on the progress thread's timerfd, from the posting thread: the thread's wait
 * ends by then without a wake-up to shorten it (which cost a thread switch per message). */
static void test_a_post_arms_the_progress_threads_timer(void) {
    static uint8_t mem[64];
    struct raw_peer r;
    raw_peer_open(&r, mem, sizeof mem, ACCESS_LOCAL_WRITE);
    sc_ctx *ctx = r.ctx;
    usleep(20000); /* the progress thread is asleep, nothing armed */
    pthread_mutex_lock(&ctx->lock);
    CHECK(sc_timers_first(ctx) == 0 && ctx->sleep_until == INT64_MAX);
    pthread_mutex_unlock(&ctx->lock);
    struct sc_sge sge = {(uint64_t)(uintptr_t)mem, 4, sc_mr_lkey(r.mr)};
    struct sc_send_wr send = {.wr_id = 1, .opcode = WR_SEND, .num_sge = 1, .sg = &sge};
    int posted;
    CHECK(sc_qp_post_send(r.qp, &send, 1, &posted) == SC_POST_OK && posted == 1);
    pthread_mutex_lock(&ctx->lock);
    int64_t due = sc_timers_first(ctx);
    CHECK(due > sc_now() && r.qp->timer[T_DEADLINE] == due);
    CHECK(ctx->armed_until == due && ctx->sleep_until == due); /* armed by this thread; still asleep */
    pthread_mutex_unlock(&ctx->lock);
    struct itimerspec left;
    CHECK(timerfd_gettime(ctx->timerfd, &left) == 0 && (left.it_value.tv_sec || left.it_value.tv_nsec));
    raw_peer_close(&r);
}

static void *try_lock(void *arg) { return (void *)(intptr_t)pthread_mutex_trylock(arg); }

/* A context's lock (priority.c): recursive when asked, as the fast path's is, and another thread's while
 * held. */
static void test_a_context_lock_is_recursive(void) {
    pthread_mutex_t lock;
    CHECK(sc_mutex_init(&lock, 1) == 0);
    CHECK(pthread_mutex_lock(&lock) == 0 && pthread_mutex_trylock(&lock) == 0);
    pthread_mutex_unlock(&lock);
    pthread_t other;
    void *said = NULL;
    CHECK(pthread_create(&other, NULL, try_lock, &lock) == 0 && pthread_join(other, &said) == 0);
    CHECK((intptr_t)said == EBUSY); /* still held once */
    pthread_mutex_unlock(&lock);
    pthread_mutex_destroy(&lock);
}

/* A CQ's hook is called by its context's progress thread, outside the lock, once it has made a completion
 * there, with no caller polling; after sc_cq_set_filled(NULL) no more. */
static void test_the_progress_thread_calls_a_cqs_hook(void) {
    static uint8_t ma[64], mb[64];
    struct duo d = duo_new(ma, sizeof ma, mb, sizeof mb, ACCESS_LOCAL_WRITE);
    struct hook_seen seen = {.ctx = d.cb};
    sc_cq_set_filled(d.qb, hook_note, &seen);
    struct sc_sge sa = {(uint64_t)(uintptr_t)ma, 4, sc_mr_lkey(d.ra)}, sb = {(uint64_t)(uintptr_t)mb, 4,
                                                                          sc_mr_lkey(d.rb)};
    struct sc_recv_wr r[2] = {{.wr_id = 5, .num_sge = 1, .sg = &sb}, {.wr_id = 7, .num_sge = 1, .sg = &sb}};
    struct sc_send_wr s = {.wr_id = 6, .opcode = WR_SEND, .send_flags = SEND_SIGNALED, .num_sge = 1, .sg = &sa};
    int posted;
    struct sc_wc wc;
    CHECK(sc_qp_post_recv(d.b, r, 2, &posted) == SC_POST_OK && posted == 2);
    CHECK(sc_qp_post_send(d.a, &s, 1, &posted) == SC_POST_OK);
    for (int i = 0; i < 20000 && !calls_of(&seen); i++) usleep(100);
    CHECK(calls_of(&seen) >= 1 && pthread_equal(seen.thread, d.cb->thread) && seen.lock_free);
    CHECK(sc_cq_peek(d.qb, 1, &wc) == 1 && wc.wr_id == 5); /* the hook's to take, or anyone's */
    CHECK(wait_wc(d.qa, &wc) && wc.wr_id == 6);
    sc_cq_set_filled(d.qb, NULL, NULL);
    int before = calls_of(&seen);
    CHECK(sc_qp_post_send(d.a, &s, 1, &posted) == SC_POST_OK);
    int got = 0;
    for (int i = 0; i < 20000 && !got; i++) {
        got = sc_cq_peek(d.qb, 1, &wc);
        if (!got) usleep(100);
    }
    CHECK(got == 1 && calls_of(&seen) == before);
    sc_ctx_free(d.ca);
    sc_ctx_free(d.cb);
}

/* A look is a pass on the caller's thread, like a poll's, that does not park the progress thread. */
static void test_a_look_leaves_the_progress_thread_awake(void) {
    static uint8_t ma[64], mb[64];
    struct duo d = duo_new(ma, sizeof ma, mb, sizeof mb, ACCESS_LOCAL_WRITE);
    struct sc_wc wc;
    CHECK(sc_cq_look(d.qb, 1, &wc) == 0);
    pthread_mutex_lock(&d.cb->lock);
    CHECK(!sc_driven(d.cb, sc_now()));
    pthread_mutex_unlock(&d.cb->lock);
    CHECK(sc_cq_poll(d.qb, 1, &wc) == 0);
    pthread_mutex_lock(&d.cb->lock);
    CHECK(sc_driven(d.cb, sc_now())); /* a poll parks it, for SC_DRIVE_GRACE_NS */
    pthread_mutex_unlock(&d.cb->lock);
    sc_ctx_free(d.ca);
    sc_ctx_free(d.cb);
}

/* sc_chan_wait, and the seconds it took. */
static int timed_wait(sc_chan *chan, int timeout_ms, int drive, double *took) {
    struct timespec t0, t1;
    uint64_t cookie;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int got = sc_chan_wait(chan, timeout_ms, drive, &cookie);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    return got;
}

static void test_a_wait_makes_its_own_completion(void) {
    /* the waiting thread reads the frame itself: the event its own pass queued took no eventfd write; a
     * list of small sends lands in order; a wait with nothing to come ends at its time, a woken one at
     * once */
    static uint8_t ma[64], mb[64];
    struct duo d = duo_new(ma, sizeof ma, mb, sizeof mb, ACCESS_LOCAL_WRITE);
    sc_ctx *ca = d.ca, *cb = d.cb;
    sc_chan *chan = d.chan;
    sc_cq *qb = d.qb;
    sc_mr *ra = d.ra, *rb = d.rb;
    sc_qp *a = d.a, *b = d.b;
    struct sc_sge sb[3];
    struct sc_recv_wr rwr[3];
    for (int i = 0; i < 3; i++) {
        sb[i] = (struct sc_sge){(uint64_t)(uintptr_t)mb + 8 * i, 8, sc_mr_lkey(rb)};
        rwr[i] = (struct sc_recv_wr){.wr_id = 10 + (uint64_t)i, .num_sge = 1, .sg = &sb[i]};
    }
    int posted;
    CHECK(sc_qp_post_recv(b, rwr, 3, &posted) == SC_POST_OK && posted == 3);
    sc_cq_req_notify(qb, 0);
    memcpy(ma, "abcdefghijklmnopqrstuvwx", 24);
    struct sc_sge sa[3];
    struct sc_send_wr sends[3];
    for (int i = 0; i < 3; i++) {
        sa[i] = (struct sc_sge){(uint64_t)(uintptr_t)ma + 8 * i, 8, sc_mr_lkey(ra)};
        sends[i] = (struct sc_send_wr){.wr_id = (uint64_t)i, .opcode = WR_SEND, .send_flags = SEND_INLINE,
                                       .num_sge = 1, .sg = &sa[i]};
    }
    CHECK(sc_qp_post_send(a, sends, 3, &posted) == SC_POST_OK && posted == 3);
    uint64_t cookie = 0;
    CHECK(sc_chan_wait(chan, 5000, 1, &cookie) == 1 && cookie == 2);
    pthread_mutex_lock(&cb->lock);
    int signalled = chan->signalled;
    pthread_mutex_unlock(&cb->lock);
    CHECK(!signalled);
    struct sc_wc wc[3];
    int got = 0;
    for (int i = 0; i < 20000 && got < 3; i++) {
        int n = sc_cq_poll(qb, 3 - got, wc + got);
        if (n > 0) got += n;
        else usleep(100);
    }
    CHECK(got == 3 && wc[0].wr_id == 10 && wc[1].wr_id == 11 && wc[2].wr_id == 12);
    CHECK(memcmp(mb, "abcdefghijklmnopqrstuvwx", 24) == 0);
    pthread_mutex_lock(&ca->lock);
    CHECK(ca->nspare >= 1 && ca->nspare <= SC_SPARE_FRAMES); /* the sent frames wait for the next ones */
    pthread_mutex_unlock(&ca->lock);

    double took;
    CHECK(timed_wait(chan, 10, 1, &took) == 0 && took >= 0.009); /* its time is up */
    CHECK(timed_wait(chan, 200, 1, &took) == 3 && took >= 0.019); /* idle for 20 ms: let go */
    CHECK(timed_wait(chan, 30, 0, &took) == 0 && took >= 0.029); /* on without driving */
    sc_chan_wake(chan);
    CHECK(sc_chan_wait(chan, -1, 1, &cookie) == 2);

    sc_qp_free(a);
    sc_qp_free(b);
    sc_ctx_free(ca);
    sc_ctx_free(cb);
}

/* QP 5 at 127.0.0.1 in a context of its own (one of each queue's entries, 4 inline bytes), not connected */
static sc_qp *lone_qp(sc_ctx *ctx) {
    sc_pd *pd = sc_pd_new(ctx);
    sc_cq *cq = sc_cq_new(ctx, 4, NULL, 0);
    struct sc_cap cap = {1, 1, 1, 1, 4};
    return sc_qp_new(pd, cq, cq, &cap, 0, 5, 0x7f000001);
}

static void test_the_smaller_address_and_qpn_connects(void) {
    sc_ctx *ctx = sc_ctx_new();
    sc_qp *qp = lone_qp(ctx);
    CHECK(sc_qp_connects(qp, 0x7f000001, 6));  /* one address: the smaller QPN connects */
    CHECK(!sc_qp_connects(qp, 0x7f000001, 4)); /* ... and the larger accepts */
    CHECK(sc_qp_connects(qp, 0x7f000002, 1));  /* the smaller address connects, whatever the QPNs */
    CHECK(!sc_qp_connects(qp, 0x7f000000, 9));
    sc_qp_set_local_ip(qp, 0x7f000003); /* its device re-addressed: the rule follows the new address */
    CHECK(!sc_qp_connects(qp, 0x7f000002, 1));
    CHECK(sc_qp_connects(qp, 0x7f000004, 1));
    sc_ctx_free(ctx);
}

static void test_refusals(void) {
    sc_ctx *ctx = sc_ctx_new();
    sc_qp *qp = lone_qp(ctx);
    struct sc_sge sge[2] = {{0, 8, 0}, {0, 8, 0}};
    struct sc_send_wr wr = {.opcode = WR_SEND, .num_sge = 1, .sg = sge};
    struct sc_recv_wr rwr = {.num_sge = 2, .sg = sge};
    int posted;
    CHECK(sc_qp_post_send(qp, &wr, 1, &posted) == SC_POST_STATE);
    CHECK(sc_qp_post_recv(qp, &rwr, 1, &posted) == SC_POST_STATE);
    sc_qp_to_init(qp, 0);
    CHECK(sc_qp_post_recv(qp, &rwr, 1, &posted) == SC_POST_SGES);
    rwr.num_sge = 1;
    CHECK(sc_qp_post_recv(qp, &rwr, 1, &posted) == SC_POST_OK);
    CHECK(sc_qp_post_recv(qp, &rwr, 1, &posted) == SC_POST_QUEUE_FULL);
    sc_qp_to_rtr(qp, 0x7f000001, 6, 0, 1, -1);
    sc_qp_to_rts(qp, 0, 0, 7, 0);
    wr.opcode = 99;
    CHECK(sc_qp_post_send(qp, &wr, 1, &posted) == SC_POST_OPCODE);
    wr.opcode = WR_SEND;
    wr.send_flags = SEND_INLINE;
    sge[0].length = 5;
    CHECK(sc_qp_post_send(qp, &wr, 1, &posted) == SC_POST_INLINE);
    wr.opcode = WR_CMP_SWP;
    wr.send_flags = 0;
    CHECK(sc_qp_post_send(qp, &wr, 1, &posted) == SC_POST_ATOMIC);
    sc_ctx_free(ctx);
}

/* A non-blocking TCP socket on 127.0.0.1 (listening when asked); *port is its port. */
static int loopback_socket(int listening, uint16_t *port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in at = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof at;
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&at, sizeof at) == 0);
    if (listening) CHECK(listen(fd, 16) == 0);
    CHECK(getsockname(fd, (struct sockaddr *)&at, &len) == 0);
    *port = ntohs(at.sin_port);
    return fd;
}

/* A QP of pd numbered port << 8 | index, in INIT. */
static sc_qp *init_qp(sc_pd *pd, sc_cq *cq, uint32_t qpn) {
    struct sc_cap cap = {4, 4, 1, 1, 0};
    sc_qp *qp = sc_qp_new(pd, cq, cq, &cap, 0, qpn, INADDR_LOOPBACK);
    sc_qp_to_init(qp, ACCESS_LOCAL_WRITE);
    return qp;
}

static void rtr_towards(sc_qp *qp, uint32_t remote_qpn) {
    uint16_t unused;
    sc_qp_to_rtr(qp, INADDR_LOOPBACK, remote_qpn, 0, 1, loopback_socket(0, &unused));
}

/* One listener per context, QPs told apart by the HELLO: a pair whose acceptor reaches RTR after the
 * connector's HELLO has arrived, and again after both are re-armed, the connector first; a HELLO for a QPN the listener's context lacks, and a QPN whose port has
 * no listener, both fail the asker's first send at once (timeout 0: no deadline could end it). */
static void test_qpns_name_listeners(void) {
    static uint8_t ma[64], mb[64];
    uint16_t pa, pb, closed;
    sc_ctx *ca = sc_ctx_new(), *cb = sc_ctx_new();
    CHECK(sc_ctx_listen(ca, loopback_socket(1, &pa)) == 0 && sc_ctx_listen(cb, loopback_socket(1, &pb)) == 0);
    close(loopback_socket(0, &closed));
    sc_cq *qa = sc_cq_new(ca, 16, NULL, 0), *qb = sc_cq_new(cb, 16, NULL, 0);
    sc_pd *pda = sc_pd_new(ca), *pdb = sc_pd_new(cb);
    uint32_t na = (uint32_t)pa << 8 | 3, nb = (uint32_t)pb << 8 | 4;
    sc_qp *a = init_qp(pda, qa, na), *b = init_qp(pdb, qb, nb);
    rtr_towards(na < nb ? a : b, na < nb ? nb : na);
    usleep(50000); /* the connector's HELLO waits at the other QP, still in INIT */
    rtr_towards(na < nb ? b : a, na < nb ? na : nb);
    sc_qp_to_rts(a, 0, 0, 7, 0);
    sc_qp_to_rts(b, 0, 0, 7, 0);
    sc_mr *ra = sc_mr_reg(pda, ma, sizeof ma, ACCESS_LOCAL_WRITE);
    struct sc_sge sa = {(uint64_t)(uintptr_t)ma, 5, sc_mr_lkey(ra)};
    struct sc_send_wr send = {.wr_id = 1, .opcode = WR_SEND, .send_flags = SEND_SIGNALED, .num_sge = 1,
                              .sg = &sa};
    sc_mr *rb = sc_mr_reg(pdb, mb, sizeof mb, ACCESS_LOCAL_WRITE);
    struct sc_sge sb = {(uint64_t)(uintptr_t)mb, sizeof mb, sc_mr_lkey(rb)};
    struct sc_recv_wr rwr = {.wr_id = 2, .num_sge = 1, .sg = &sb};
    int posted;
    CHECK(sc_qp_post_recv(b, &rwr, 1, &posted) == SC_POST_OK);
    memcpy(ma, "hello", 5);
    CHECK(sc_qp_post_send(a, &send, 1, &posted) == SC_POST_OK);
    struct sc_wc wc;
    CHECK(wait_wc(qa, &wc) && wc.wr_id == 1 && wc.status == WC_SUCCESS);
    CHECK(wait_wc(qb, &wc) && wc.wr_id == 2 && wc.byte_len == 5 && memcmp(mb, "hello", 5) == 0);

    /* re-armed, the connector first: its HELLO waits at the other QP, still on its old connection, until
     * that QP's next RTR */
    sc_qp *connector = na < nb ? a : b, *acceptor = na < nb ? b : a;
    sc_qp_reset(connector);
    sc_qp_to_init(connector, ACCESS_LOCAL_WRITE);
    rtr_towards(connector, na < nb ? nb : na);
    usleep(50000);
    sc_qp_reset(acceptor);
    sc_qp_to_init(acceptor, ACCESS_LOCAL_WRITE);
    rtr_towards(acceptor, na < nb ? na : nb);
    sc_qp_to_rts(a, 0, 0, 7, 0);
    sc_qp_to_rts(b, 0, 0, 7, 0);
    CHECK(sc_qp_post_recv(b, &rwr, 1, &posted) == SC_POST_OK);
    CHECK(sc_qp_post_send(a, &send, 1, &posted) == SC_POST_OK);
    CHECK(wait_wc(qa, &wc) && wc.wr_id == 1 && wc.status == WC_SUCCESS);
    CHECK(wait_wc(qb, &wc) && wc.wr_id == 2 && wc.status == WC_SUCCESS);

    uint32_t missing[2] = {(uint32_t)pa << 8 | 200, (uint32_t)closed << 8};
    for (int i = 0; i < 2; i++) {
        sc_qp *lost = init_qp(pda, qa, 1); /* the smaller QPN: it connects */
        rtr_towards(lost, missing[i]);
        sc_qp_to_rts(lost, 0, 0, 7, 0);
        usleep(50000); /* the refusal has come */
        send.wr_id = 10 + (uint64_t)i;
        CHECK(sc_qp_post_send(lost, &send, 1, &posted) == SC_POST_OK);
        CHECK(wait_wc(qa, &wc) && wc.wr_id == send.wr_id && wc.status == WC_RETRY_EXC_ERR);
        CHECK(sc_qp_state(lost) == SC_QPS_ERR);
        sc_qp_free(lost);
    }
    sc_ctx_free(ca);
    sc_ctx_free(cb);
}

/* The heap is in order and every QP in it knows its place. */
static int heap_sound(const sc_ctx *ctx) {
    for (uint32_t i = 0; i < ctx->heap_len; i++) {
        if (ctx->heap[i]->heap_pos != i + 1 || !ctx->heap[i]->due) return 0;
        if (i && ctx->heap[(i - 1) / 2]->due > ctx->heap[i]->due) return 0;
    }
    return 1;
}

/* The earliest timer of qps[0..n), found the slow way; and whether each QP's key is its earliest. */
static int64_t earliest_of(sc_qp *const *qps, int n, int *keys_right) {
    int64_t first = 0;
    *keys_right = 1;
    for (int i = 0; i < n; i++) {
        int64_t due = 0;
        for (int t = 0; t < SC_NTIMERS; t++)
            if (qps[i]->timer[t] && (!due || qps[i]->timer[t] < due)) due = qps[i]->timer[t];
        if (due != qps[i]->due || (due != 0) != (qps[i]->heap_pos != 0)) *keys_right = 0;
        if (due && (!first || due < first)) first = due;
    }
    return first;
}

static void test_timer_heap(void) {
    enum { N = 1000 };
    sc_ctx *ctx = sc_ctx_new();
    sc_pd *pd = sc_pd_new(ctx);
    sc_cq *cq = sc_cq_new(ctx, 4, NULL, 0);
    struct sc_cap cap = {1, 1, 1, 1, 0};
    static sc_qp *qps[N];
    for (int i = 0; i < N; i++) qps[i] = sc_qp_new(pd, cq, cq, &cap, 0, (uint32_t)i + 1, 0x7f000001);
    int keys_right;
    pthread_mutex_lock(&ctx->lock);
    CHECK(ctx->heap_len == 0 && sc_timers_first(ctx) == 0); /* idle QPs are not looked at */
    int64_t far = sc_now() + 3600 * 1000000000ll;
    for (int i = 0; i < N; i++) sc_timer_set(qps[i], i % SC_NTIMERS, far + (i * 7919) % 100003 + 1);
    CHECK(ctx->heap_len == N && heap_sound(ctx));
    CHECK(sc_timers_first(ctx) == earliest_of(qps, N, &keys_right) && keys_right);
    for (int i = 0; i < N; i++) { /* stop a third, move a third earlier, a third later */
        if (i % 3 == 0) sc_timer_set(qps[i], i % SC_NTIMERS, 0);
        else sc_timer_set(qps[i], (i + 1) % SC_NTIMERS, far + (i % 3 == 1 ? -(i * 31) : i * 31 + 200000));
    }
    CHECK(ctx->heap_len == N - (N + 2) / 3 && heap_sound(ctx));
    CHECK(sc_timers_first(ctx) == earliest_of(qps, N, &keys_right) && keys_right);
    int64_t now = sc_now();
    for (int k = 0; k < 5; k++) sc_timer_set(qps[k * 100 + 3], T_ACK, now - k); /* due: a pass fires them */
    CHECK(sc_timers_first(ctx) <= now);
    sc_timers_fire(ctx, now);
    for (int k = 0; k < 5; k++) CHECK(qps[k * 100 + 3]->timer[T_ACK] == 0);
    CHECK(sc_timers_first(ctx) > now && heap_sound(ctx));
    CHECK(sc_timers_first(ctx) == earliest_of(qps, N, &keys_right) && keys_right);
    pthread_mutex_unlock(&ctx->lock);
    for (int i = 0; i < N; i += 2) sc_qp_free(qps[i]); /* a freed QP leaves the heap */
    pthread_mutex_lock(&ctx->lock);
    int odd_armed = 0;
    for (int i = 1; i < N; i += 2) odd_armed += qps[i]->due != 0;
    CHECK(ctx->heap_len == (uint32_t)odd_armed && heap_sound(ctx));
    pthread_mutex_unlock(&ctx->lock);
    sc_ctx_free(ctx);
}

/* The end of a fast-path test: its QPs, CQs and context, then the duo under them. */
static void fast_pair_free(sf_ctx *ctx, sf_qp *a, sf_qp *b, sf_cq *fa, sf_cq *fb, struct duo *d) {
    sf_qp_free(a);
    sf_qp_free(b);
    sf_cq_free(fa);
    sf_cq_free(fb);
    sf_ctx_free(ctx);
    sc_ctx_free(d->ca);
    sc_ctx_free(d->cb);
}

/* The fast path over the tcp engine: posts and completions in posting order with the application's
 * wr_ids, an error completion handed to Python (deferred, the ledger given up), and the ledger's
 * hand-over out and back. */
static void test_the_fast_path(void) {
    static uint8_t ma[256], mb[256];
    struct duo d = duo_new(ma, sizeof ma, mb, sizeof mb, ACCESS_LOCAL_WRITE);
    sf_ctx *ctx = sf_ctx_new(&sc_dp_tcp, 1);
    void *cqs_a[1] = {d.qa}, *cqs_b[1] = {d.qb};
    sf_cq *fa = sf_cq_new(ctx, 8, cqs_a, 1, NULL), *fb = sf_cq_new(ctx, 8, cqs_b, 2, NULL);
    sf_qp *a = sf_qp_new(ctx, fa, fa, 4, 4, 2, 16, 0), *b = sf_qp_new(ctx, fb, fb, 4, 4, 2, 16, 0);
    CHECK(sf_qp_add_path(a, 0, d.a, 1) == 0 && sf_qp_add_path(b, 0, d.b, 2) == 0);
    sf_qp_import_done(a, 0, 1, 0, 0);
    sf_qp_import_done(b, 0, 1, 0, 0);
    enum sc_post_error err = SC_POST_OK;
    struct sc_sge sa = {(uint64_t)(uintptr_t)ma, 8, sc_mr_lkey(d.ra)}, sb = {(uint64_t)(uintptr_t)mb, 8,
                                                                          sc_mr_lkey(d.rb)};
    for (uint64_t i = 0; i < 3; i++) {
        struct sc_recv_wr r = {.wr_id = 100 + i, .num_sge = 1, .sg = &sb};
        CHECK(sf_qp_post_recv(b, &r, &err) == SF_POSTED);
    }
    for (uint64_t i = 0; i < 3; i++) { /* the middle one unsignaled: it completes unseen */
        struct sc_send_wr s = {.wr_id = 7 + i, .opcode = WR_SEND, .send_flags = i == 1 ? 0 : SEND_SIGNALED,
                               .num_sge = 1, .sg = &sa};
        CHECK(sf_qp_post_send(a, &s, &err) == SF_POSTED);
    }
    struct sc_wc got[4];
    int sent = 0, received = 0;
    for (int i = 0; i < 20000 && (sent < 2 || received < 3); i++) {
        sf_ctx_progress(ctx, 0);
        sent += sf_cq_take(fa, 4 - sent, &got[sent]);
        received += sf_cq_take(fb, 1, &got[3]) == 1 && got[3].wr_id == (uint64_t)(100 + received);
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    CHECK(sent == 2 && got[0].wr_id == 7 && got[1].wr_id == 9 && got[1].qp_num == 1);
    CHECK(received == 3 && sf_qp_mode(a) == SF_MODE_FAST && !sf_ctx_has_deferred(ctx));
    struct sc_recv_wr r = {.wr_id = 200, .num_sge = 1, .sg = &sb};
    CHECK(sf_qp_post_recv(b, &r, &err) == SF_POSTED);
    struct sf_ledger_view view;
    CHECK(sf_qp_export(b, &view) == 0); /* to Python and back, as a switch's end hands it */
    CHECK(view.rq_count == 1 && view.rq[0].wr.wr_id == 200 && view.received == 3 && view.next_id == 5);
    struct sf_entry kept = view.rq[0];
    CHECK(sf_qp_post_recv(b, &r, &err) == SF_NOT_FAST);
    CHECK(sf_qp_import(b, &kept) == 0);
    sf_qp_import_done(b, 0, view.next_id, view.sent_two_sided, view.received);
    sc_qp_to_err(d.b); /* its receive flushes: an error, which is the failover layer's */
    struct sf_deferred item = {0};
    for (int i = 0; i < 20000 && !sf_ctx_has_deferred(ctx); i++)
        sf_ctx_progress(ctx, 0);
    CHECK(sf_ctx_next_deferred(ctx, &item) == 1 && item.kind == SF_DEFER_WC && item.wc.wr_id == kept.id);
    CHECK(item.wc.status == WC_WR_FLUSH_ERR && sf_qp_mode(b) == SF_MODE_PYTHON);
    fast_pair_free(ctx, a, b, fa, fb, &d);
}

/* A channel's events (raised from Python, or by a completion released to an armed CQ) and its wait: with
 * the default path's provider channel to serve on, the waiting thread leads, arms, waits on the provider
 * channel and makes the pass that releases the completion itself; the default path's watcher then keeps
 * off for a grace. */
static void test_a_channel_wait_leads_on_the_provider_channel(void) {
    static uint8_t ma[64], mb[64];
    struct duo d = duo_new(ma, sizeof ma, mb, sizeof mb, ACCESS_LOCAL_WRITE);
    sf_ctx *ctx = sf_ctx_new(&sc_dp_tcp, 1);
    sf_chan *chan = sf_chan_new(ctx);
    void *cqs_b[1] = {d.qb};
    sf_cq *fb = sf_cq_new(ctx, 8, cqs_b, 2, chan);
    sf_qp *b = sf_qp_new(ctx, fb, fb, 4, 4, 1, 0, 0);
    CHECK(chan && fb && b && sf_qp_add_path(b, 0, d.b, 2) == 0);
    sf_qp_import_done(b, 0, 1, 0, 0);
    uint64_t cookie = 0;
    CHECK(sf_chan_wait(chan, NULL, 0, &cookie) == SF_WAIT_NONE);
    sf_chan_raise(chan, 42);
    CHECK(sf_chan_wait(chan, NULL, 0, &cookie) == SF_WAIT_EVENT && cookie == 42);
    sf_chan_wake(chan);
    CHECK(sf_chan_wait(chan, NULL, 1000, &cookie) == SF_WAIT_WOKEN);
    CHECK(sf_ctx_watch_begin(ctx) == 0); /* nobody has led yet: the watcher may wait on the channel */
    sf_ctx_watch_end(ctx);

    enum sc_post_error err = SC_POST_OK;
    struct sc_sge sb = {(uint64_t)(uintptr_t)mb, 8, sc_mr_lkey(d.rb)}, sa = {(uint64_t)(uintptr_t)ma, 8,
                                                                         sc_mr_lkey(d.ra)};
    struct sc_recv_wr r = {.wr_id = 300, .num_sge = 1, .sg = &sb};
    CHECK(sf_qp_post_recv(b, &r, &err) == SF_POSTED);
    sf_cq_arm(fb);
    struct sc_send_wr s = {.wr_id = 1, .opcode = WR_SEND, .send_flags = SEND_SIGNALED, .num_sge = 1, .sg = &sa};
    int posted = 0;
    memcpy(ma, "lead on", 8);
    CHECK(sc_qp_post_send(d.a, &s, 1, &posted) == SC_POST_OK && posted == 1);
    cookie = 0;
    CHECK(sf_chan_wait(chan, d.chan, 5000, &cookie) == SF_WAIT_EVENT && cookie == 2);
    struct sc_wc got;
    CHECK(sf_cq_take(fb, 1, &got) == 1 && got.wr_id == 300 && got.status == WC_SUCCESS);
    CHECK(memcmp(mb, "lead on", 8) == 0 && !ctx->leader && ctx->led_ns > 0);
    CHECK(sf_ctx_watch_begin(ctx) > 0 && !ctx->watching); /* it led a moment ago: the watcher keeps off */
    CHECK(sf_chan_wait(chan, d.chan, 0, &cookie) == SF_WAIT_NONE); /* one event per arming */
    sf_qp_free(b);
    sf_cq_free(fb);
    sf_chan_free(chan);
    sf_ctx_free(ctx);
    sc_ctx_free(d.ca);
    sc_ctx_free(d.cb);
}

/* A QP settled on a backup path after a failover keeps its ledger in the fast path: its posts go on that
 * path with the path's keys (the default lkey's twin from the context's map, the peer's backup rkey from
 * the QP's own; an rkey it does not know is the failover layer's to look up, SF_NOT_FAST, nothing kept),
 * and that path's completions are its own. Here a's path 1 is the duo's connection; its path 0 unused. */
static void test_the_fast_path_on_a_backup_path(void) {
    static uint8_t ma[256], mb[256];
    struct duo d = duo_new(ma, sizeof ma, mb, sizeof mb, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE);
    sf_ctx *ctx = sf_ctx_new(&sc_dp_tcp, 2);
    void *cqs_a[2] = {NULL, d.qa}, *cqs_b[2] = {d.qb, NULL};
    sf_cq *fa = sf_cq_new(ctx, 8, cqs_a, 1, NULL), *fb = sf_cq_new(ctx, 8, cqs_b, 2, NULL);
    sf_qp *a = sf_qp_new(ctx, fa, fa, 4, 4, 2, 16, 0), *b = sf_qp_new(ctx, fb, fb, 4, 4, 2, 16, 0);
    sc_qp *unused = lone_qp(d.ca);
    CHECK(sf_qp_add_path(a, 0, unused, 9) == 0 && sf_qp_add_path(a, 1, d.a, 1) == 0);
    CHECK(sf_qp_add_path(b, 0, d.b, 2) == 0);
    sf_qp_import_done(a, 1, 1, 0, 0);
    sf_qp_import_done(b, 0, 1, 0, 0);
    const uint32_t default_lkey = 0x51, default_rkey = 0x77; /* what the application knows: not these QPs' */
    CHECK(sf_ctx_set_lkey(ctx, 1, default_lkey, sc_mr_lkey(d.ra)) == 0);
    uint32_t found = 0;
    CHECK(sf_ctx_lkey(ctx, 1, default_lkey, &found) == 1 && found == sc_mr_lkey(d.ra));
    CHECK(sf_ctx_lkey(ctx, 0, default_lkey, &found) == 0 && sf_ctx_set_lkey(ctx, 0, 1, 2) == -1);

    memcpy(ma, "backup!", 8);
    enum sc_post_error err = SC_POST_OK;
    struct sc_sge sa = {(uint64_t)(uintptr_t)ma, 8, default_lkey}, sb = {(uint64_t)(uintptr_t)mb, 8,
                                                                         sc_mr_lkey(d.rb)};
    struct sc_recv_wr r = {.wr_id = 300, .num_sge = 1, .sg = &sb};
    CHECK(sf_qp_post_recv(b, &r, &err) == SF_POSTED);
    struct sc_send_wr write = {.wr_id = 21, .opcode = WR_RDMA_WRITE, .send_flags = SEND_SIGNALED,
                               .rkey = default_rkey, .remote_addr = (uint64_t)(uintptr_t)mb + 64, .num_sge = 1,
                               .sg = &sa};
    CHECK(sf_qp_post_send(a, &write, &err) == SF_NOT_FAST && sf_qp_mode(a) == SF_MODE_FAST);
    struct sf_ledger_view view;
    CHECK(sf_qp_set_rkey(a, 1, default_rkey, sc_mr_rkey(d.rb)) == 0 && sf_qp_set_rkey(a, 0, 1, 2) == -1);
    CHECK(sf_qp_post_send(a, &write, &err) == SF_POSTED);
    struct sc_send_wr send = {.wr_id = 22, .opcode = WR_SEND, .send_flags = SEND_SIGNALED, .num_sge = 1, .sg = &sa};
    CHECK(sf_qp_post_send(a, &send, &err) == SF_POSTED);
    struct sc_wc got[3];
    int sent = 0, received = 0;
    for (int i = 0; i < 20000 && (sent < 2 || !received); i++) {
        sf_ctx_progress(ctx, 1);
        sent += sf_cq_take(fa, 2 - sent, &got[sent]);
        received += sf_cq_take(fb, 1, &got[2]);
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    CHECK(sent == 2 && got[0].wr_id == 21 && got[0].status == WC_SUCCESS && got[0].qp_num == 9);
    CHECK(got[1].wr_id == 22 && got[1].status == WC_SUCCESS);
    CHECK(received == 1 && got[2].wr_id == 300 && memcmp(mb, "backup!", 8) == 0 && memcmp(mb + 64, "backup!", 8) == 0);
    CHECK(sf_qp_mode(a) == SF_MODE_FAST && !sf_ctx_has_deferred(ctx));
    CHECK(sf_qp_export(a, &view) == 0); /* the ledger keeps the application's keys: a replay translates them again */
    CHECK(view.sq_count == 0 && view.next_id == 3);
    sf_ctx_drop_lkey(ctx, 1, default_lkey);
    CHECK(sf_ctx_lkey(ctx, 1, default_lkey, &found) == 0);
    fast_pair_free(ctx, a, b, fa, fb, &d);
}

/* A switch's drain takes its QP's deferred completions on its path out of the queue; the others (another
 * path's, another QP's on the same path, an overflow) stay, in order, for the hand-over under way. */
static void test_a_drain_takes_only_its_qps_deferred_items(void) {
    sf_ctx *ctx = sf_ctx_new(&sc_dp_tcp, 2);
    uint32_t kinds[6] = {SF_DEFER_WC, SF_DEFER_WC, SF_DEFER_WC, SF_DEFER_WC, SF_DEFER_WC, SF_DEFER_OVERFLOW};
    uint32_t paths[6] = {1, 0, 0, 0, 0, 0}, qpns[6] = {7, 7, 7, 8, 7, 7};
    for (uint64_t i = 0; i < 6; i++) {
        struct sf_deferred item = {.kind = kinds[i], .path = paths[i], .wc = {.wr_id = i, .qp_num = qpns[i]}};
        CHECK(sf_ctx_defer(ctx, &item) == 0);
    }
    struct sf_deferred got;
    uint64_t taken[3] = {0}, left[3] = {0};
    for (int i = 0; i < 3; i++)
        CHECK(sf_ctx_next_deferred_on(ctx, 0, 7, &got) == 1 && (taken[i] = got.wc.wr_id, 1));
    CHECK(sf_ctx_next_deferred_on(ctx, 0, 7, &got) == 0);
    CHECK(taken[0] == 1 && taken[1] == 2 && taken[2] == 4);
    for (int i = 0; i < 3; i++)
        CHECK(sf_ctx_next_deferred(ctx, &got) == 1 && (left[i] = got.wc.wr_id, 1));
    CHECK(left[0] == 0 && left[1] == 3 && left[2] == 5 && !sf_ctx_has_deferred(ctx));
    sf_ctx_free(ctx);
}

/* One side of a shift QP pair over two duos (path 0 and path 1), in its own fast-path context, as a shift
 * context has it: its CQ over both paths, path 1's CQ its control CQ, the control receive at the head of
 * path 1, the peer's control MR its count's target, the default keys' twins on path 1. */
struct side {
    sf_ctx *ctx;
    sf_cq *cq;
    sf_qp *qp;
};

static struct side side_new(sc_qp *on0, sc_cq *cq0, sc_qp *on1, sc_cq *cq1, uint32_t qpn, uint8_t *to, sc_mr *target) {
    struct side s;
    void *cqs[2] = {cq0, cq1};
    s.ctx = sf_ctx_new(&sc_dp_tcp, 2);
    s.cq = sf_cq_new(s.ctx, 16, cqs, 1, NULL);
    s.qp = sf_qp_new(s.ctx, s.cq, s.cq, 8, 8, 1, 0, 1);
    CHECK(sf_qp_add_path(s.qp, 0, on0, qpn) == 0 && sf_qp_add_path(s.qp, 1, on1, qpn) == 0);
    sf_ctx_set_control(s.ctx, 1, cq1);
    struct sc_recv_wr control = {.wr_id = SF_CONTROL_IDS};
    int posted = 0;
    CHECK(sf_qp_post_raw_recv(s.qp, 1, &control, 1, &posted) == SC_POST_OK && posted == 1);
    sf_qp_set_target(s.qp, 1, (uint64_t)(uintptr_t)to, sc_mr_rkey(target));
    sf_qp_set_armed(s.qp, 0, 1);
    sf_qp_set_armed(s.qp, 1, 1);
    sf_qp_import_done(s.qp, 0, 1, 0, 0);
    return s;
}

static int news_of(struct side *s, struct sf_news *out, int max) { return sf_qp_news(s->qp, out, max); }

/* Two sides over two paths (d0, d1), freed: the fast path's objects, then the contexts. */
static void sides_free(struct side *a, struct side *b, struct duo *d0, struct duo *d1) {
    struct side *sides[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        sf_qp_free(sides[i]->qp);
        sf_cq_free(sides[i]->cq);
        sf_ctx_free(sides[i]->ctx);
    }
    struct duo *duos[2] = {d0, d1};
    for (int i = 0; i < 2; i++) {
        sc_ctx_free(duos[i]->ca);
        sc_ctx_free(duos[i]->cb);
    }
}

/* The failover made in the core: a's link of path 0 is seen down (the link watch's bit); a's pass stops
 * path 0, moves its receives, sends its count on path 1; b takes the count there, follows (its own path 0
 * stopped), answers with its count and resumes; a resumes: the sends b has complete once, a READ goes
 * again with path 1's keys, a send posted during the handshake is held and goes with the replay. Every
 * message arrives once, in order, every completion comes once, in order, and both QPs stay in the fast
 * path on path 1, with news of both steps for the failover layer. */
static void test_the_failover_in_the_core(void) {
    static uint8_t ma0[256], mb0[256], ca[32], cb[32];
    uint8_t *ma = ma0, *mb = mb0;
    struct duo d0 = duo_new(ma, 256, mb, 256, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ);
    struct duo d1 = duo_new(ma, 256, mb, 256, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ);
    sc_mr *target_a = sc_mr_reg(d1.pa, ca, sizeof ca, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE);
    sc_mr *target_b = sc_mr_reg(d1.pb, cb, sizeof cb, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE);
    struct side a = side_new(d0.a, d0.qa, d1.a, d1.qa, 1, cb, target_b);
    struct side b = side_new(d0.b, d0.qb, d1.b, d1.qb, 2, ca, target_a);
    CHECK(sf_ctx_set_lkey(a.ctx, 1, sc_mr_lkey(d0.ra), sc_mr_lkey(d1.ra)) == 0);
    CHECK(sf_ctx_set_lkey(b.ctx, 1, sc_mr_lkey(d0.rb), sc_mr_lkey(d1.rb)) == 0);
    CHECK(sf_qp_set_rkey(a.qp, 1, sc_mr_rkey(d0.rb), sc_mr_rkey(d1.rb)) == 0);
    enum sc_post_error err = SC_POST_OK;
    for (uint32_t i = 0; i < 5; i++) { /* b's receives: message i lands in mb[8i] */
        struct sc_sge at = {(uint64_t)(uintptr_t)(mb + 8 * i), 8, sc_mr_lkey(d0.rb)};
        struct sc_recv_wr r = {.wr_id = 100 + i, .num_sge = 1, .sg = &at};
        CHECK(sf_qp_post_recv(b.qp, &r, &err) == SF_POSTED);
    }
    memcpy(mb + 128, "readme!", 8);
    struct sc_sge out[5], into = {(uint64_t)(uintptr_t)(ma + 128), 8, sc_mr_lkey(d0.ra)};
    struct sc_send_wr sends[5];
    for (uint32_t i = 0; i < 5; i++) {
        ma[8 * i] = (uint8_t)('A' + i);
        out[i] = (struct sc_sge){(uint64_t)(uintptr_t)(ma + 8 * i), 8, sc_mr_lkey(d0.ra)};
        sends[i] = (struct sc_send_wr){.wr_id = 10 + i, .opcode = WR_SEND, .num_sge = 1, .sg = &out[i]};
    }
    struct sc_send_wr read = {.wr_id = 20, .opcode = WR_RDMA_READ, .rkey = sc_mr_rkey(d0.rb),
                              .remote_addr = (uint64_t)(uintptr_t)(mb + 128), .num_sge = 1, .sg = &into};
    struct sc_wc got_a[8], got_b[8];
    int na = 0, nb = 0;
    CHECK(sf_qp_post_send(a.qp, &sends[0], &err) == SF_POSTED);
    for (int i = 0; i < 20000 && (na < 1 || nb < 1); i++) { /* the first one on path 0 */
        sf_ctx_progress(a.ctx, 0);
        sf_ctx_progress(b.ctx, 0);
        na += sf_cq_take(a.cq, 8 - na, got_a + na);
        nb += sf_cq_take(b.cq, 8 - nb, got_b + nb);
    }
    CHECK(na == 1 && nb == 1);
    pthread_mutex_lock(&d0.cb->lock); /* b's engine answers nothing on path 0 until a has left it: the READ is
                                       * in flight when the link fails, whatever the threads' timing */
    CHECK(sf_qp_post_send(a.qp, &sends[1], &err) == SF_POSTED && sf_qp_post_send(a.qp, &sends[2], &err) == SF_POSTED);
    CHECK(sf_qp_post_send(a.qp, &read, &err) == SF_POSTED_NEW_RKEY); /* its backups to be fetched */
    *sf_ctx_link_word(a.ctx) |= 1u; /* as the link watch raises it, and acts on it on its own thread */
    sf_ctx_links_act(a.ctx);
    pthread_mutex_unlock(&d0.cb->lock);
    CHECK(sf_ctx_link_is_down(a.ctx, 0) && sf_qp_mode(a.qp) == SF_MODE_FAST && a.qp->phase == SF_HANDSHAKE);
    struct sf_ledger_view view;
    CHECK(sf_qp_export(a.qp, &view) == 1 && sf_qp_mode(a.qp) == SF_MODE_FAST); /* its news are read first */
    struct sf_news early[2];
    CHECK(news_of(&a, early, 2) == 1 && early[0].kind == SF_NEWS_SWITCHED);
    /* the failover layer takes the ledger in the middle of the handshake (a post naming a key the core
     * does not know) and gives it back: the QP is in its steady state again, on the path it is on */
    CHECK(sf_qp_export(a.qp, &view) == 0 && sf_qp_mode(a.qp) == SF_MODE_PYTHON && a.qp->phase == SF_STEADY);
    struct sf_entry held[4];
    for (uint32_t i = 0; i < view.sq_count; i++)
        held[i] = view.sq[i];
    for (uint32_t i = 0; i < view.sq_count; i++)
        CHECK(sf_qp_import(a.qp, &held[i]) == 0);
    sf_qp_import_done(a.qp, 1, view.next_id, view.sent_two_sided, view.received);
    CHECK(sf_qp_mode(a.qp) == SF_MODE_FAST && a.qp->phase == SF_STEADY && a.qp->path == 1);
    a.qp->phase = SF_HANDSHAKE; /* the failover layer would finish the handshake; here the core goes on */
    CHECK(sf_qp_post_send(a.qp, &sends[3], &err) == SF_POSTED); /* held until b's count */
    for (int i = 0; i < 40000 && (na < 6 || nb < 5); i++) {
        sf_ctx_progress(a.ctx, 0);
        sf_ctx_progress(b.ctx, 0);
        na += sf_cq_take(a.cq, 8 - na, got_a + na);
        nb += sf_cq_take(b.cq, 8 - nb, got_b + nb);
        if (i == 100) /* b is on path 1 now: a's next send goes there at once */
            CHECK(sf_qp_post_send(a.qp, &sends[4], &err) == SF_POSTED);
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    CHECK(na == 6 && nb == 5);
    for (int i = 0; i < 6; i++) /* in posting order, each once, every one a success */
        CHECK(got_a[i].status == WC_SUCCESS && got_a[i].wr_id == (uint64_t)(i < 3 ? 10 + i : i == 3 ? 20 : 10 + i - 1));
    CHECK(got_a[3].opcode == WCO_RDMA_READ && memcmp(ma + 128, "readme!", 8) == 0);
    for (int i = 0; i < 5; i++)
        CHECK(got_b[i].wr_id == (uint64_t)(100 + i) && got_b[i].status == WC_SUCCESS && mb[8 * i] == 'A' + i);
    struct sf_news news[4];
    CHECK(early[0].left == 0 && early[0].to == 1 && early[0].reason == SF_REASON_NIC_EVENT);
    CHECK(early[0].moved == 0 && early[0].then_ns >= early[0].at_ns);
    CHECK(news_of(&a, news, 4) == 1 && news[0].kind == SF_NEWS_RESUMED && news[0].to == 1);
    CHECK(news[0].moved >= 1); /* the READ at least */
    CHECK(news_of(&b, news, 4) == 2 && news[0].kind == SF_NEWS_SWITCHED && news[0].reason == SF_REASON_PEER);
    CHECK(news[0].moved >= 2 && news[0].moved <= 4 && news[1].kind == SF_NEWS_RESUMED); /* those not yet taken */
    CHECK(sf_qp_mode(a.qp) == SF_MODE_FAST && sf_qp_mode(b.qp) == SF_MODE_FAST);
    CHECK(a.qp->path == 1 && b.qp->path == 1 && a.qp->phase == SF_STEADY && b.qp->phase == SF_STEADY);
    CHECK(sc_qp_state(d0.a) == SC_QPS_ERR && sc_qp_state(d0.b) == SC_QPS_ERR); /* each side stopped path 0 */
    CHECK(!sf_ctx_has_deferred(a.ctx) && !sf_ctx_has_deferred(b.ctx)); /* nothing was left to Python */
    CHECK(sf_ctx_take_news(a.ctx) == 1 && sf_ctx_take_news(a.ctx) == 0); /* its news, flagged once */
    CHECK(sf_ctx_take_news(b.ctx) == 1);
    sf_ctx_link_up(a.ctx, 0);
    CHECK(!sf_ctx_link_is_down(a.ctx, 0));
    sides_free(&a, &b, &d0, &d1);
}

/* The peer follows on its progress thread alone: b never makes a pass; its path-1 control CQ's hook
 * (sf_ctx_controls_act, as the Cython face installs it) takes a's count, switches b, answers with b's
 * count and resumes, all on b's progress thread; a, driven, resumes. */
static void test_the_peer_follows_on_its_progress_thread(void) {
    static uint8_t ma[64], mb[64], ca[32], cb[32];
    struct duo d0 = duo_new(ma, sizeof ma, mb, sizeof mb, ACCESS_LOCAL_WRITE);
    struct duo d1 = duo_new(ma, sizeof ma, mb, sizeof mb, ACCESS_LOCAL_WRITE);
    sc_mr *target_a = sc_mr_reg(d1.pa, ca, sizeof ca, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE);
    sc_mr *target_b = sc_mr_reg(d1.pb, cb, sizeof cb, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE);
    struct side a = side_new(d0.a, d0.qa, d1.a, d1.qa, 1, cb, target_b);
    struct side b = side_new(d0.b, d0.qb, d1.b, d1.qb, 2, ca, target_a);
    sc_cq_set_filled(d1.qb, sf_ctx_controls_act, b.ctx);
    *sf_ctx_link_word(a.ctx) |= 1u;
    sf_ctx_links_act(a.ctx);
    int followed = 0, resumed = 0;
    for (int i = 0; i < 40000 && !(followed && resumed); i++) {
        sf_ctx_lock(a.ctx);
        sf_ctx_progress(a.ctx, 0);
        resumed = a.qp->path == 1 && a.qp->phase == SF_STEADY;
        sf_ctx_unlock(a.ctx);
        sf_ctx_lock(b.ctx);
        followed = b.qp->path == 1 && b.qp->phase == SF_STEADY;
        sf_ctx_unlock(b.ctx);
        usleep(50);
    }
    CHECK(followed && resumed);
    struct sf_news news[4];
    sf_ctx_lock(b.ctx);
    CHECK(news_of(&b, news, 4) == 2 && news[0].kind == SF_NEWS_SWITCHED && news[0].reason == SF_REASON_PEER);
    CHECK(news[1].kind == SF_NEWS_RESUMED && sc_qp_state(d0.b) == SC_QPS_ERR);
    sf_ctx_unlock(b.ctx);
    sc_cq_set_filled(d1.qb, NULL, NULL);
    sides_free(&a, &b, &d0, &d1);
}

int main(void) {
    test_wire_layout();
    test_wire_refuses_what_it_cannot_frame();
    test_keys_and_bounds();
    test_a_connected_pair();
    test_the_last_request_asks_for_its_ack();
    test_the_link_watch_reads_link_messages();
    test_the_link_watch_raises_its_marks();
    test_a_post_arms_the_progress_threads_timer();
    test_a_context_lock_is_recursive();
    test_a_peek_takes_what_the_progress_thread_made();
    test_the_progress_thread_calls_a_cqs_hook();
    test_a_look_leaves_the_progress_thread_awake();
    test_a_wait_makes_its_own_completion();
    test_the_smaller_address_and_qpn_connects();
    test_refusals();
    test_qpns_name_listeners();
    test_timer_heap();
    test_the_fast_path();
    test_the_fast_path_on_a_backup_path();
    test_a_drain_takes_only_its_qps_deferred_items();
    test_a_channel_wait_leads_on_the_provider_channel();
    test_the_failover_in_the_core();
    test_the_peer_follows_on_its_progress_thread();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
