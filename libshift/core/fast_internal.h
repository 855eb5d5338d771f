/* The fast path's internals (fastpath.h), shared by its files. */
#ifndef SHIFT_CORE_FAST_INTERNAL_H
#define SHIFT_CORE_FAST_INTERNAL_H

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
};

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
};

struct sf_qp_slot {
    uint32_t key; /* path << 24 | qpn; 0: never used */
    sf_qp *qp;    /* NULL with a key: removed */
};

struct sf_ctx {
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
    int64_t backup_next, backup_hot;
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

/* fast_qp.c */
void sf_qp_complete(sf_qp *qp, int path, const struct sc_wc *wc);

#endif
