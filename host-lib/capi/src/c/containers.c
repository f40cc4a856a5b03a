/*
 * The C part of libnicbar: GM 2's calls that C defines best. gm_printf and gm_eprintf are
 * variadic, which the Rust part cannot define; GM's containers (hash tables, lookaside lists,
 * zones, mark sets) hand out raw memory by C's rules. None of them talks to the NIC.
 */
#include <nicbar/gm.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- printing ---------------------------------------------------------------------------- */

int gm_printf(const char *format, ...)
{
    va_list args;
    int written;
    va_start(args, format);
    written = vprintf(format, args);
    va_end(args);
    return written;
}

int gm_eprintf(const char *format, ...)
{
    va_list args;
    int written;
    va_start(args, format);
    written = vfprintf(stderr, format, args);
    va_end(args);
    return written;
}

/* ---- hash tables ------------------------------------------------------------------------- */

/* One entry: its key and datum (copies when the table's lengths are not 0, else the pointers
 * given). */
struct gm_hash_entry {
    struct gm_hash_entry *next;
    void *key;
    void *datum;
};

struct gm_hash {
    long (*compare)(void *, void *);
    unsigned long (*hash)(void *);
    gm_size_t key_len, data_len;
    struct gm_hash_entry **buckets;
    unsigned long bucket_count, count;
    /* The datum gm_hash_remove returned last, when data are copies (valid until the next). */
    void *removed;
};

long gm_hash_compare_strings(void *a, void *b) { return strcmp((const char *)a, (const char *)b); }
unsigned long gm_hash_hash_string(void *key)
{
    unsigned long h = 5381;
    for (const unsigned char *c = key; *c; c++)
        h = h * 33u + *c;
    return h;
}
long gm_hash_compare_longs(void *a, void *b) { return *(long *)a != *(long *)b; }
unsigned long gm_hash_hash_long(void *key) { return (unsigned long)*(long *)key * 2654435761u; }
long gm_hash_compare_ints(void *a, void *b) { return *(int *)a != *(int *)b; }
unsigned long gm_hash_hash_int(void *key) { return (unsigned long)(unsigned)*(int *)key * 2654435761u; }
long gm_hash_compare_ptrs(void *a, void *b) { return a != b; }
unsigned long gm_hash_hash_ptr(void *key) { return ((unsigned long)key >> 3) * 2654435761u; }

/* With key_len set and no compare or hash function, keys are compared and hashed as bytes. */
static long compare_bytes(struct gm_hash *h, void *a, void *b)
{
    if (h->compare != NULL)
        return h->compare(a, b);
    if (h->key_len != 0)
        return memcmp(a, b, h->key_len);
    return a != b;
}

static unsigned long hash_key(struct gm_hash *h, void *key)
{
    if (h->hash != NULL)
        return h->hash(key);
    if (h->key_len != 0) {
        unsigned long v = 14695981039346656037ul;
        for (gm_size_t i = 0; i < h->key_len; i++)
            v = (v ^ ((unsigned char *)key)[i]) * 1099511628211ul;
        return v;
    }
    return gm_hash_hash_ptr(key);
}

struct gm_hash *gm_create_hash(long (*compare)(void *, void *), unsigned long (*hash)(void *),
                               gm_size_t key_len, gm_size_t data_len, gm_size_t min_entries,
                               int flags)
{
    struct gm_hash *h = calloc(1, sizeof *h);
    (void)flags;
    if (h == NULL)
        return NULL;
    h->compare = compare;
    h->hash = hash;
    h->key_len = key_len;
    h->data_len = data_len;
    h->bucket_count = 16;
    while (h->bucket_count < min_entries)
        h->bucket_count *= 2;
    h->buckets = calloc(h->bucket_count, sizeof *h->buckets);
    if (h->buckets == NULL) {
        free(h);
        return NULL;
    }
    return h;
}

static void free_entry(struct gm_hash *h, struct gm_hash_entry *e)
{
    if (h->key_len != 0)
        free(e->key);
    if (h->data_len != 0)
        free(e->datum);
    free(e);
}

void gm_destroy_hash(struct gm_hash *h)
{
    if (h == NULL)
        return;
    for (unsigned long b = 0; b < h->bucket_count; b++)
        for (struct gm_hash_entry *e = h->buckets[b], *next; e != NULL; e = next) {
            next = e->next;
            free_entry(h, e);
        }
    free(h->removed);
    free(h->buckets);
    free(h);
}

static struct gm_hash_entry **slot_of(struct gm_hash *h, void *key)
{
    struct gm_hash_entry **at = &h->buckets[hash_key(h, key) & (h->bucket_count - 1)];
    while (*at != NULL && compare_bytes(h, (*at)->key, key) != 0)
        at = &(*at)->next;
    return at;
}

void *gm_hash_find(struct gm_hash *h, void *key)
{
    struct gm_hash_entry *e;
    if (h == NULL)
        return NULL;
    e = *slot_of(h, key);
    return e == NULL ? NULL : e->datum;
}

static void grow(struct gm_hash *h)
{
    unsigned long count = h->bucket_count * 2;
    struct gm_hash_entry **buckets = calloc(count, sizeof *buckets);
    if (buckets == NULL)
        return; /* a fuller table still works */
    for (unsigned long b = 0; b < h->bucket_count; b++)
        for (struct gm_hash_entry *e = h->buckets[b], *next; e != NULL; e = next) {
            unsigned long to = hash_key(h, e->key) & (count - 1);
            next = e->next;
            e->next = buckets[to];
            buckets[to] = e;
        }
    free(h->buckets);
    h->buckets = buckets;
    h->bucket_count = count;
}

gm_status_t gm_hash_insert(struct gm_hash *h, void *key, void *datum)
{
    struct gm_hash_entry *e;
    if (h == NULL)
        return GM_INVALID_PARAMETER;
    if (*slot_of(h, key) != NULL)
        return GM_FAILURE; /* GM: a key is in a table once */
    e = calloc(1, sizeof *e);
    if (e == NULL)
        return GM_OUT_OF_MEMORY;
    e->key = key;
    e->datum = datum;
    if (h->key_len != 0 && (e->key = malloc(h->key_len)) != NULL)
        memcpy(e->key, key, h->key_len);
    if (h->data_len != 0 && (e->datum = malloc(h->data_len)) != NULL)
        memcpy(e->datum, datum, h->data_len);
    if (e->key == NULL || e->datum == NULL) {
        if (h->key_len != 0)
            free(e->key);
        if (h->data_len != 0)
            free(e->datum);
        free(e);
        return GM_OUT_OF_MEMORY;
    }
    if (h->count + 1 > h->bucket_count)
        grow(h);
    {
        struct gm_hash_entry **at = &h->buckets[hash_key(h, e->key) & (h->bucket_count - 1)];
        e->next = *at;
        *at = e;
    }
    h->count++;
    return GM_SUCCESS;
}

void *gm_hash_remove(struct gm_hash *h, void *key)
{
    struct gm_hash_entry **at, *e;
    void *datum;
    if (h == NULL)
        return NULL;
    at = slot_of(h, key);
    if ((e = *at) == NULL)
        return NULL;
    *at = e->next;
    h->count--;
    datum = e->datum;
    if (h->data_len != 0) {
        /* The copy lives until the next remove from this table. */
        free(h->removed);
        h->removed = datum;
        e->datum = NULL;
    }
    if (h->key_len != 0)
        free(e->key);
    free(e);
    return datum;
}

void gm_hash_rekey(struct gm_hash *h, void *old_key, void *new_key)
{
    struct gm_hash_entry **at, *e;
    if (h == NULL || (e = *(at = slot_of(h, old_key))) == NULL)
        return;
    *at = e->next;
    if (h->key_len != 0)
        memcpy(e->key, new_key, h->key_len);
    else
        e->key = new_key;
    at = &h->buckets[hash_key(h, e->key) & (h->bucket_count - 1)];
    e->next = *at;
    *at = e;
}

/* ---- lookaside lists ---------------------------------------------------------------------- */

/* Each entry is preceded by a header naming its list, so gm_lookaside_free needs only the
 * entry; the header is as aligned as malloc's memory. */
union gm_lookaside_header {
    struct gm_lookaside *list;
    union gm_lookaside_header *next_free;
    long double align;
};

struct gm_lookaside {
    gm_size_t entry_len;
    union gm_lookaside_header *free;
};

struct gm_lookaside *gm_create_lookaside(gm_size_t entry_len, gm_size_t min_entry_cnt)
{
    struct gm_lookaside *l = calloc(1, sizeof *l);
    if (l == NULL)
        return NULL;
    l->entry_len = entry_len;
    for (gm_size_t i = 0; i < min_entry_cnt; i++) {
        union gm_lookaside_header *h = malloc(sizeof *h + entry_len);
        if (h == NULL)
            break;
        h->next_free = l->free;
        l->free = h;
    }
    return l;
}

void gm_destroy_lookaside(struct gm_lookaside *l)
{
    if (l == NULL)
        return;
    while (l->free != NULL) {
        union gm_lookaside_header *h = l->free;
        l->free = h->next_free;
        free(h);
    }
    free(l);
}

void *gm_lookaside_alloc(struct gm_lookaside *l)
{
    union gm_lookaside_header *h;
    if (l == NULL)
        return NULL;
    if ((h = l->free) != NULL)
        l->free = h->next_free;
    else if ((h = malloc(sizeof *h + l->entry_len)) == NULL)
        return NULL;
    h->list = l;
    return h + 1;
}

void *gm_lookaside_zalloc(struct gm_lookaside *l)
{
    void *entry = gm_lookaside_alloc(l);
    if (entry != NULL)
        memset(entry, 0, l->entry_len);
    return entry;
}

void gm_lookaside_free(void *entry)
{
    union gm_lookaside_header *h;
    struct gm_lookaside *l;
    if (entry == NULL)
        return;
    h = (union gm_lookaside_header *)entry - 1;
    l = h->list;
    h->next_free = l->free;
    l->free = h;
}

/* ---- zones: an allocator over memory the program gives ------------------------------------ */

#define ZONE_ALIGN 16

/* A block of the zone: its length (header included) and whether it is free; blocks tile the
 * zone from its (aligned) base. */
struct zone_block {
    gm_size_t len;
    gm_size_t free;
};

struct gm_zone {
    char *base;
    gm_size_t len;
};

struct gm_zone *gm_zone_create_zone(void *base, gm_size_t length)
{
    struct gm_zone *z;
    gm_size_t skip = (ZONE_ALIGN - (gm_size_t)(uintptr_t)base % ZONE_ALIGN) % ZONE_ALIGN;
    if (base == NULL || length < skip + 2 * ZONE_ALIGN || (z = malloc(sizeof *z)) == NULL)
        return NULL;
    z->base = (char *)base + skip;
    z->len = (length - skip) / ZONE_ALIGN * ZONE_ALIGN;
    ((struct zone_block *)z->base)->len = z->len;
    ((struct zone_block *)z->base)->free = 1;
    return z;
}

void gm_zone_destroy_zone(struct gm_zone *z) { free(z); }

void *gm_zone_malloc(struct gm_zone *z, gm_size_t length)
{
    gm_size_t need;
    if (z == NULL)
        return NULL;
    need = (length + ZONE_ALIGN - 1) / ZONE_ALIGN * ZONE_ALIGN + ZONE_ALIGN;
    for (gm_size_t at = 0; at < z->len;) {
        struct zone_block *b = (struct zone_block *)(z->base + at);
        if (b->free) {
            /* Merge the free blocks that follow. */
            while (at + b->len < z->len && ((struct zone_block *)(z->base + at + b->len))->free)
                b->len += ((struct zone_block *)(z->base + at + b->len))->len;
            if (b->len >= need) {
                if (b->len - need >= 2 * ZONE_ALIGN) {
                    struct zone_block *rest = (struct zone_block *)(z->base + at + need);
                    rest->len = b->len - need;
                    rest->free = 1;
                    b->len = need;
                }
                b->free = 0;
                return (char *)b + ZONE_ALIGN;
            }
        }
        at += b->len;
    }
    return NULL;
}

void *gm_zone_calloc(struct gm_zone *z, gm_size_t count, gm_size_t length)
{
    void *p;
    if (length != 0 && count > (gm_size_t)-1 / length)
        return NULL;
    if ((p = gm_zone_malloc(z, count * length)) != NULL)
        memset(p, 0, count * length);
    return p;
}

int gm_zone_addr_in_zone(struct gm_zone *z, void *p)
{
    return z != NULL && (char *)p >= z->base && (char *)p < z->base + z->len;
}

/* Frees `p` from the zone: 1 if it was an allocated block of it, 0 if not (left alone). */
int gm_zone_free(struct gm_zone *z, void *p)
{
    if (!gm_zone_addr_in_zone(z, p))
        return 0;
    for (gm_size_t at = 0; at < z->len;) {
        struct zone_block *b = (struct zone_block *)(z->base + at);
        if ((char *)b + ZONE_ALIGN == (char *)p) {
            if (b->free)
                return 0;
            b->free = 1;
            return 1;
        }
        at += b->len;
    }
    return 0;
}

/* ---- mark sets ---------------------------------------------------------------------------- */

/* A mark is a slot of its set and the slot's generation when it was marked; unmarking bumps
 * the generation, so every older mark of the slot is invalid at once. */
struct gm_mark_set {
    unsigned long *generation;
    unsigned long *next_free; /* free slots, as a stack */
    unsigned long slots, free_count;
};

#define MARK_SLOT(m) ((unsigned long)((m) >> 32))
#define MARK_GENERATION(m) ((unsigned long)((m) & 0xffffffffu))

gm_status_t gm_create_mark_set(struct gm_mark_set **set, unsigned long init_cnt)
{
    struct gm_mark_set *s;
    if (set == NULL)
        return GM_INVALID_PARAMETER;
    if ((s = calloc(1, sizeof *s)) == NULL)
        return GM_OUT_OF_MEMORY;
    *set = s;
    (void)init_cnt;
    return GM_SUCCESS;
}

void gm_destroy_mark_set(struct gm_mark_set *s)
{
    if (s == NULL)
        return;
    free(s->generation);
    free(s->next_free);
    free(s);
}

gm_status_t gm_mark(struct gm_mark_set *s, gm_mark_t *mark)
{
    unsigned long slot;
    if (s == NULL || mark == NULL)
        return GM_INVALID_PARAMETER;
    if (s->free_count == 0) {
        unsigned long grown = s->slots == 0 ? 16 : s->slots * 2;
        unsigned long *g = realloc(s->generation, grown * sizeof *g);
        unsigned long *f;
        if (g == NULL)
            return GM_OUT_OF_MEMORY;
        s->generation = g;
        f = realloc(s->next_free, grown * sizeof *f);
        if (f == NULL)
            return GM_OUT_OF_MEMORY;
        s->next_free = f;
        for (unsigned long i = grown; i-- > s->slots;) {
            g[i] = 1;
            f[s->free_count++] = i;
        }
        s->slots = grown;
    }
    slot = s->next_free[--s->free_count];
    *mark = ((gm_mark_t)slot << 32) | s->generation[slot];
    return GM_SUCCESS;
}

int gm_mark_is_valid(struct gm_mark_set *s, gm_mark_t *mark)
{
    if (s == NULL || mark == NULL || MARK_SLOT(*mark) >= s->slots)
        return 0;
    return MARK_GENERATION(*mark) == s->generation[MARK_SLOT(*mark)];
}

void gm_unmark(struct gm_mark_set *s, gm_mark_t *mark)
{
    unsigned long slot;
    if (!gm_mark_is_valid(s, mark))
        return;
    slot = MARK_SLOT(*mark);
    s->generation[slot] = (s->generation[slot] + 1) & 0xffffffffu;
    if (s->generation[slot] == 0)
        s->generation[slot] = 1;
    s->next_free[s->free_count++] = slot;
}

void gm_unmark_all(struct gm_mark_set *s)
{
    if (s == NULL)
        return;
    s->free_count = 0;
    for (unsigned long i = s->slots; i-- > 0;) {
        s->generation[i] = (s->generation[i] + 1) & 0xffffffffu;
        if (s->generation[i] == 0)
            s->generation[i] = 1;
        s->next_free[s->free_count++] = i;
    }
}
