/* The ledger of a fast-mode shift QP: each queue a ring of entries in posting order, with room per entry
 * for its SGEs and its inline bytes, so that a post allocates nothing. */
#include <stdlib.h>
#include <string.h>

#include "fast_internal.h"

int sf_queue_init(struct sf_queue *q, uint32_t cap, uint32_t max_sge, uint32_t max_inline) {
    memset(q, 0, sizeof *q);
    q->cap = cap ? cap : 1;
    q->max_sge = max_sge ? max_sge : 1;
    q->max_inline = max_inline;
    q->ring = calloc(q->cap, sizeof *q->ring);
    q->sges = calloc((size_t)q->cap * q->max_sge, sizeof *q->sges);
    q->scratch = calloc(q->cap, sizeof *q->scratch);
    q->inline_room = max_inline ? calloc(q->cap, max_inline) : NULL;
    if (!q->ring || !q->sges || !q->scratch || (max_inline && !q->inline_room)) {
        sf_queue_fini(q);
        return -1;
    }
    return 0;
}

void sf_queue_fini(struct sf_queue *q) {
    free(q->ring);
    free(q->sges);
    free(q->scratch);
    free(q->inline_room);
    memset(q, 0, sizeof *q);
}

struct sf_entry *sf_queue_at(struct sf_queue *q, uint32_t i) { return &q->ring[(q->head + i) % q->cap]; }

/* The next free entry, its SGE and inline room attached; NULL when the queue is full. */
struct sf_entry *sf_queue_reserve(struct sf_queue *q) {
    if (q->count >= q->cap)
        return NULL;
    uint32_t slot = (q->head + q->count) % q->cap;
    struct sf_entry *e = &q->ring[slot];
    memset(e, 0, sizeof *e);
    e->wr.sg = &q->sges[(size_t)slot * q->max_sge];
    e->inline_copy = q->inline_room ? &q->inline_room[(size_t)slot * q->max_inline] : NULL;
    e->index = -1;
    return e;
}

/* Fill a reserved entry from a WR: its fields and a copy of its SGEs (0), or -1 when they do not fit. */
int sf_entry_fill(struct sf_queue *q, struct sf_entry *e, const struct sc_send_wr *wr) {
    if (wr->num_sge > q->max_sge)
        return -1;
    struct sc_sge *own = (struct sc_sge *)e->wr.sg;
    e->wr = *wr;
    if (wr->num_sge)
        memcpy(own, wr->sg, wr->num_sge * sizeof *own);
    e->wr.sg = own;
    return 0;
}

/* The entry whose id is `id`: completions come in order, so it is almost always the first not done. */
struct sf_entry *sf_queue_find(struct sf_queue *q, uint64_t id) {
    for (uint32_t i = 0; i < q->count; i++) {
        struct sf_entry *e = sf_queue_at(q, i);
        if (e->id == id)
            return e;
    }
    return NULL;
}

struct sf_entry *sf_queue_pop_done(struct sf_queue *q) {
    if (!q->count)
        return NULL;
    struct sf_entry *e = &q->ring[q->head];
    if (!e->done)
        return NULL;
    q->head = (q->head + 1) % q->cap;
    q->count--;
    return e;
}

/* A copy of the entries in order (in q->scratch), the queue emptied. The copies' SGEs and inline bytes
 * stay where they were until the queue takes entries again. */
uint32_t sf_queue_export(struct sf_queue *q) {
    uint32_t n = q->count;
    for (uint32_t i = 0; i < n; i++)
        q->scratch[i] = *sf_queue_at(q, i);
    q->head = q->count = 0;
    return n;
}

int sf_queue_import(struct sf_queue *q, const struct sf_entry *from) {
    if (from->wr.num_sge > q->max_sge || from->inline_len > q->max_inline)
        return -1;
    struct sf_entry *e = sf_queue_reserve(q);
    if (!e)
        return -1;
    struct sc_sge *own = (struct sc_sge *)e->wr.sg;
    uint8_t *room = e->inline_copy;
    *e = *from;
    if (from->wr.num_sge)
        memcpy(own, from->wr.sg, from->wr.num_sge * sizeof *own);
    e->wr.sg = own;
    if (from->inline_len)
        memcpy(room, from->inline_copy, from->inline_len);
    e->inline_copy = room;
    q->count++;
    return 0;
}
