/* The context's listening sockets, and the HELLO that tells their connections apart.
 *
 * A QP is reached by (GID, QPN) alone, as on RoCE, where every QP of a device sits behind UDP port 4791.
 * A TCP port cannot be shared by every process of a host the way 4791 is shared by the NIC, so each context
 * listens on ports of its own and a QPN says which: QPN = port << 8 | index (docs/core.md). An accepted
 * connection waits on the greeting list until its first frame, a HELLO naming the QP it is for; a HELLO
 * for a QPN this context does not have is answered with REFUSE, which the asker sees at once as an error.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "internal.h"

int sc_ctx_listen(sc_ctx *ctx, int fd) {
    struct sc_listener *listener = calloc(1, sizeof *listener);
    if (!listener) return -1;
    listener->ctx = ctx;
    listener->fd = fd;
    pthread_mutex_lock(&ctx->lock);
    listener->watch = sc_watch_add(ctx, fd, WATCH_LISTEN, listener, 0);
    if (listener->watch) {
        listener->next = ctx->listeners;
        ctx->listeners = listener;
    }
    pthread_mutex_unlock(&ctx->lock);
    if (!listener->watch) {
        free(listener);
        return -1;
    }
    return 0;
}

void sc_listen_free_all(struct sc_ctx *ctx) {
    while (ctx->greeting) sc_conn_close(ctx->greeting);
    while (ctx->listeners) {
        struct sc_listener *listener = ctx->listeners;
        ctx->listeners = listener->next;
        sc_watch_del(ctx, listener->fd, listener->watch);
        close(listener->fd);
        free(listener);
    }
}

/* The greeting list holds the connections no QP owns: those waiting for their HELLO, and those refused
 * and closing, so that the context closes them if their peers never do. */
static void track(struct sc_ctx *ctx, struct sc_conn *conn) {
    if (ctx->ngreeting >= SC_GREETING_MAX) { /* one that never speaks must not hold a slot for ever */
        struct sc_conn *oldest = ctx->greeting;
        while (oldest->next_greeting) oldest = oldest->next_greeting;
        sc_conn_close(oldest);
    }
    conn->greeting = 1;
    conn->next_greeting = ctx->greeting;
    if (ctx->greeting) ctx->greeting->prev_greeting = conn;
    ctx->greeting = conn;
    ctx->ngreeting++;
}

struct sc_conn *sc_listen_adopt(struct sc_ctx *ctx, int fd, uint32_t from_ip) {
    struct sc_conn *conn = sc_conn_new(ctx, NULL, fd);
    if (!conn) return NULL;
    conn->peer_ip = from_ip;
    track(ctx, conn);
    return conn;
}

void sc_listen_forget(struct sc_conn *conn) {
    struct sc_ctx *ctx = conn->ctx;
    if (!conn->greeting) return;
    if (conn->prev_greeting) conn->prev_greeting->next_greeting = conn->next_greeting;
    else ctx->greeting = conn->next_greeting;
    if (conn->next_greeting) conn->next_greeting->prev_greeting = conn->prev_greeting;
    conn->greeting = 0;
    conn->next_greeting = conn->prev_greeting = NULL;
    ctx->ngreeting--;
}

void sc_listen_ready(struct sc_listener *listener) {
    struct sockaddr_in from;
    socklen_t len = sizeof from;
    int fd = accept4(listener->fd, (struct sockaddr *)&from, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (from.sin_family != AF_INET) {
        close(fd);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (!sc_listen_adopt(listener->ctx, fd, ntohl(from.sin_addr.s_addr))) close(fd);
}

static struct sc_qp *find_qp(struct sc_ctx *ctx, uint32_t qpn) {
    /* a scan, once per connection: a context holds hundreds of QPs, not millions */
    for (struct sc_qp *qp = ctx->qps; qp; qp = qp->next)
        if (qp->qpn == qpn) return qp;
    return NULL;
}

void sc_listen_refuse(struct sc_conn *conn, uint32_t sought) {
    struct sc_hdr refuse = {.op = SC_OP_REFUSE, .seq = sought, .imm = conn->peer_qpn};
    struct sc_frame *frame = sc_frame_new(conn->ctx, &refuse);
    conn->qp = NULL;
    if (!conn->greeting) track(conn->ctx, conn);
    if (!frame) {
        sc_conn_close(conn);
        return;
    }
    sc_conn_send(conn, frame);
    sc_conn_close_when_sent(conn);
}

int sc_listen_first_header(struct sc_conn *conn, const struct sc_hdr *hdr) {
    if (conn->closing || hdr->op == SC_OP_HELLO) return 1;
    sc_conn_close(conn); /* no peer of ours: a QP's connection opens with HELLO */
    return 0;
}

void sc_listen_on_first(struct sc_conn *conn, const struct sc_hdr *hdr) {
    if (conn->closing) return; /* refused already: what follows is read and dropped until the peer closes */
    conn->peer_qpn = hdr->seq;
    struct sc_qp *qp = find_qp(conn->ctx, hdr->imm);
    if (!qp) {
        sc_listen_refuse(conn, hdr->imm);
        return;
    }
    sc_listen_forget(conn); /* the QP owns it now */
    sc_qp_on_hello(qp, conn);
}
