/* libFuzzer target: a hostile peer's byte stream into a responder QP (the frame parser, the responder's
 * checks and placement). Built with clang -fsanitize=fuzzer,address,undefined by
 * tests/core/test_core_fuzz.py. Whatever arrives, nothing crashes and no byte changes outside the one MR
 * that grants remote write.
 *
 * The first frame picks the side the stream reaches: a HELLO is an accepted connection's opening, read by
 * the context's listener, which hands it to QP 2 (waiting for QP 1) or refuses it; a HELLO or REFUSE with
 * flag bit 15 set is the answer to QP 1's own HELLO (a QP that connected and waits for it); anything else
 * goes to a connected QP, as before.
 *
 * Keys are random, which a fuzzer cannot guess: a frame whose rkey is below 4 has it replaced by the key
 * of MR number rkey (0: writable, 1: read-only, 2: another PD's, 3: a stale key), and its addr taken as an
 * offset from that MR's start (a signed 16-bit one, so that both edges are hit).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../tests/pair.h"

#define MR_SIZE 4096

static sc_ctx *ctx;
static sc_pd *pd, *other_pd;
static sc_cq *cq;
static sc_mr *mrs[3];
static uint8_t *mem[3];
static uint8_t guard_before[MR_SIZE * 3];

static void setup(void) {
    ctx = sc_ctx_new();
    pd = sc_pd_new(ctx);
    other_pd = sc_pd_new(ctx);
    cq = sc_cq_new(ctx, 1 << 20, NULL, 0);
    static const uint32_t access[3] = {15, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ, 15};
    uint8_t *block = aligned_alloc(64, MR_SIZE * 3);
    for (int i = 0; i < 3; i++) {
        mem[i] = block + i * MR_SIZE;
        memset(mem[i], 0xA5, MR_SIZE);
        mrs[i] = sc_mr_reg(i == 2 ? other_pd : pd, mem[i], MR_SIZE, access[i]);
    }
}

/* Rewrites the keys and addresses of the stream's frames (see the header comment). */
static void aim(uint8_t *data, size_t size) {
    size_t pos = 0;
    while (pos + SC_WIRE_HEADER_SIZE <= size) {
        struct sc_hdr hdr;
        if (sc_wire_parse(data + pos, &hdr) != SC_WIRE_OK) return;
        if (hdr.rkey < 4) {
            int which = (int)hdr.rkey;
            hdr.rkey = which == 3 ? 0xDEADBEEF : sc_mr_rkey(mrs[which]);
            hdr.addr = (uint64_t)(uintptr_t)mem[which % 3] + (uint64_t)(int64_t)(int16_t)hdr.addr;
            sc_wire_pack(&hdr, data + pos);
        }
        pos += SC_WIRE_HEADER_SIZE + (size_t)sc_wire_payload_length(&hdr);
    }
}

static void drain(int fd) {
    uint8_t sink[4096];
    while (recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ctx) setup();
    uint8_t *stream = malloc(size ? size : 1);
    memcpy(stream, data, size);
    aim(stream, size);
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds)) abort();
    struct sc_hdr first = {0};
    int framed = size >= SC_WIRE_HEADER_SIZE && sc_wire_parse(stream, &first) == SC_WIRE_OK;
    int greeting = framed && (first.op == SC_OP_HELLO || first.op == SC_OP_REFUSE);
    sc_qp *qp;
    if (greeting && (first.flags & 0x8000)) {
        qp = qp_on_fd_as(pd, cq, fds[1], 1, 2, 0);
    } else if (greeting && first.op == SC_OP_HELLO) {
        qp = qp_unconnected(pd, cq, 2, 1);
        pthread_mutex_lock(&ctx->lock);
        if (!sc_listen_adopt(ctx, fds[1], 0x7f000001)) abort();
        pthread_mutex_unlock(&ctx->lock);
    } else {
        qp = qp_on_fd(pd, cq, fds[1], 2, 1);
    }
    struct sc_sge sge = {(uint64_t)(uintptr_t)mem[0], 64, sc_mr_lkey(mrs[0])};
    struct sc_recv_wr recv_wr = {.wr_id = 1, .num_sge = 1, .sg = &sge};
    int posted;
    sc_qp_post_recv(qp, &recv_wr, 1, &posted);
    memcpy(guard_before, mem[0], MR_SIZE * 3);
    size_t sent = 0;
    for (int round = 0; round < 10000 && sent < size; round++) {
        ssize_t n = send(fds[0], stream + sent, size - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) sent += (size_t)n;
        sc_ctx_progress(ctx);
        drain(fds[0]);
    }
    shutdown(fds[0], SHUT_WR);
    for (int round = 0; round < 4; round++) {
        sc_ctx_progress(ctx);
        drain(fds[0]);
    }
    if (memcmp(guard_before + MR_SIZE, mem[1], MR_SIZE * 2)) abort(); /* a stray write */
    struct sc_wc wcs[64];
    while (sc_cq_poll(cq, 64, wcs) > 0) {
    }
    sc_qp_free(qp);
    close(fds[0]);
    free(stream);
    return 0;
}
