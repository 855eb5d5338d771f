/* The shift core's API: a software RC transport over kernel TCP (the tcp provider's engine).
 *
 * Objects belong to a context (sc_ctx), whose progress thread (pthread + epoll) moves the bytes while
 * nobody polls; a poll that finds its CQ empty makes one non-blocking pass itself. Every call takes the
 * context's lock, so any thread may call; nothing here calls back into the caller. Numbers are ibverbs'
 * (opcodes, statuses, access and send flags), as libshift.vocabulary spells them.
 *
 * Ownership: sc_ctx_free frees every object of the context. Before that, each object is freed by its own
 * call; an MR's memory belongs to the caller, who may let it go once sc_mr_try_free has said yes. Sockets
 * are made by the caller (inside the device's network namespace, bound to its netdev) and handed over.
 */
#ifndef SHIFT_CORE_H
#define SHIFT_CORE_H

#include <stdint.h>

typedef struct sc_ctx sc_ctx;
typedef struct sc_pd sc_pd;
typedef struct sc_mr sc_mr;
typedef struct sc_cq sc_cq;
typedef struct sc_chan sc_chan;
typedef struct sc_qp sc_qp;

struct sc_sge {
    uint64_t addr;
    uint32_t length;
    uint32_t lkey;
};

struct sc_send_wr {
    uint64_t wr_id;
    uint32_t opcode;     /* ibv_wr_opcode */
    uint32_t send_flags; /* ibv_send_flags */
    uint32_t imm_data;
    uint32_t rkey;
    uint64_t remote_addr, compare_add, swap;
    uint32_t num_sge;
    const struct sc_sge *sg;
};

struct sc_recv_wr {
    uint64_t wr_id;
    uint32_t num_sge;
    const struct sc_sge *sg;
};

struct sc_wc {
    uint64_t wr_id;
    uint32_t status, opcode, qp_num, byte_len, imm_data, wc_flags, src_qp;
};

struct sc_cap {
    uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data;
};

/* Why a post was refused (the WRs before the refused one stay posted). */
enum sc_post_error {
    SC_POST_OK = 0,
    SC_POST_STATE,      /* the QP's state does not take this post */
    SC_POST_QUEUE_FULL, /* max_send_wr / max_recv_wr */
    SC_POST_OPCODE,     /* not a send opcode */
    SC_POST_SGES,       /* more SGEs than max_send_sge / max_recv_sge */
    SC_POST_INLINE,     /* more inline bytes than max_inline_data */
    SC_POST_ATOMIC,     /* an atomic needs one SGE of 8 bytes */
    SC_POST_NOMEM,
    SC_POST_DEVICE, /* the verbs backend's device refused it (verbs_core.h) */
};

enum sc_qp_state { SC_QPS_RESET = 0, SC_QPS_INIT = 1, SC_QPS_RTR = 2, SC_QPS_RTS = 3, SC_QPS_ERR = 6 };

/* The context: NULL with errno set when its thread or descriptors cannot be had. */
sc_ctx *sc_ctx_new(void);
void sc_ctx_free(sc_ctx *ctx);
/* One non-blocking pass of progress on the caller's thread. */
void sc_ctx_progress(sc_ctx *ctx);
/* Handler failures the engine survived (a protocol error counts as the peer's fault, not one of these). */
uint64_t sc_ctx_failures(sc_ctx *ctx);

sc_pd *sc_pd_new(sc_ctx *ctx);
/* Deregisters the PD's MRs (their structs stay until sc_mr_try_free) and frees the PD. */
void sc_pd_free(sc_pd *pd);

sc_mr *sc_mr_reg(sc_pd *pd, void *addr, uint64_t length, uint32_t access);
uint32_t sc_mr_lkey(const sc_mr *mr);
uint32_t sc_mr_rkey(const sc_mr *mr);
/* The keys stop working now; a transfer under way into or out of the memory goes on until it ends. */
void sc_mr_dereg(sc_mr *mr);
/* 1 (and the MR is freed) once it is deregistered and nothing uses its memory any more, else 0. */
int sc_mr_try_free(sc_mr *mr);

/* A completion channel: its fd (an eventfd) is readable while an event may be waiting. */
sc_chan *sc_chan_new(sc_ctx *ctx);
int sc_chan_fd(const sc_chan *chan);
/* 1 and the CQ's cookie: an event; 2: woken by sc_chan_wake; 0: nothing now. */
int sc_chan_take(sc_chan *chan, uint64_t *cookie);
/* sc_chan_take after waiting up to timeout_ms (-1: no limit) for it to say something (0: the time is up).
 * With drive set the caller's thread waits on the context's sockets too and makes the passes itself (the
 * progress thread stays parked) until they have been idle for SC_DRIVE_IDLE_MS: 3 then says wait on
 * without drive, the progress thread's again. */
int sc_chan_wait(sc_chan *chan, int timeout_ms, int drive, uint64_t *cookie);
void sc_chan_wake(sc_chan *chan);
void sc_chan_free(sc_chan *chan);
/* Wakes every channel of the context (as sc_chan_wake): its waiters return, before the context goes. */
void sc_ctx_wake_waiters(sc_ctx *ctx);

sc_cq *sc_cq_new(sc_ctx *ctx, uint32_t cqe, sc_chan *chan, uint64_t cookie);
/* Up to n completions into out, oldest first; -1 once the CQ has overflowed. An empty CQ makes a pass of
 * the context on the caller's thread first (a busy poll moves its own data). */
int sc_cq_poll(sc_cq *cq, int n, struct sc_wc *out);
/* As sc_cq_poll, but only what is already made: no pass, so the context's progress thread keeps making
 * progress (a poll's pass parks it); for a CQ looked at often that is usually idle. */
int sc_cq_peek(sc_cq *cq, int n, struct sc_wc *out);
/* As sc_cq_poll, but the pass leaves the progress thread unparked: it takes a frame as soon as it comes
 * while the caller's passes take it as soon as they look (a path in the middle of a failover). */
int sc_cq_look(sc_cq *cq, int n, struct sc_wc *out);
void sc_cq_req_notify(sc_cq *cq, int solicited_only);
/* `fn(arg)` is called on the context's progress thread, outside its lock, after each of its passes in which
 * the CQ got a completion (not after a caller's: that caller takes it): a layer above acts on a control
 * message the moment it comes, with no caller's poll in the way. fn NULL: no more calls; it returns once
 * a call under way has ended (so it must not be made from inside fn, nor while holding a lock fn takes). */
void sc_cq_set_filled(sc_cq *cq, void (*fn)(void *arg), void *arg);
void sc_cq_free(sc_cq *cq);

/* Hands the context a listening socket (bound to its device's address): it accepts the connections of
 * its QPs' peers and gives each to the QP its HELLO names (listener.c). A QPN names its listener: the port
 * is qpn >> 8, so a peer needs no more than the GID and the QPN. 0, or -1 without memory. */
int sc_ctx_listen(sc_ctx *ctx, int listen_fd);
/* A QP numbered qpn (port << 8 | index, the port one of the context's listeners) at local_ip (host order). */
sc_qp *sc_qp_new(sc_pd *pd, sc_cq *send_cq, sc_cq *recv_cq, const struct sc_cap *cap, int sq_sig_all,
                 uint32_t qpn, uint32_t local_ip);
int sc_qp_state(sc_qp *qp);
void sc_qp_to_init(sc_qp *qp, uint32_t access);
/* Whether this QP connects to that peer at RTR: the side with the smaller (address, QPN) connects, to the
 * peer's port (remote_qpn >> 8); the other takes the peer's connection from its listener. */
int sc_qp_connects(const sc_qp *qp, uint32_t remote_ip, uint32_t remote_qpn);
/* The device's address now, for the rule above: a NIC re-addressed since the QP was made (before RTR). */
void sc_qp_set_local_ip(sc_qp *qp, uint32_t local_ip);
/* fd: a non-blocking socket bound to the device for the side that connects (sc_qp_connects), or -1 when
 * none could be made or this side accepts; one given to the accepting side is closed. */
void sc_qp_to_rtr(sc_qp *qp, uint32_t remote_ip, uint32_t remote_qpn, uint32_t rq_psn, uint8_t min_rnr_timer,
                  int fd);
/* ack_timeout_ns 0: no deadline; the send PSN is taken when coming from RTR. */
void sc_qp_to_rts(sc_qp *qp, uint64_t ack_timeout_ns, uint64_t retry_period_ns, uint8_t rnr_retry,
                  uint32_t sq_psn);
void sc_qp_to_err(sc_qp *qp);
void sc_qp_reset(sc_qp *qp);
/* Posts wrs in order; *posted says how many went in before a refusal. */
enum sc_post_error sc_qp_post_send(sc_qp *qp, const struct sc_send_wr *wrs, int n, int *posted);
enum sc_post_error sc_qp_post_recv(sc_qp *qp, const struct sc_recv_wr *wrs, int n, int *posted);
void sc_qp_free(sc_qp *qp);

/* Baselines (baseline.c): plain TCP on a connected blocking socket, none of the above. The half round
 * trip in seconds of iters size-byte ping-pongs (first: this side sends first); a stream of total bytes in
 * chunk-byte writes, in bytes/s as the sender sees it once the receiver has said it got them all. Both
 * -1 when the socket failed. */
double sc_raw_pingpong(int fd, uint32_t size, uint32_t iters, int first);
double sc_raw_stream(int fd, uint64_t total, uint32_t chunk, int sending);

#endif
