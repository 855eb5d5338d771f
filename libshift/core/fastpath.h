/* The steady state of a shift QP in C (issue 18's item 3): posting on the path in use, taking its
 * completions and releasing them to the application's CQ in posting order, behind one call each, over
 * either backend's data path (datapath.h); and the failover of a QP in that state (fast_switch.c), when
 * its path's link is seen down or the peer's count comes on a backup path.
 *
 * A shift QP's ledger (every application WR until its completion is handed over) is owned either here
 * (the fast mode: connected, on the default path or settled on a backup after a failover, nothing
 * unusual) or by the Python failover layer
 * (libshift.shift), which hands it over both ways: sf_qp_export before it acts, sf_qp_import_* when the
 * QP is back in its steady state. Anything unusual met here (an error completion, a control WR's
 * completion, one from another path, a full application CQ) gives the ledger up at once and leaves the
 * completion, in order, in the context's deferred queue for Python. An armed CQ's event is raised on its
 * channel at once (fast_chan.c).
 *
 * One mutex per context serializes the calls: the Cython face takes it around each (sf_ctx_lock), with
 * no Python run while it is held, and the link watch's thread takes it to fail QPs over the moment it
 * reads a link's failure (sf_ctx_links_act), without the interpreter lock. Nothing here takes it itself,
 * so a caller on one thread (the unit tests) needs none. The backends' objects are passed as void *.
 */
#ifndef SHIFT_CORE_FASTPATH_H
#define SHIFT_CORE_FASTPATH_H

#include <stdint.h>

#include "datapath.h"

#define SF_PATHS 8                    /* the default path and up to seven backups (libshift.shift.paths) */
#define SF_CONTROL_IDS (1ull << 62)   /* wr_ids at or above this are the failover layer's control WRs */
#define SF_POLL_BATCH 32
#define SF_BACKUP_HOT_NS 50000000     /* a pass drives the backup paths for this long after they last moved */
#define SF_SWITCH_LOOK_NS 5000000     /* and looks at them (leaves their progress threads awake) this long
                                       * after a switch began: its handshake and replay come there */

typedef struct sf_ctx sf_ctx;
typedef struct sf_cq sf_cq;
typedef struct sf_qp sf_qp;
typedef struct sf_chan sf_chan;

enum sf_mode { SF_MODE_PYTHON = 0, SF_MODE_FAST = 1 };

/* What waits for Python in the deferred queue. */
enum sf_deferred_kind {
    SF_DEFER_WC = 0,       /* a provider completion of `path` for the failover layer */
    SF_DEFER_OVERFLOW = 1, /* the QP (wc.qp_num, its default QPN) overflowed its CQ: it must fail */
};

/* What a switch made here tells the failover layer (sf_qp_news), so that its view of the QP follows. */
enum sf_news_kind {
    SF_NEWS_SWITCHED = 1, /* left `left` for `to`, `moved` receives moved, our count sent: awaiting the peer's */
    SF_NEWS_RESUMED = 2,  /* the peer's count came: `moved` sends posted before went again on `to` */
};
enum sf_reason {
    SF_REASON_NIC_EVENT = 1, /* the path's link was seen down (the link watch, or shiftd's word) */
    SF_REASON_PEER = 2,      /* the peer's count came on another path */
};
struct sf_news {
    uint32_t kind, left, to, reason, moved;
    /* CLOCK_MONOTONIC. SWITCHED: when it began, when the old path was stopped and drained, when the count
     * was sent; RESUMED: when the peer's count was taken, -, when the replay was posted */
    int64_t at_ns, stopped_ns, then_ns;
};
#define SF_NEWS_MAX 8 /* news a QP keeps until the failover layer reads it; past it, switches are left to it */

struct sf_deferred {
    uint32_t kind, path;
    uint64_t cookie;
    struct sc_wc wc;
};

/* What sf_qp_post_* says. */
enum sf_post {
    SF_POSTED = 0,
    SF_POSTED_NEW_RKEY = 1, /* posted; its rkey is one this QP had not used before (fetch its backups) */
    SF_NOT_FAST = 2,        /* the ledger is Python's, or the peer's key on the path is not known: post there */
    SF_QUEUE_FULL = 3,      /* the application's max_send_wr / max_recv_wr */
    SF_REFUSED = 4,         /* the backend refused it (*err says why); nothing is kept */
};

/* One application WR as the ledger keeps it (the Python Ledger's Entry). */
struct sf_entry {
    uint64_t id;      /* ours, what the provider sees */
    struct sc_send_wr wr; /* the application's (wr.sg is this entry's own copy of its SGEs) */
    int is_send, signaled, posted, done;
    int64_t index;    /* position among two-sided sends, -1 for others */
    uint32_t failed_with; /* the error it got on a path since left (0: none) */
    uint32_t inline_len;  /* bytes of an inline send kept in `inline_copy` (0: none) */
    uint8_t *inline_copy;
    struct sc_wc wc;  /* once done: the completion to hand over */
};

sf_ctx *sf_ctx_new(const struct sc_dp *dp, int paths);
void sf_ctx_free(sf_ctx *ctx);
/* A backup path's control CQ (its WCs always go to Python). */
void sf_ctx_set_control(sf_ctx *ctx, int path, void *cq);
/* The default path's lkey `lkey` is `path_lkey` on backup `path` (the lkey of its MR's twin there): what a
 * post on that path sends instead. 0, or -1 (no memory). An lkey the map lacks goes out as it is. */
int sf_ctx_set_lkey(sf_ctx *ctx, int path, uint32_t lkey, uint32_t path_lkey);
void sf_ctx_drop_lkey(sf_ctx *ctx, int path, uint32_t lkey);
/* 1 with *path_lkey when the map has lkey, else 0. */
int sf_ctx_lkey(const sf_ctx *ctx, int path, uint32_t lkey, uint32_t *path_lkey);
/* Take completions out of every provider CQ and hand each on, driving the default path's transport, and
 * the backup paths' while they are hot or when `everything`. -1 if a provider CQ overflowed, else 0. */
int sf_ctx_progress(sf_ctx *ctx, int everything);
/* Drain one path of one CQ (cq NULL: that path's control CQ). */
int sf_ctx_drain(sf_ctx *ctx, sf_cq *cq, int path);
/* The oldest deferred item into *out: 1, or 0 when there is none. */
int sf_ctx_next_deferred(sf_ctx *ctx, struct sf_deferred *out);
int sf_ctx_has_deferred(const sf_ctx *ctx);
/* The oldest deferred completion of provider QP `qpn` on `path` into *out, taken out of the queue (the
 * items before it, of other QPs and of other paths stay, in order): what a switch's drain of the path it
 * leaves must see at once. Another QP's error there is not its business: handed over inside the switch, it would start that
 * QP's switch inside this one, and with a thousand QPs on one CQ the switches nested a thousand deep. */
int sf_ctx_next_deferred_on(sf_ctx *ctx, int path, uint32_t qpn, struct sf_deferred *out);
/* The word whose bit `path` says the path's link was seen down: the link watch raises a bit from its own
 * thread, atomically (linkwatch.h), and the next pass of progress moves the fast-mode QPs off that path. */
uint32_t *sf_ctx_link_word(sf_ctx *ctx);
/* The context's mutex (recursive), around every other call but those on the link word. */
void sf_ctx_lock(sf_ctx *ctx);
void sf_ctx_unlock(sf_ctx *ctx);
/* Act on the links seen down at once, on the caller's thread (the link watch's: sc_link_mark's `act`):
 * takes the mutex, moves the fast-mode QPs off them (fast_switch.c). `ctx` is an sf_ctx. */
void sf_ctx_links_act(void *ctx);
/* Take what the backup paths' control CQs hold (the peer's count: its switch, or our resume, made at once)
 * on the caller's thread, without driving a transport: the hook of a backup path's control CQ on its
 * backend's own thread (the tcp engine's progress thread, sc_cq_set_filled). Takes the mutex. */
void sf_ctx_controls_act(void *ctx);
/* The same, from the interpreter's thread (shiftd's word); and whether the bit is up. */
void sf_ctx_link_down(sf_ctx *ctx, int path);
int sf_ctx_link_is_down(const sf_ctx *ctx, int path);
/* The link of `path` carries traffic again (shiftd's UP, after its flap damping). */
void sf_ctx_link_up(sf_ctx *ctx, int path);
/* Whether a QP has news (sf_qp_news) since the last call; the flag is cleared. The failover layer follows
 * them off the application's poll (its watcher), and before it acts on a QP. */
int sf_ctx_take_news(sf_ctx *ctx);
/* Whether a backup path carried traffic within SF_BACKUP_HOT_NS. */
int sf_ctx_backup_hot(const sf_ctx *ctx);
/* Drive the backup paths on every pass for SF_BACKUP_HOT_NS from now, as if they had carried traffic: a
 * switch is under way, and the peer's count and the replay's acks come there; for the first
 * SF_SWITCH_LOOK_NS of it, a look, which leaves their progress threads awake to take them at once. */
void sf_ctx_heat_backups(sf_ctx *ctx);

/* A CQ of cqe entries over one provider CQ per path; cookie names it in its channel's events (chan: NULL for
 * none). Its default path's provider CQ reports to the channel the applications' waits serve on. */
sf_cq *sf_cq_new(sf_ctx *ctx, uint32_t cqe, void *const *path_cqs, uint64_t cookie, sf_chan *chan);
void sf_cq_free(sf_cq *cq);
/* A completion released to the application: 0, or -1 once the CQ has overflowed (it is lost). An armed CQ
 * is disarmed by it and raises an event on its channel (an overflow too: a waiter must wake to meet it). */
int sf_cq_push(sf_cq *cq, const struct sc_wc *wc);
/* Up to n released completions, oldest first; -1 once the CQ has overflowed. */
int sf_cq_take(sf_cq *cq, int n, struct sc_wc *out);
uint32_t sf_cq_ready(const sf_cq *cq);
void sf_cq_arm(sf_cq *cq);

/* -- completion channels (fast_chan.c) -------------------------------------------------------------------- */

/* A channel: the events of its armed CQs, raised in C wherever a completion is released. Its waits make the
 * progress themselves: of the threads waiting on a context's channels, one at a time (the leader) waits on
 * the default path's provider channel `serve` (driving its transport) and makes the pass that releases the
 * completions, on its own thread, as a bare channel's waiter does; the others wait on their channel's
 * eventfd, written when an event is raised for them, and when the leader leaves (one of them leads next).
 * While a backup path is hot nobody leads: the context's watcher threads make progress and raise the
 * events. Every call but sf_chan_wait is made holding the context's mutex; sf_chan_wait takes it itself. */
enum sf_wait {
    SF_WAIT_NONE = 0,  /* the time is up */
    SF_WAIT_EVENT = 1, /* *cookie: an armed CQ of the channel got a completion */
    SF_WAIT_WOKEN = 2, /* sf_chan_wake, or the provider channel's wake-up (its close) */
    SF_WAIT_PASS = 3,  /* the deferred queue holds items: make a pass in Python (hand them over), wait again */
};
#define SF_SERVE_GRACE_NS 10000000 /* the default path's watcher keeps off `serve` this long after a leader */
#define SF_HANDOFF_NS 1000000      /* a leader's longest wait while the watcher may be on `serve` too */

sf_chan *sf_chan_new(sf_ctx *ctx);
/* Its CQs forget it (their events are dropped); its waiters must have left (sf_chan_wake). */
void sf_chan_free(sf_chan *chan);
/* An event of the CQ `cookie` (the failover layer's, or Python's own wake-up of a waiter). */
void sf_chan_raise(sf_chan *chan, uint64_t cookie);
void sf_chan_wake(sf_chan *chan);
/* Wait up to timeout_ms (-1: no limit) for an event; `serve` (the backend's channel of the default path, or
 * NULL: follow only) as above. Called without the mutex, and without the interpreter lock. */
int sf_chan_wait(sf_chan *chan, void *serve, int timeout_ms, uint64_t *cookie);
/* The default path's watcher, before it makes its pass and waits on `serve`: 0, and it is on it until
 * sf_ctx_watch_end; or the ns to keep off it (a waiter leads, or did within SF_SERVE_GRACE_NS). */
int64_t sf_ctx_watch_begin(sf_ctx *ctx);
void sf_ctx_watch_end(sf_ctx *ctx);

/* A QP: its application caps and sq_sig_all; the provider QPs are added per path. */
sf_qp *sf_qp_new(sf_ctx *ctx, sf_cq *send_cq, sf_cq *recv_cq, uint32_t max_send_wr, uint32_t max_recv_wr,
                 uint32_t max_sge, uint32_t max_inline, int sig_all);
/* The provider QP of `path`, numbered qpn: its completions come to this QP (path 0's qpn is the QP's). */
int sf_qp_add_path(sf_qp *qp, int path, void *provider_qp, uint32_t qpn);
/* The peer's default rkey `rkey` is `path_rkey` on its side of backup `path`. A fast-mode post on a backup
 * path whose rkey the map lacks is SF_NOT_FAST: the failover layer looks the key up. 0, or -1. */
int sf_qp_set_rkey(sf_qp *qp, int path, uint32_t rkey, uint32_t path_rkey);
/* Whether `path` is armed (connected, our control receive at the head of its queue): where a switch may go. */
void sf_qp_set_armed(sf_qp *qp, int path, int armed);
/* The peer's control MR on `path`, where our count goes (an RDMA_WRITE_WITH_IMM). */
void sf_qp_set_target(sf_qp *qp, int path, uint64_t addr, uint32_t rkey);
/* The news of switches made here since the last call, oldest first (at most max): how many. */
int sf_qp_news(sf_qp *qp, struct sf_news *out, int max);
void sf_qp_free(sf_qp *qp);
int sf_qp_mode(const sf_qp *qp);
/* The path its fast-mode posts go on (and whose completions are its own). */
int sf_qp_path(const sf_qp *qp);
/* Sends whose inline bytes the ledger keeps here (for a replay). */
uint32_t sf_qp_inline_kept(sf_qp *qp);
enum sf_post sf_qp_post_send(sf_qp *qp, const struct sc_send_wr *wr, enum sc_post_error *err);
enum sf_post sf_qp_post_recv(sf_qp *qp, const struct sc_recv_wr *wr, enum sc_post_error *err);
/* Posts on a path's provider QP as they are (the failover layer's own posts, in either mode). */
enum sc_post_error sf_qp_post_raw_send(sf_qp *qp, int path, const struct sc_send_wr *wrs, int n, int *posted);
enum sc_post_error sf_qp_post_raw_recv(sf_qp *qp, int path, const struct sc_recv_wr *wrs, int n, int *posted);

/* Hand-over. Export: the ledger's entries, send queue first, each in posting order (valid until the next
 * call on this QP), and the counters; the QP is Python's from then on: 0. Or 1, nothing exported, while
 * the QP has news not yet read (a switch made here since the failover layer last looked: it reads them
 * first, so that the ledger comes in the states it is in). */
struct sf_ledger_view {
    const struct sf_entry *sq, *rq; /* each a copy, in order */
    uint32_t sq_count, rq_count;
    uint64_t next_id;
    int64_t sent_two_sided, received;
};
int sf_qp_export(sf_qp *qp, struct sf_ledger_view *out);
/* Import, entry by entry in posting order, then sf_qp_import_done with the counters and the path in use
 * (where the entries not done are posted): fast from then on.
 * 0, or -1 when an entry does not fit (more SGEs or inline bytes than the caps): the QP stays Python's. */
int sf_qp_import(sf_qp *qp, const struct sf_entry *entry);
void sf_qp_import_done(sf_qp *qp, int path, uint64_t next_id, int64_t sent_two_sided, int64_t received);
/* Forget what sf_qp_import took (the import failed half-way). */
void sf_qp_import_abort(sf_qp *qp);

#endif
