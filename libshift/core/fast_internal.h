/* The fast path's internals (fastpath.h), shared by its files. */
#ifndef SHIFT_CORE_FAST_INTERNAL_H
#define SHIFT_CORE_FAST_INTERNAL_H

#include <pthread.h>

#include "fastpath.h"

#define SF_SEEN_RKEYS 16 /* rkeys a QP remembers having used (their backups have been asked for) */

struct sf_key_slot {
    uint32_t key, value;
    uint8_t state;
};

struct sf_keymap { /* fast_keys.c */
    struct sf_key_slot *slots;
    uint32_t cap, taken; /* taken: slots in use or left as tombstones */
};

int sf_keymap_set(struct sf_keymap *m, uint32_t key, uint32_t value);
int sf_keymap_get(const struct sf_keymap *m, uint32_t key, uint32_t *value);
void sf_keymap_del(struct sf_keymap *m, uint32_t key);
void sf_keymap_fini(struct sf_keymap *m);

struct sf_queue {
    struct sf_entry *ring, *scratch;
    uint32_t cap, head, count, max_sge, max_inline;
    struct sc_sge *sges;  /* max_sge per ring slot */
    uint8_t *inline_room; /* max_inline bytes per ring slot */
};

struct sf_cq {
    sf_ctx *ctx;
    void *on[SF_PATHS]; /* the provider CQ of each path */
    struct sc_wc *ready; /* released to the application, not yet polled: a ring of cqe */
    uint32_t cqe, head, count;
    int overflowed, armed;
    uint64_t cookie;
    sf_chan *chan; /* where its events go (NULL: none) */
};

/* Where a fast-mode QP is in a switch (fast_switch.c). */
enum sf_phase {
    SF_STEADY = 0,    /* posting on its path */
    SF_STOPPING = 1,  /* its path stopped and drained (inside one call): what completes there still counts */
    SF_HANDSHAKE = 2, /* on the new path, our count sent: sends held until the peer's count comes */
};

#define SF_WANT_LEAVE 1u /* the path's link was seen down */
#define SF_WANT_COUNT 2u /* a peer's count came (`counted`) */

struct sf_qp {
    sf_ctx *ctx;
    sf_cq *send_cq, *recv_cq;
    void *on[SF_PATHS];
    uint32_t qpn[SF_PATHS];
    int mode, sig_all;
    int path;                          /* the path fast-mode posts go on, and whose completions are ours */
    struct sf_keymap rkeys[SF_PATHS];  /* the peer's default rkeys -> its rkeys on each backup path */
    struct sc_sge *translated;         /* max_sge SGEs: a post's, with the path's lkeys */
    struct sf_queue sq, rq;
    uint64_t next_id;
    int64_t sent_two_sided, received;
    uint32_t seen_rkeys[SF_SEEN_RKEYS];
    uint32_t seen, seen_next;
    /* the switch (fast_switch.c) */
    int phase;
    uint32_t armed;                 /* a bit per path: where a switch may go */
    uint64_t target_addr[SF_PATHS]; /* the peer's control MR on each path */
    uint32_t target_rkey[SF_PATHS];
    uint32_t counted;               /* a bit per path: the peer's count came there, not yet acted on */
    uint32_t peer_count[SF_PATHS];
    int64_t counted_at[SF_PATHS];   /* when it came */
    uint32_t wants;                 /* SF_WANT_*: why it is on the context's work list */
    sf_qp *next_work;
    int queued;
    struct sf_news news[SF_NEWS_MAX];
    uint32_t news_count;
};

struct sf_qp_slot {
    uint32_t key; /* path << 24 | qpn; 0: never used */
    sf_qp *qp;    /* NULL with a key: removed */
};

struct sf_ctx {
    pthread_mutex_t lock; /* recursive: see fastpath.h */
    const struct sc_dp *dp;
    int paths;
    void *control[SF_PATHS];
    struct sf_keymap lkeys[SF_PATHS]; /* the default path's lkeys -> their twins' on each backup path */
    sf_cq **cqs;
    uint32_t ncqs, cqs_cap;
    struct sf_qp_slot *table; /* open addressing, linear probing */
    uint32_t table_cap, table_used;
    struct sf_deferred *deferred; /* a ring */
    uint32_t deferred_cap, deferred_head, deferred_count;
    int64_t backup_hot;
    int64_t looking_until; /* sf_ctx_heat_backups: passes look at the backup paths until then */
    uint32_t links_down;  /* a bit per path, raised by any thread (atomically): its link was seen down */
    uint32_t links_acted; /* the bits of links_down a pass has acted on */
    int news;             /* a QP has news since sf_ctx_take_news */
    sf_qp *work, *work_tail; /* QPs with a switch or a resume to make, in the order they asked */
    /* the channels' waits (fast_chan.c) */
    sf_chan *chans;
    sf_chan *leader;      /* the channel whose waiter leads now (NULL: none) */
    void *leading_on;     /* the provider channel it waits on, while it waits there (NULL: it does not) */
    int64_t led_ns;       /* when the last leader left */
    int watching;         /* the default path's watcher is on the provider channel */
};

int sf_queue_init(struct sf_queue *q, uint32_t cap, uint32_t max_sge, uint32_t max_inline);
void sf_queue_fini(struct sf_queue *q);
struct sf_entry *sf_queue_at(struct sf_queue *q, uint32_t i);
struct sf_entry *sf_queue_reserve(struct sf_queue *q);
int sf_entry_fill(struct sf_queue *q, struct sf_entry *e, const struct sc_send_wr *wr);
struct sf_entry *sf_queue_find(struct sf_queue *q, uint64_t id);
struct sf_entry *sf_queue_pop_done(struct sf_queue *q);
uint32_t sf_queue_export(struct sf_queue *q);
int sf_queue_import(struct sf_queue *q, const struct sf_entry *from);

/* fast_ctx.c */
sf_qp *sf_ctx_lookup(sf_ctx *ctx, int path, uint32_t qpn);
int sf_ctx_register(sf_ctx *ctx, int path, uint32_t qpn, sf_qp *qp);
void sf_ctx_unregister(sf_ctx *ctx, int path, uint32_t qpn);
int sf_ctx_defer(sf_ctx *ctx, const struct sf_deferred *item);
int sf_ctx_add_cq(sf_ctx *ctx, sf_cq *cq);
void sf_ctx_remove_cq(sf_ctx *ctx, sf_cq *cq);

int sf_ctx_drain_cq(sf_ctx *ctx, void *provider_cq, int path);
int64_t sf_now_ns(void);

/* fast_qp.c */
void sf_qp_complete(sf_qp *qp, int path, const struct sc_wc *wc);
void sf_qp_release(sf_qp *qp);
void sf_qp_to_python(sf_qp *qp, int path, const struct sc_wc *wc);
const struct sc_sge *sf_qp_on_path(sf_qp *qp, const struct sc_sge *sg, uint32_t n, struct sc_sge *room);
int sf_two_sided(uint32_t opcode);
int sf_remote_keyed(uint32_t opcode);

/* fast_switch.c */
/* A control WR's completion (wr_id >= SF_CONTROL_IDS) of a fast-mode QP: 1 when taken here, else 0 (it is
 * the failover layer's). */
int sf_switch_control(sf_qp *qp, int path, const struct sc_wc *wc);
/* Queue the QP on its context's work list for `why` (SF_WANT_*). */
void sf_switch_want(sf_qp *qp, uint32_t why);
/* Make the switches and resumes the work list asks for (each may queue more), and act on links seen down. */
void sf_switch_work(sf_ctx *ctx);
/* Take the QP off the work list (it is freed). */
void sf_switch_forget(sf_qp *qp);
/* The peer's counts not acted on, handed to the failover layer (the ledger goes to it). */
void sf_switch_export(sf_qp *qp);

#endif
