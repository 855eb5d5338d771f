/* A key map (uint32 -> uint32, open addressing with linear probing and tombstones): the default path's
 * lkeys -> a backup path's (one per path, the context's), the peer's default rkeys -> its backup rkeys (one
 * per path, each QP's). Small: a context has a handful of MRs, a QP talks to a handful of remote MRs. */
#include <stdlib.h>

#include "fast_internal.h"

enum { EMPTY = 0, USED = 1, GONE = 2 };

static struct sf_key_slot *find(const struct sf_keymap *m, uint32_t key, int for_insert) {
    uint32_t mask = m->cap - 1;
    struct sf_key_slot *free_slot = NULL;
    for (uint32_t i = (key * 2654435761u) & mask, n = 0; n < m->cap; i = (i + 1) & mask, n++) {
        struct sf_key_slot *s = &m->slots[i];
        if (s->state == USED && s->key == key)
            return s;
        if (s->state == GONE && !free_slot)
            free_slot = s;
        if (s->state == EMPTY)
            return for_insert ? (free_slot ? free_slot : s) : NULL;
    }
    return for_insert ? free_slot : NULL;
}

static int grow(struct sf_keymap *m) {
    struct sf_keymap bigger = {.cap = m->cap ? m->cap * 2 : 16};
    bigger.slots = calloc(bigger.cap, sizeof *bigger.slots);
    if (!bigger.slots)
        return -1;
    for (uint32_t i = 0; i < m->cap; i++)
        if (m->slots[i].state == USED) {
            *find(&bigger, m->slots[i].key, 1) = m->slots[i];
            bigger.taken++;
        }
    free(m->slots);
    *m = bigger;
    return 0;
}

int sf_keymap_set(struct sf_keymap *m, uint32_t key, uint32_t value) {
    if ((m->taken + 1) * 2 > m->cap && grow(m))
        return -1;
    struct sf_key_slot *s = find(m, key, 1);
    if (s->state == EMPTY)
        m->taken++; /* a reused tombstone was counted already */
    *s = (struct sf_key_slot){.key = key, .value = value, .state = USED};
    return 0;
}

int sf_keymap_get(const struct sf_keymap *m, uint32_t key, uint32_t *value) {
    const struct sf_key_slot *s = m->cap ? find(m, key, 0) : NULL;
    if (!s)
        return 0;
    *value = s->value;
    return 1;
}

void sf_keymap_del(struct sf_keymap *m, uint32_t key) {
    struct sf_key_slot *s = m->cap ? find(m, key, 0) : NULL;
    if (s)
        s->state = GONE;
}

void sf_keymap_fini(struct sf_keymap *m) {
    free(m->slots);
    *m = (struct sf_keymap){0};
}
