/* The core's internals, shared by its files: one context lock guards every struct below. */
#ifndef SHIFT_CORE_INTERNAL_H
#define SHIFT_CORE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "shift_core.h"
#include "wire.h"

#define SC_STAGING (1u << 16)     /* the context's buffer that small frames are read into */
#define SC_DIRECT (1u << 14)      /* a payload this long is read straight into its place */
#define SC_READ_BUDGET (4u << 20) /* bytes read from one socket per pass before the others get a turn */
#define SC_KEY_BUCKETS 4096
#define SC_INLINE_SPANS 2
#define SC_INLINE_BYTES 64        /* inline data a frame or a send queue entry holds without a malloc */
#define SC_SPARE_FRAMES 64        /* sent frames the context keeps for the next ones */
#define SC_GATHER_FRAMES 16       /* small frames that go out in one sendmsg, at most... */
#define SC_GATHER_BYTES 16384     /* ...while fewer bytes than this are gathered */
#define SC_GATHER_IOV 64
#define SC_ACK_BATCH 16           /* executed requests after which an ACK goes out at once */
#define SC_ACK_DELAY_NS 200000    /* otherwise the longest an ACK waits for a request to ride on */
#define SC_RNR_FOREVER 7
#define SC_DRIVE_GRACE_NS 1000000 /* a caller's pass parks the progress thread for this long (engine.c) */
#define SC_GREETING_MAX 256       /* accepted connections waiting for their HELLO; past it the oldest goes */
#define SC_DRIVE_IDLE_MS 20       /* the longest a blocking wait drives progress before it lets the thread */

/* ibverbs' numbers (libshift.vocabulary.enums) */
enum {
    WR_RDMA_WRITE = 0, WR_RDMA_WRITE_IMM = 1, WR_SEND = 2, WR_SEND_IMM = 3, WR_RDMA_READ = 4,
    WR_CMP_SWP = 5, WR_FETCH_ADD = 6,
};
enum {
    WC_SUCCESS = 0, WC_LOC_LEN_ERR = 1, WC_LOC_PROT_ERR = 4, WC_WR_FLUSH_ERR = 5, WC_BAD_RESP_ERR = 7,
    WC_REM_INV_REQ_ERR = 9, WC_REM_ACCESS_ERR = 10, WC_REM_OP_ERR = 11, WC_RETRY_EXC_ERR = 12,
    WC_RNR_RETRY_EXC_ERR = 13, WC_GENERAL_ERR = 21,
};
enum { WCO_SEND = 0, WCO_RDMA_WRITE = 1, WCO_RDMA_READ = 2, WCO_COMP_SWAP = 3, WCO_FETCH_ADD = 4,
       WCO_RECV = 128, WCO_RECV_RDMA_WITH_IMM = 129 };
enum { WC_FLAG_WITH_IMM = 2 };
enum { SEND_SIGNALED = 2, SEND_SOLICITED = 4, SEND_INLINE = 8 };
enum { ACCESS_LOCAL_WRITE = 1, ACCESS_REMOTE_WRITE = 2, ACCESS_REMOTE_READ = 4, ACCESS_REMOTE_ATOMIC = 8 };

/* A piece of registered memory a transfer uses, with the MR it holds a reference on. */
struct sc_span {
    uint8_t *ptr;
    uint32_t len;
    struct sc_mr *mr;
};

/* Spans with a small inline store, so that the usual one-SGE request allocates nothing. */
struct sc_spans {
    uint32_t count;
    struct sc_span *at;
    struct sc_span inline_at[SC_INLINE_SPANS];
};

struct sc_mr {
    struct sc_ctx *ctx;
    uint32_t pd_id;
    uint8_t *addr;
    uint64_t length;
    uint32_t access, lkey, rkey;
    uint32_t refs; /* the key table's (while registered) and every span's */
    int registered;
    struct sc_mr *next_lkey, *next_rkey; /* key table chains */
    struct sc_mr *next, *prev;           /* the context's list */
};

struct sc_pd {
    struct sc_ctx *ctx;
    uint32_t id;
    struct sc_pd *next, *prev; /* the context's list */
};

struct sc_chan {
    struct sc_ctx *ctx;
    int fd;
    int woken;
    int signalled; /* the eventfd holds a count (its readers drain it) */
    uint32_t refs; /* the owner's and its CQs' */
    int closed;
    struct sc_cq **events;
    uint32_t head, count, size;
    struct sc_chan *next, *prev;
};

enum { ARMED_NONE = 0, ARMED_ANY = 1, ARMED_SOLICITED = 2 };

struct sc_cq {
    struct sc_ctx *ctx;
    struct sc_chan *chan;
    uint64_t cookie;
    struct sc_wc *ring;
    uint32_t cqe, head, count;
    int overflowed, armed;
    uint32_t refs; /* the owner's, its QPs' and the channel's queued events */
    int closed;
    int fresh;                 /* a completion came since the progress thread last called `filled` */
    void (*filled)(void *arg); /* sc_cq_set_filled: called by the progress thread, outside the lock */
    void *filled_arg;
    struct sc_cq *next, *prev;
};

/* An outgoing frame: its header, then the spans of its payload (held until the frame is sent). */
struct sc_frame {
    struct sc_ctx *ctx;
    struct sc_frame *next;
    uint8_t hdr[SC_WIRE_HEADER_SIZE];
    struct sc_spans payload;
    uint8_t *inline_data; /* or the payload is these bytes (owned by the frame: inline_store or malloc'd) */
    uint32_t inline_len;
    uint64_t sent, total;
    uint8_t inline_store[SC_INLINE_BYTES];
};

struct sc_conn {
    struct sc_ctx *ctx;
    struct sc_qp *qp;
    int fd;
    uint64_t watch;
    int closed, closing, shut, want_write;
    /* input */
    uint8_t hdr[SC_WIRE_HEADER_SIZE];
    uint32_t hdr_got;
    int in_frame, placing;
    struct sc_hdr frame;
    uint32_t left;
    struct sc_spans targets;
    uint32_t target_pos, target_off;
    /* output: responses first, then the requester's next request; the frames of one sendmsg (the first
     * may be partly sent) */
    struct sc_frame *out_head, *out_tail;
    struct sc_frame *send_head, *send_tail;
    uint32_t send_count;
    uint64_t send_bytes; /* unsent bytes of those */
    struct sc_conn *next_dead;
    /* an accepted connection before its HELLO has named a QP (qp is NULL): the context's greeting list */
    uint32_t peer_ip, peer_qpn;
    int greeting;
    struct sc_conn *next_greeting, *prev_greeting;
};

struct sc_sq_item {
    uint64_t wr_id, seq;
    uint32_t opcode, length, rkey, imm;
    uint64_t addr, arg1, arg2;
    uint16_t flags;
    int signaled, error;
    uint32_t rnr_tries;
    struct sc_spans local;
    uint8_t *inline_data; /* inline_store, or malloc'd when longer */
    uint8_t inline_store[SC_INLINE_BYTES];
};

enum { T_DEADLINE = 0, T_RNR, T_ACK, SC_NTIMERS }; /* a QP's timers: ack deadline, RNR retry, delayed ACK */

struct sc_rq_item {
    uint64_t wr_id;
    uint64_t capacity;
    int denied; /* an SGE named memory this QP may not write */
    struct sc_spans buffers;
};

/* TCP's view of the path for the ack deadline (liveness.c). */
struct sc_path {
    int have_mark;
    uint64_t mark;
};

struct sc_qp {
    struct sc_ctx *ctx;
    uint32_t pd_id;
    struct sc_cq *send_cq, *recv_cq;
    struct sc_cap cap;
    int sq_sig_all;
    int state;
    uint32_t qpn, local_ip;
    uint64_t connect_watch;
    int connect_fd;
    uint32_t access;
    uint8_t rnr_retry, min_rnr_timer;
    uint32_t remote_ip, remote_qpn;
    int has_remote;
    int welcomed; /* the connecting side: the peer's HELLO has come back, requests may go */
    int refused;  /* the peer has no such QP, or none waiting for us: sends fail RETRY_EXC_ERR at once */
    int taken;    /* the accepting side has taken its connection since the last RTR (one per RTR) */
    /* conn: the connection in use; pending: one whose HELLO named this QP when it could not take it */
    struct sc_conn *conn, *pending;
    /* requester */
    struct sc_sq_item *sq;
    uint32_t sq_head, sq_count;
    uint64_t next_seq, tx_seq;
    int rnr_wait;
    uint64_t ack_timeout_ns, retry_period_ns;
    int64_t deadline, look; /* 0: none */
    struct sc_path path;
    /* responder */
    struct sc_rq_item *rq;
    uint32_t rq_head, rq_count;
    uint32_t expected;
    int has_ack, ack_now; /* ack_now: a request asked for its ack at once (SC_WIRE_FLAG_ACK_REQ) */
    uint32_t ack_seq, unacked;
    int accepted;
    /* timers (0: off), set only through sc_timer_set; due is the earliest, the QP's key in the heap */
    int64_t timer[SC_NTIMERS];
    int64_t due;
    uint32_t heap_pos; /* its place in the context's timer heap, plus one; 0: not in it */
    struct sc_qp *next, *prev;
};

enum { WATCH_FREE = 0, WATCH_CONN, WATCH_LISTEN, WATCH_CONNECTING };

/* A listening socket of the context (listener.c): its port is the top 16 bits of its QPs' numbers. */
struct sc_listener {
    struct sc_ctx *ctx;
    int fd;
    uint64_t watch;
    struct sc_listener *next;
};

struct sc_watch {
    uint32_t gen;
    int kind;
    void *obj;
};

struct sc_ctx {
    pthread_mutex_t lock;
    pthread_t thread;
    int epfd;   /* the sockets: callers' passes and blocking waits wait on it */
    int wakefd;  /* the progress thread's alone: a stop, or output for it to send */
    int timerfd; /* the progress thread's first deadline (CLOCK_MONOTONIC), re-armed by whoever sets one */
    int pfd;     /* the progress thread's wait: epfd, wakefd and timerfd */
    int64_t armed_until; /* what the timerfd is armed for (INT64_MAX or 0: not armed) */
    int stopping;
    int64_t sleep_until; /* when the progress thread's wait ends by itself (0: not waiting) */
    int parked;          /* its wait is a parked one: it looks at the timers again within SC_DRIVE_GRACE_NS */
    /* callers driving progress (engine.c): blocking waits under way, and the last pass a caller made */
    uint32_t drivers;
    int64_t last_drive;
    uint32_t writers; /* connections waiting for room in their socket: the thread sends while callers work */
    struct sc_chan *passing_chan; /* the channel whose waiter is making the pass under way, if any */
    int fresh;                     /* a CQ with a `filled` hook has a completion the hook has not seen */
    int calling;                   /* the progress thread is calling `filled` hooks (unlocked) */
    pthread_cond_t called;         /* signalled when it is done */
    uint64_t failures;
    uint32_t next_pd;
    struct sc_watch *watches;
    uint32_t nwatches;
    struct sc_mr *keys_l[SC_KEY_BUCKETS], *keys_r[SC_KEY_BUCKETS];
    struct sc_pd *pds;
    struct sc_mr *mrs;
    struct sc_cq *cqs;
    struct sc_chan *chans;
    struct sc_qp *qps;
    uint32_t nqps;
    struct sc_qp **heap; /* the QPs with a timer armed, earliest first (timers.c) */
    uint32_t heap_len, heap_cap;
    struct sc_conn *dead; /* closed connections, freed at the end of a pass */
    struct sc_listener *listeners;
    struct sc_conn *greeting; /* accepted connections whose HELLO has not come yet, newest first */
    uint32_t ngreeting;
    struct sc_frame *spare; /* sent frames, for the next ones: no malloc per frame */
    uint32_t nspare;
    uint8_t staging[SC_STAGING];
};

/* cq.c: the `filled` hooks of the CQs with fresh completions, for the progress thread after its pass
 * (lock held on entry and exit, released around the calls). */
void sc_cq_call_filled(struct sc_ctx *ctx);

/* engine.c */
int64_t sc_now(void);
uint64_t sc_watch_add(struct sc_ctx *ctx, int fd, int kind, void *obj, int want_write);
void sc_watch_mod(struct sc_ctx *ctx, int fd, uint64_t watch, int want_write);
void sc_watch_del(struct sc_ctx *ctx, int fd, uint64_t watch);
void sc_engine_wake(struct sc_ctx *ctx);
/* Arm the progress thread's timerfd for `until` (CLOCK_MONOTONIC ns; INT64_MAX: disarm). Lock held. */
void sc_engine_arm(struct sc_ctx *ctx, int64_t until);
/* A non-blocking pass on a caller's thread, which parks the progress thread for SC_DRIVE_GRACE_NS. */
void sc_drive(struct sc_ctx *ctx);
/* A non-blocking pass on a caller's thread that leaves the progress thread as it is: both take what comes. */
void sc_look(struct sc_ctx *ctx);
/* Whether a caller drives progress now (the progress thread parks as soon as it looks). */
int sc_driven(const struct sc_ctx *ctx, int64_t now);

/* timers.c */
/* Room in the heap for this many QPs: 0 when it cannot be had. */
int sc_timers_reserve(struct sc_ctx *ctx, uint32_t qps);
/* Arms (due > 0) or stops (0) one of the QP's timers. */
void sc_timer_set(struct sc_qp *qp, int which, int64_t due);
/* The earliest armed timer of the context, 0: none. */
int64_t sc_timers_first(const struct sc_ctx *ctx);
void sc_timers_fire(struct sc_ctx *ctx, int64_t now);

/* mr.c */
struct sc_mr *sc_mr_local(struct sc_ctx *ctx, uint32_t pd_id, uint32_t lkey);
struct sc_mr *sc_mr_remote(struct sc_ctx *ctx, uint32_t pd_id, uint32_t rkey);
/* The span [addr, addr+len) of mr, referenced; 0 when out of its bounds. */
int sc_mr_span(struct sc_mr *mr, uint64_t addr, uint64_t len, struct sc_span *out);
void sc_mr_put(struct sc_mr *mr);
struct sc_span *sc_spans_alloc(struct sc_spans *spans, uint32_t count);
void sc_spans_release(struct sc_spans *spans);
void sc_mr_free_all(struct sc_ctx *ctx);

/* cq.c */
int sc_cq_push(struct sc_cq *cq, const struct sc_wc *wc, int solicited);
void sc_cq_put(struct sc_cq *cq);
void sc_cq_free_all(struct sc_ctx *ctx);

/* conn.c */
struct sc_conn *sc_conn_new(struct sc_ctx *ctx, struct sc_qp *qp, int fd);
void sc_conn_ready(struct sc_conn *conn, int readable, int writable);
void sc_conn_read_pending(struct sc_conn *conn);
void sc_conn_send(struct sc_conn *conn, struct sc_frame *frame);
void sc_conn_pump(struct sc_conn *conn);
void sc_conn_close_when_sent(struct sc_conn *conn);
void sc_conn_close(struct sc_conn *conn);
void sc_conn_reap(struct sc_ctx *ctx);
struct sc_frame *sc_frame_new(struct sc_ctx *ctx, const struct sc_hdr *hdr);
/* Room for len inline payload bytes in the frame (its own store when they fit), NULL without memory. */
uint8_t *sc_frame_inline(struct sc_frame *frame, uint32_t len);
/* Counts the frame's bytes once its payload is attached. */
void sc_frame_seal(struct sc_frame *frame);
void sc_frame_free(struct sc_frame *frame);
void sc_frames_free_spare(struct sc_ctx *ctx);

/* qp.c: the connection's sink, and what the halves share */
int sc_qp_on_header(struct sc_qp *qp, struct sc_conn *conn, const struct sc_hdr *hdr);
void sc_qp_on_frame(struct sc_qp *qp, struct sc_conn *conn, const struct sc_hdr *hdr, int placed);
void sc_qp_after_input(struct sc_qp *qp, struct sc_conn *conn);
struct sc_frame *sc_qp_next_request(struct sc_qp *qp, struct sc_conn *conn);
void sc_qp_on_broken(struct sc_qp *qp, struct sc_conn *conn);
void sc_qp_connect_ready(struct sc_qp *qp);
/* An accepted connection's HELLO named this QP (conn->peer_qpn is its sender): taken, kept until the
 * next RTR, or refused. */
void sc_qp_on_hello(struct sc_qp *qp, struct sc_conn *conn);
void sc_qp_fire_timers(struct sc_qp *qp, int64_t now);
void sc_qp_enter_error(struct sc_qp *qp);
void sc_qp_send_response(struct sc_qp *qp, struct sc_frame *frame);
void sc_qp_complete_send(struct sc_qp *qp, const struct sc_sq_item *item, int status);
void sc_qp_complete_recv(struct sc_qp *qp, const struct sc_wc *wc, int solicited);
void sc_qp_pump(struct sc_qp *qp);
void sc_qp_free_all(struct sc_ctx *ctx);

/* requester.c */
enum sc_post_error sc_req_post(struct sc_qp *qp, const struct sc_send_wr *wr);
struct sc_frame *sc_req_next(struct sc_qp *qp, int with_ack, uint32_t ack);
int sc_req_unsent(const struct sc_qp *qp);
void sc_req_arm(struct sc_qp *qp);
void sc_req_on_ack(struct sc_qp *qp, uint32_t wire_seq);
void sc_req_on_nak(struct sc_qp *qp, uint32_t wire_seq, uint32_t syndrome, uint64_t rnr_timer);
int sc_req_read_targets(struct sc_qp *qp, const struct sc_hdr *hdr, struct sc_spans *out);
void sc_req_on_read_response(struct sc_qp *qp, const struct sc_hdr *hdr, int placed);
void sc_req_on_atomic_response(struct sc_qp *qp, const struct sc_hdr *hdr);
void sc_req_check_deadline(struct sc_qp *qp);
void sc_req_rnr_resume(struct sc_qp *qp);
void sc_req_fail_head(struct sc_qp *qp, int status);
void sc_req_flush(struct sc_qp *qp, int push);

/* responder.c */
enum sc_post_error sc_resp_post(struct sc_qp *qp, const struct sc_recv_wr *wr);
int sc_resp_on_request(struct sc_qp *qp, const struct sc_hdr *hdr, struct sc_spans *targets);
void sc_resp_on_request_done(struct sc_qp *qp, const struct sc_hdr *hdr, int placed);
int sc_resp_take_ack(struct sc_qp *qp, uint32_t *seq);
void sc_resp_flush(struct sc_qp *qp, int push);

/* listener.c */
void sc_listen_ready(struct sc_listener *listener);
/* An accepted connection from from_ip (host order) that waits for its HELLO; NULL without memory. */
struct sc_conn *sc_listen_adopt(struct sc_ctx *ctx, int fd, uint32_t from_ip);
/* An accepted connection's first header: 1 if it is a HELLO (or the connection is closing anyway), else
 * the connection is closed at once, before any payload is read. */
int sc_listen_first_header(struct sc_conn *conn, const struct sc_hdr *hdr);
/* The first frame of an accepted connection: a HELLO names the QP it is for. */
void sc_listen_on_first(struct sc_conn *conn, const struct sc_hdr *hdr);
/* Answers conn's HELLO, which sought QPN `sought` (from conn->peer_qpn), with REFUSE; the connection
 * closes once that is sent. */
void sc_listen_refuse(struct sc_conn *conn, uint32_t sought);
void sc_listen_forget(struct sc_conn *conn);
void sc_listen_free_all(struct sc_ctx *ctx);

/* liveness.c: 1 alive, 0 not, -1 nothing to compare with yet */
void sc_path_reset(struct sc_path *path);
int sc_path_alive(struct sc_path *path, int fd);

#endif
