/* One TCP stream of a QP: frames out with sendmsg, frames in parsed from the context's staging buffer.
 *
 * The connection knows framing only; what a frame means and where its payload goes is the QP's business
 * (sc_qp_on_header answers with the spans to place it into, straight into registered memory). A frame
 * goes out with one sendmsg, header and payload together, and small frames queued together share one.
 * Small frames arrive many to a recv in the staging buffer and are copied out; a payload of SC_DIRECT
 * bytes or more is read by recv into its place. Every length comes from the network and is checked
 * before use.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "internal.h"

struct sc_frame *sc_frame_new(struct sc_ctx *ctx, const struct sc_hdr *hdr) {
    struct sc_frame *frame = ctx->spare;
    if (frame) {
        ctx->spare = frame->next;
        ctx->nspare--;
        memset(frame, 0, offsetof(struct sc_frame, inline_store));
    } else if (!(frame = calloc(1, sizeof *frame))) {
        return NULL;
    }
    frame->ctx = ctx;
    sc_wire_pack(hdr, frame->hdr);
    frame->total = SC_WIRE_HEADER_SIZE;
    return frame;
}

uint8_t *sc_frame_inline(struct sc_frame *frame, uint32_t len) {
    frame->inline_data = len <= SC_INLINE_BYTES ? frame->inline_store : malloc(len);
    frame->inline_len = frame->inline_data ? len : 0;
    return frame->inline_data;
}

void sc_frame_seal(struct sc_frame *frame) {
    frame->total = SC_WIRE_HEADER_SIZE + (uint64_t)frame->inline_len;
    for (uint32_t i = 0; i < frame->payload.count; i++) frame->total += frame->payload.at[i].len;
}

void sc_frame_free(struct sc_frame *frame) {
    sc_spans_release(&frame->payload);
    if (frame->inline_data != frame->inline_store) free(frame->inline_data);
    struct sc_ctx *ctx = frame->ctx;
    if (ctx->nspare >= SC_SPARE_FRAMES) {
        free(frame);
        return;
    }
    frame->next = ctx->spare;
    ctx->spare = frame;
    ctx->nspare++;
}

void sc_frames_free_spare(struct sc_ctx *ctx) {
    while (ctx->spare) {
        struct sc_frame *frame = ctx->spare;
        ctx->spare = frame->next;
        free(frame);
    }
    ctx->nspare = 0;
}

struct sc_conn *sc_conn_new(struct sc_ctx *ctx, struct sc_qp *qp, int fd) {
    struct sc_conn *conn = calloc(1, sizeof *conn);
    if (!conn) return NULL;
    conn->ctx = ctx;
    conn->qp = qp;
    conn->fd = fd;
    conn->watch = sc_watch_add(ctx, fd, WATCH_CONN, conn, 0);
    if (!conn->watch) {
        free(conn);
        return NULL;
    }
    return conn;
}

static void release_targets(struct sc_conn *conn) {
    sc_spans_release(&conn->targets);
    conn->placing = 0;
    conn->target_pos = conn->target_off = 0;
}

void sc_conn_close(struct sc_conn *conn) {
    if (conn->closed) return;
    conn->closed = 1;
    sc_listen_forget(conn);
    if (conn->want_write) conn->ctx->writers--;
    conn->want_write = 0;
    sc_watch_del(conn->ctx, conn->fd, conn->watch);
    close(conn->fd);
    release_targets(conn);
    while (conn->out_head) {
        struct sc_frame *frame = conn->out_head;
        conn->out_head = frame->next;
        sc_frame_free(frame);
    }
    conn->out_tail = NULL;
    while (conn->send_head) {
        struct sc_frame *frame = conn->send_head;
        conn->send_head = frame->next;
        sc_frame_free(frame);
    }
    conn->send_tail = NULL;
    conn->send_count = 0;
    conn->send_bytes = 0;
    conn->next_dead = conn->ctx->dead; /* freed at the end of the pass: callers up the stack still hold it */
    conn->ctx->dead = conn;
}

void sc_conn_reap(struct sc_ctx *ctx) {
    while (ctx->dead) {
        struct sc_conn *conn = ctx->dead;
        ctx->dead = conn->next_dead;
        free(conn);
    }
}

static void broken(struct sc_conn *conn) {
    if (conn->closed) return;
    sc_conn_close(conn);
    if (conn->qp) sc_qp_on_broken(conn->qp, conn);
}

/* -- output ------------------------------------------------------------------------------------------ */

static void set_want_write(struct sc_conn *conn, int want) {
    if (want != conn->want_write && !conn->closed) {
        struct sc_ctx *ctx = conn->ctx;
        conn->want_write = want;
        ctx->writers += want ? 1 : -1;
        sc_watch_mod(ctx, conn->fd, conn->watch, want);
        /* a parked thread would leave the rest to a caller who is busy elsewhere (only a blocking wait
         * sends on by itself): the thread sends while the caller works, as a NIC would */
        if (want && ctx->parked && !ctx->drivers) sc_engine_wake(ctx);
    }
}

/* Piece i of a frame (header, inline bytes, payload spans); 0 past the last. */
static int frame_part(const struct sc_frame *frame, uint32_t i, const uint8_t **base, uint64_t *len) {
    if (i == 0) {
        *base = frame->hdr;
        *len = SC_WIRE_HEADER_SIZE;
        return 1;
    }
    i--;
    if (frame->inline_data) {
        if (i == 0) {
            *base = frame->inline_data;
            *len = frame->inline_len;
            return 1;
        }
        i--;
    }
    if (i >= frame->payload.count) return 0;
    *base = frame->payload.at[i].ptr;
    *len = frame->payload.at[i].len;
    return 1;
}

/* The unsent rest of a frame as at most max iovecs; returns the count. */
static int frame_iov(const struct sc_frame *frame, struct iovec *iov, int max) {
    uint64_t skip = frame->sent, len;
    const uint8_t *base;
    int n = 0;
    for (uint32_t i = 0; n < max && frame_part(frame, i, &base, &len); i++) {
        if (skip >= len) {
            skip -= len;
            continue;
        }
        iov[n].iov_base = (void *)(base + skip);
        iov[n].iov_len = (size_t)(len - skip);
        skip = 0;
        n++;
    }
    return n;
}

/* The next frame to send: a queued response, else the requester's next request (none once closing). */
static struct sc_frame *next_frame(struct sc_conn *conn) {
    struct sc_frame *frame = conn->out_head;
    if (frame) {
        conn->out_head = frame->next;
        if (!conn->out_head) conn->out_tail = NULL;
        return frame;
    }
    return conn->closing || !conn->qp ? NULL : sc_qp_next_request(conn->qp, conn);
}

/* Takes frames into the next sendmsg while they are few and small. */
static void gather(struct sc_conn *conn) {
    while (conn->send_count < SC_GATHER_FRAMES && conn->send_bytes < SC_GATHER_BYTES) {
        struct sc_frame *frame = next_frame(conn);
        if (!frame) return;
        frame->next = NULL;
        if (conn->send_tail) conn->send_tail->next = frame;
        else conn->send_head = frame;
        conn->send_tail = frame;
        conn->send_count++;
        conn->send_bytes += frame->total;
    }
}

/* Frees the frames that `sent` bytes completed; the first left is partly sent. */
static void retire(struct sc_conn *conn, uint64_t sent) {
    conn->send_bytes -= sent;
    while (sent && conn->send_head) {
        struct sc_frame *frame = conn->send_head;
        uint64_t rest = frame->total - frame->sent;
        if (sent < rest) {
            frame->sent += sent;
            return;
        }
        sent -= rest;
        conn->send_head = frame->next;
        if (!conn->send_head) conn->send_tail = NULL;
        conn->send_count--;
        sc_frame_free(frame);
    }
}

void sc_conn_pump(struct sc_conn *conn) {
    while (!conn->closed) {
        gather(conn);
        if (!conn->send_head) break;
        struct iovec iov[SC_GATHER_IOV];
        int n = 0;
        uint64_t offered = 0;
        for (struct sc_frame *f = conn->send_head; f && n < SC_GATHER_IOV; f = f->next)
            n += frame_iov(f, iov + n, SC_GATHER_IOV - n);
        for (int i = 0; i < n; i++) offered += iov[i].iov_len;
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t sent = sendmsg(conn->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                set_want_write(conn, 1);
                return;
            }
            broken(conn);
            return;
        }
        retire(conn, (uint64_t)sent);
        if ((uint64_t)sent < offered) { /* the socket's buffer is full: on when it is writable */
            set_want_write(conn, 1);
            return;
        }
    }
    if (conn->closed) return;
    set_want_write(conn, 0);
    if (conn->closing && !conn->shut && !conn->send_head && !conn->out_head) {
        conn->shut = 1;
        if (shutdown(conn->fd, SHUT_WR) < 0) sc_conn_close(conn);
    }
}

void sc_conn_send(struct sc_conn *conn, struct sc_frame *frame) {
    if (conn->closed) {
        sc_frame_free(frame);
        return;
    }
    frame->next = NULL;
    if (conn->out_tail) conn->out_tail->next = frame;
    else conn->out_head = frame;
    conn->out_tail = frame;
    sc_conn_pump(conn);
}

void sc_conn_close_when_sent(struct sc_conn *conn) {
    /* FIN after the queued NAK, and read on until the peer closes: closing with unread input would make
     * the kernel send RST, which can destroy the NAK in the peer's receive queue before it is read */
    conn->closing = 1;
    sc_conn_pump(conn);
}

/* -- input ------------------------------------------------------------------------------------------- */

static void end_frame(struct sc_conn *conn) {
    int placed = conn->placing;
    conn->in_frame = 0;
    release_targets(conn);
    if (conn->closed) return;
    if (conn->qp) sc_qp_on_frame(conn->qp, conn, &conn->frame, placed);
    else sc_listen_on_first(conn, &conn->frame); /* an accepted connection's HELLO */
}

/* n payload bytes of the current frame arrived at src (NULL: already in place at the current target). */
static void consume(struct sc_conn *conn, const uint8_t *src, uint32_t n) {
    uint32_t left = n;
    while (conn->placing && left) {
        struct sc_span *t = &conn->targets.at[conn->target_pos];
        uint32_t room = t->len - conn->target_off, take = left < room ? left : room;
        if (src) {
            memcpy(t->ptr + conn->target_off, src, take);
            src += take;
        }
        conn->target_off += take;
        left -= take;
        if (conn->target_off == t->len) {
            conn->target_pos++;
            conn->target_off = 0;
        }
    }
    conn->left -= n;
    if (!conn->left) end_frame(conn);
}

static void begin_frame(struct sc_conn *conn) {
    enum sc_wire_problem problem = sc_wire_parse(conn->hdr, &conn->frame);
    if (problem != SC_WIRE_OK) {
        broken(conn); /* a stream that cannot be framed cannot be trusted again */
        return;
    }
    if (!conn->qp && !sc_listen_first_header(conn, &conn->frame)) return;
    conn->in_frame = 1;
    conn->left = sc_wire_payload_length(&conn->frame);
    conn->target_pos = conn->target_off = 0;
    conn->placing = conn->qp ? sc_qp_on_header(conn->qp, conn, &conn->frame) : 0;
    if (conn->placing) {
        uint64_t room = 0;
        for (uint32_t i = 0; i < conn->targets.count; i++) room += conn->targets.at[i].len;
        if (room != conn->left) release_targets(conn); /* never place more or less than was asked */
        while (conn->target_pos < conn->targets.count && !conn->targets.at[conn->target_pos].len)
            conn->target_pos++;
    }
    if (!conn->closed && !conn->left) end_frame(conn);
}

/* Bytes read into buf, 0 when there is nothing more now (or the stream ended). */
static uint32_t receive(struct sc_conn *conn, uint8_t *buf, uint32_t len) {
    for (;;) {
        ssize_t got = recv(conn->fd, buf, len, MSG_DONTWAIT);
        if (got > 0) return (uint32_t)got;
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        broken(conn);
        return 0;
    }
}

static void parse(struct sc_conn *conn) {
    uint8_t *staging = conn->ctx->staging;
    uint32_t pos = 0, end = 0, budget = SC_READ_BUDGET;
    int drained = 0;
    while (!conn->closed) {
        if (pos == end) {
            if (!budget) return;
            if (conn->in_frame && conn->left >= SC_DIRECT) { /* a large payload: straight into place */
                uint8_t *into = staging;
                uint32_t len = conn->left < SC_STAGING ? conn->left : SC_STAGING;
                if (conn->placing) {
                    struct sc_span *t = &conn->targets.at[conn->target_pos];
                    into = t->ptr + conn->target_off;
                    len = t->len - conn->target_off;
                }
                uint32_t got = receive(conn, into, len);
                if (!got) return;
                consume(conn, NULL, got);
                budget = got >= budget ? 0 : budget - got;
                continue;
            }
            if (drained) return;
            uint32_t got = receive(conn, staging, SC_STAGING);
            if (!got) return;
            drained = got < SC_STAGING; /* the socket is empty: save the recv that would say EAGAIN */
            pos = 0;
            end = got;
            budget = got >= budget ? 0 : budget - got;
        }
        if (conn->in_frame) {
            uint32_t take = end - pos < conn->left ? end - pos : conn->left;
            pos += take;
            consume(conn, staging + pos - take, take);
        } else {
            uint32_t take = SC_WIRE_HEADER_SIZE - conn->hdr_got;
            if (take > end - pos) take = end - pos;
            memcpy(conn->hdr + conn->hdr_got, staging + pos, take);
            pos += take;
            conn->hdr_got += take;
            if (conn->hdr_got == SC_WIRE_HEADER_SIZE) {
                conn->hdr_got = 0;
                begin_frame(conn);
            }
        }
    }
}

void sc_conn_ready(struct sc_conn *conn, int readable, int writable) {
    if (writable) sc_conn_pump(conn);
    if (readable && !conn->closed) {
        parse(conn);
        if (!conn->closed && conn->qp) sc_qp_after_input(conn->qp, conn);
    }
}

void sc_conn_read_pending(struct sc_conn *conn) { sc_conn_ready(conn, 1, 0); }
