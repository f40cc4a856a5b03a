/*
 * armci_api: the calls of ARMCI beyond put, get, accumulate and the mutexes, each checked for
 * exact results on every rank, written as an ARMCI program is (ARMCI_Error on the first thing
 * wrong). Each rank prints "armci_api: rank R ok" at the end.
 *
 *     nicctl emulate --units 4 &
 *     nicbar-armci-run -n 4 --units 4 ./armci_api
 *     nicbar-armci-run -n 1 ./armci_api error     # ARMCI_Error: prints "0:armci_api: ...: 42", aborts
 */
#define _POSIX_C_SOURCE 200809L
#include <armci.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Ends the job through ARMCI_Error when cond is false, naming the line. */
#define EXPECT(cond)                                                                  \
    do {                                                                              \
        if (!(cond)) {                                                                \
            char what_[256];                                                          \
            snprintf(what_, sizeof what_, "armci_api: %s:%d: %s (last error: %s)",   \
                     __FILE__, __LINE__, #cond, nicbar_armci_last_error());           \
            ARMCI_Error(what_, 1);                                                    \
        }                                                                             \
    } while (0)

#define CHECK(call) EXPECT((call) == 0)

static int me, nproc;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The byte a rank writes at index i of a block meant for rank to. */
static unsigned char pattern(int from, int to, long i) {
    return (unsigned char)(from * 31 + to * 7 + i * 13 + 1);
}

/* ARMCI_Malloc_local, and ARMCI_Put_flag: rank r sends a block and a flag to r+1, which waits
 * (by the clock, 30 s at most) for the flag and then must see the whole block. */
static void put_flag(void) {
    enum { BLOCK = 3000 };
    struct landing {
        unsigned char block[BLOCK];
        int flag;
    };
    void **bases = calloc((size_t)nproc, sizeof(void *));
    CHECK(ARMCI_Malloc(bases, sizeof(struct landing)));
    unsigned char *source = ARMCI_Malloc_local(BLOCK);
    EXPECT(source != NULL);
    int right = (me + 1) % nproc, left = (me + nproc - 1) % nproc;
    for (long i = 0; i < BLOCK; i++) source[i] = pattern(me, right, i);
    ARMCI_Barrier();
    struct landing *there = bases[right];
    CHECK(ARMCI_Put_flag(source, there->block, BLOCK, &there->flag, 7 + me, right));
    volatile struct landing *mine = bases[me];
    double deadline = now() + 30.0;
    while (mine->flag == 0) EXPECT(now() < deadline);
    EXPECT(mine->flag == 7 + left);
    for (long i = 0; i < BLOCK; i++) EXPECT(mine->block[i] == pattern(left, me, i));
    CHECK(ARMCI_Free_local(source));
    CHECK(ARMCI_Free_local(NULL));
    ARMCI_Barrier();
    CHECK(ARMCI_Free(bases[me]));
    free(bases);
}

/* ARMCI_PutValue* and ARMCI_GetValue*: one value of each type to the right, read back. */
static void values(void) {
    struct cell {
        int i;
        float f;
        long l;
        double d;
    };
    void **bases = calloc((size_t)nproc, sizeof(void *));
    CHECK(ARMCI_Malloc(bases, sizeof(struct cell)));
    int right = (me + 1) % nproc, left = (me + nproc - 1) % nproc;
    struct cell *there = bases[right];
    ARMCI_Barrier();
    CHECK(ARMCI_PutValueInt(-7 - me, &there->i, right));
    CHECK(ARMCI_PutValueFloat(0.5f + (float)me, &there->f, right));
    CHECK(ARMCI_PutValueLong(1L << (33 + me % 8), &there->l, right));
    CHECK(ARMCI_PutValueDouble(2.25 * me, &there->d, right));
    ARMCI_Barrier();
    const struct cell *mine = bases[me];
    EXPECT(mine->i == -7 - left && mine->f == 0.5f + (float)left);
    EXPECT(mine->l == 1L << (33 + left % 8) && mine->d == 2.25 * left);
    EXPECT(ARMCI_GetValueInt(&there->i, right) == -7 - me);
    EXPECT(ARMCI_GetValueFloat(&there->f, right) == 0.5f + (float)me);
    EXPECT(ARMCI_GetValueLong(&there->l, right) == 1L << (33 + me % 8));
    EXPECT(ARMCI_GetValueDouble(&there->d, right) == 2.25 * me);
    ARMCI_Barrier();
    CHECK(ARMCI_Free(bases[me]));
    free(bases);
}

/* Waits for a handle by ARMCI_Test, by the clock (30 s at most), then ARMCI_Wait. */
static void test_then_wait(armci_hdl_t *handle) {
    double deadline = now() + 30.0;
    int state;
    while ((state = ARMCI_Test(handle)) == 1) EXPECT(now() < deadline);
    EXPECT(state == 0);
    CHECK(ARMCI_Wait(handle));
}

/* The value rank `from` puts at row i, column j of a patch. */
static double cell(int from, int i, int j) { return 1000.0 * from + 10.0 * i + j + 0.5; }

/* ARMCI_PutS, GetS and AccS on a 10 x 12 array of doubles: a 4 x 5 patch out of a 7 x 9 local
 * array (one run per row), whole rows (merged into one run), and a 2-level shape. */
static void strided(void) {
    enum { ROWS = 10, COLS = 12 };
    struct arrays {
        double put[ROWS][COLS];
        double rows[ROWS][COLS];
        double acc[ROWS][COLS];
        double cube[2][3][4];
    };
    void **bases = calloc((size_t)nproc, sizeof(void *));
    CHECK(ARMCI_Malloc(bases, sizeof(struct arrays)));
    memset(bases[me], 0, sizeof(struct arrays));
    int right = (me + 1) % nproc, left = (me + nproc - 1) % nproc;
    struct arrays *there = bases[right];
    ARMCI_Barrier();

    double local[7][9];
    for (int i = 0; i < 7; i++)
        for (int j = 0; j < 9; j++) local[i][j] = cell(me, i, j);
    int src_stride[2] = {9 * sizeof(double)}, dst_stride[2] = {COLS * sizeof(double)};
    int count[3] = {5 * sizeof(double), 4};
    CHECK(ARMCI_PutS(&local[1][2], src_stride, &there->put[3][4], dst_stride, count, 1, right));
    /* Whole rows 2..4: strides equal to the row on both sides, one run. */
    double whole[3][COLS];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < COLS; j++) whole[i][j] = cell(me, i + 2, j);
    int row_stride[1] = {COLS * sizeof(double)};
    int row_count[2] = {COLS * sizeof(double), 3};
    CHECK(ARMCI_PutS(whole, row_stride, &there->rows[2][0], row_stride, row_count, 1, right));
    /* A 2 x 2 x 3 block of the 2 x 3 x 4 cube, from a dense local one. */
    double block[2][2][3];
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 3; c++) block[a][b][c] = cell(me, a * 10 + b, c);
    int block_stride[2] = {3 * sizeof(double), 6 * sizeof(double)};
    int cube_stride[2] = {4 * sizeof(double), 12 * sizeof(double)};
    int block_count[3] = {3 * sizeof(double), 2, 2};
    CHECK(ARMCI_PutS(block, block_stride, &there->cube[0][1][1], cube_stride, block_count, 2,
                     right));
    /* Every rank adds 2 x ones into rows 5..7, columns 1..3 of everyone's acc. */
    double ones[3][3];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) ones[i][j] = 1.0;
    double two = 2.0;
    int ones_stride[1] = {3 * sizeof(double)};
    int ones_count[2] = {3 * sizeof(double), 3};
    for (int step = 0; step < nproc; step++) {
        int target = (me + step) % nproc;
        struct arrays *t = bases[target];
        CHECK(ARMCI_AccS(ARMCI_ACC_DBL, &two, ones, ones_stride, &t->acc[5][1], row_stride,
                         ones_count, 1, target));
    }
    ARMCI_Barrier();

    const struct arrays *mine = bases[me];
    for (int i = 0; i < ROWS; i++)
        for (int j = 0; j < COLS; j++) {
            int inside = i >= 3 && i < 7 && j >= 4 && j < 9;
            EXPECT(mine->put[i][j] == (inside ? cell(left, i - 2, j - 2) : 0.0));
            EXPECT(mine->rows[i][j] == (i >= 2 && i < 5 ? cell(left, i, j) : 0.0));
            int summed = i >= 5 && i < 8 && j >= 1 && j < 4;
            EXPECT(mine->acc[i][j] == (summed ? 2.0 * nproc : 0.0));
        }
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 4; c++) {
                int inside = b >= 1 && c >= 1;
                EXPECT(mine->cube[a][b][c] ==
                       (inside ? cell(left, a * 10 + b - 1, c - 1) : 0.0));
            }
    /* GetS the patch back from the right (what this rank put there) into a 4 x 6 buffer. */
    double back[4][6];
    memset(back, 0, sizeof back);
    int back_stride[1] = {6 * sizeof(double)};
    CHECK(ARMCI_GetS(&there->put[3][4], dst_stride, back, back_stride, count, 1, right));
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 6; j++) EXPECT(back[i][j] == (j < 5 ? cell(me, i + 1, j + 2) : 0.0));
    ARMCI_Barrier();
    CHECK(ARMCI_Free(bases[me]));
    free(bases);
}

/* ARMCI_PutV, GetV and AccV: two descriptors of scattered segments. */
static void vector(void) {
    enum { WORDS = 64 };
    struct words {
        long put[WORDS];
        long acc[WORDS];
    };
    void **bases = calloc((size_t)nproc, sizeof(void *));
    CHECK(ARMCI_Malloc(bases, sizeof(struct words)));
    memset(bases[me], 0, sizeof(struct words));
    int right = (me + 1) % nproc, left = (me + nproc - 1) % nproc;
    struct words *there = bases[right];
    ARMCI_Barrier();

    /* Three 2-word segments to words 1, 10, 40; two 1-word segments to words 20, 63. */
    long pairs[3][2], singles[2];
    for (int k = 0; k < 3; k++)
        for (int w = 0; w < 2; w++) pairs[k][w] = 100L * me + 10 * k + w + 1;
    singles[0] = -1 - me;
    singles[1] = -100 - me;
    void *pair_src[3] = {pairs[0], pairs[1], pairs[2]};
    void *pair_dst[3] = {&there->put[1], &there->put[10], &there->put[40]};
    void *single_src[2] = {&singles[0], &singles[1]};
    void *single_dst[2] = {&there->put[20], &there->put[63]};
    armci_giov_t darr[2] = {
        {pair_src, pair_dst, 3, 2 * sizeof(long)},
        {single_src, single_dst, 2, sizeof(long)},
    };
    CHECK(ARMCI_PutV(darr, 2, right));
    /* Every rank adds 3 x (1, 2) into words 5-6 and 30-31 of everyone's acc. */
    long addend[2] = {1, 2}, three = 3;
    for (int step = 0; step < nproc; step++) {
        int target = (me + step) % nproc;
        struct words *t = bases[target];
        void *acc_src[2] = {addend, addend};
        void *acc_dst[2] = {&t->acc[5], &t->acc[30]};
        armci_giov_t acc = {acc_src, acc_dst, 2, sizeof addend};
        CHECK(ARMCI_AccV(ARMCI_ACC_LNG, &three, &acc, 1, target));
    }
    ARMCI_Barrier();

    const struct words *mine = bases[me];
    for (int w = 0; w < WORDS; w++) {
        long expected = 0;
        if (w == 1 || w == 2) expected = 100L * left + (w - 1) + 1;
        if (w == 10 || w == 11) expected = 100L * left + 10 + (w - 10) + 1;
        if (w == 40 || w == 41) expected = 100L * left + 20 + (w - 40) + 1;
        if (w == 20) expected = -1 - left;
        if (w == 63) expected = -100 - left;
        EXPECT(mine->put[w] == expected);
        long summed = (w == 5 || w == 30) ? 3L * nproc : (w == 6 || w == 31) ? 6L * nproc : 0;
        EXPECT(mine->acc[w] == summed);
    }
    /* GetV what this rank put at the right, back into fresh buffers. */
    long got_pairs[3][2], got_singles[2];
    memset(got_pairs, 0, sizeof got_pairs);
    memset(got_singles, 0, sizeof got_singles);
    void *get_pairs[3] = {got_pairs[0], got_pairs[1], got_pairs[2]};
    void *get_singles[2] = {&got_singles[0], &got_singles[1]};
    armci_giov_t back[2] = {
        {pair_dst, get_pairs, 3, 2 * sizeof(long)},
        {single_dst, get_singles, 2, sizeof(long)},
    };
    CHECK(ARMCI_GetV(back, 2, right));
    EXPECT(memcmp(got_pairs, pairs, sizeof pairs) == 0);
    EXPECT(memcmp(got_singles, singles, sizeof singles) == 0);
    ARMCI_Barrier();
    CHECK(ARMCI_Free(bases[me]));
    free(bases);
}

/* Non-blocking: a 600 KB put and get under handles (longer than one NIC piece), ARMCI_Test
 * until done, strided put and get under one aggregate handle, gets with NULL handles waited for
 * by ARMCI_WaitProc and ARMCI_WaitAll, and an accumulate. */
static void nonblocking(void) {
    enum { BIG = 600 * 1000, SMALL = 64 };
    struct region {
        unsigned char big[BIG];
        int small[SMALL];
        long sum;
    };
    void **bases = calloc((size_t)nproc, sizeof(void *));
    CHECK(ARMCI_Malloc(bases, sizeof(struct region)));
    memset(bases[me], 0, sizeof(struct region));
    int right = (me + 1) % nproc, left = (me + nproc - 1) % nproc;
    struct region *there = bases[right];
    ARMCI_Barrier();

    unsigned char *source = ARMCI_Malloc_local(BIG);
    for (long i = 0; i < BIG; i++) source[i] = pattern(me, right, i);
    armci_hdl_t put;
    ARMCI_INIT_HANDLE(&put);
    CHECK(ARMCI_NbPut(source, there->big, BIG, right, &put));
    memset(source, 0, BIG); /* the source is free as soon as the call returns */
    test_then_wait(&put);
    EXPECT(ARMCI_Test(&put) == 0);

    /* Strided: every other int of small[0..32) and back, under one aggregate handle. */
    int evens[16], got[16];
    for (int k = 0; k < 16; k++) evens[k] = 1000 * me + k;
    memset(got, 0xff, sizeof got);
    int dense[1] = {sizeof(int)}, sparse[1] = {2 * sizeof(int)};
    int count[2] = {sizeof(int), 16};
    armci_hdl_t both;
    ARMCI_INIT_HANDLE(&both);
    ARMCI_SET_AGGREGATE_HANDLE(&both);
    CHECK(ARMCI_NbPutS(evens, dense, there->small, sparse, count, 1, right, &both));
    CHECK(ARMCI_NbGetS(there->small, sparse, got, dense, count, 1, right, &both));
    CHECK(ARMCI_Wait(&both));
    ARMCI_UNSET_AGGREGATE_HANDLE(&both);
    /* The get was posted after the put to the same rank: the NIC applies them in order. */
    EXPECT(memcmp(got, evens, sizeof got) == 0);

    long one = 1, scale = 1;
    armci_hdl_t acc;
    ARMCI_INIT_HANDLE(&acc);
    for (int step = 0; step < nproc; step++) {
        struct region *t = bases[(me + step) % nproc];
        CHECK(ARMCI_NbAcc(ARMCI_ACC_LNG, &scale, &one, &t->sum, sizeof one, (me + step) % nproc,
                          &acc));
        CHECK(ARMCI_Wait(&acc));
    }
    ARMCI_Barrier();

    const struct region *mine = bases[me];
    for (long i = 0; i < BIG; i++) EXPECT(mine->big[i] == pattern(left, me, i));
    for (int k = 0; k < 32; k++) EXPECT(mine->small[k] == (k % 2 == 0 ? 1000 * left + k / 2 : 0));
    EXPECT(mine->sum == nproc);

    /* NbGet the right's big block (what the rank after it put) under a handle; and two halves of
     * it with NULL handles, waited for by ARMCI_WaitProc and ARMCI_WaitAll. */
    armci_hdl_t get;
    ARMCI_INIT_HANDLE(&get);
    CHECK(ARMCI_NbGet(there->big, source, BIG, right, &get));
    CHECK(ARMCI_Wait(&get));
    for (long i = 0; i < BIG; i++) EXPECT(source[i] == pattern(me, right, i));
    memset(source, 0, BIG);
    CHECK(ARMCI_NbGet(there->big, source, BIG / 2, right, NULL));
    CHECK(ARMCI_WaitProc(right));
    CHECK(ARMCI_NbGet(there->big + BIG / 2, source + BIG / 2, BIG / 2, right, NULL));
    CHECK(ARMCI_WaitAll());
    for (long i = 0; i < BIG; i++) EXPECT(source[i] == pattern(me, right, i));
    CHECK(ARMCI_Free_local(source));
    ARMCI_Barrier();
    CHECK(ARMCI_Free(bases[me]));
    free(bases);
}

/* armci_msg_*: the barrier (after ARMCI_Wait of a put, which is its remote completion, the
 * target sees the bytes past a barrier without a fence), a broadcast longer than the NIC's own,
 * and the reductions of each type. */
static void messages(void) {
    enum { LEN = 5000, N = 1000 };
    void **bases = calloc((size_t)nproc, sizeof(void *));
    CHECK(ARMCI_Malloc(bases, LEN));
    int right = (me + 1) % nproc, left = (me + nproc - 1) % nproc;
    armci_msg_barrier();
    unsigned char *bytes = ARMCI_Malloc_local(LEN);
    for (long i = 0; i < LEN; i++) bytes[i] = pattern(me, right, i);
    armci_hdl_t put;
    ARMCI_INIT_HANDLE(&put);
    CHECK(ARMCI_NbPut(bytes, bases[right], LEN, right, &put));
    CHECK(ARMCI_Wait(&put));
    armci_msg_barrier();
    const unsigned char *mine = bases[me];
    for (long i = 0; i < LEN; i++) EXPECT(mine[i] == pattern(left, me, i));

    int root = nproc - 1;
    for (long i = 0; i < LEN; i++) bytes[i] = me == root ? pattern(root, 0, i) : 0;
    armci_msg_brdcst(bytes, LEN, root);
    for (long i = 0; i < LEN; i++) EXPECT(bytes[i] == pattern(root, 0, i));

    double *d = malloc(N * sizeof(double));
    for (int i = 0; i < N; i++) d[i] = 0.25 * (me + 1) + i;
    armci_msg_dgop(d, N, "+");
    for (int i = 0; i < N; i++) EXPECT(d[i] == 0.125 * nproc * (nproc + 1) + (double)i * nproc);
    int iv[3] = {me, -me, me * me};
    armci_msg_igop(iv, 3, "max");
    EXPECT(iv[0] == nproc - 1 && iv[1] == 0 && iv[2] == (nproc - 1) * (nproc - 1));
    long lv[2] = {me - 2L, 10L + me};
    armci_msg_lgop(lv, 2, "absmax");
    EXPECT(lv[0] == (nproc - 3 > 2 ? nproc - 3 : 2) && lv[1] == 10L + nproc - 1);
    float fv[1] = {2.0f};
    armci_msg_fgop(fv, 1, "*");
    EXPECT(fv[0] == (float)(1 << nproc));
    int bits[1] = {1 << me};
    armci_msg_igop(bits, 1, "or");
    EXPECT(bits[0] == (1 << nproc) - 1);
    free(d);
    CHECK(ARMCI_Free_local(bytes));
    ARMCI_Barrier();
    CHECK(ARMCI_Free(bases[me]));
    free(bases);
}

/* Process groups: the even and the odd ranks, each with its allocations, barriers, broadcasts
 * and reductions; one made the default group for ARMCI_Malloc. */
static void groups(void) {
    int evens[64], odds[64], n_even = 0, n_odd = 0;
    for (int r = 0; r < nproc; r++) {
        if (r % 2 == 0) evens[n_even++] = r;
        else odds[n_odd++] = r;
    }
    ARMCI_Group even_group, odd_group, world, def;
    ARMCI_Group_create(n_even, evens, &even_group);
    if (n_odd > 0) ARMCI_Group_create(n_odd, odds, &odd_group);
    ARMCI_Group *mine = me % 2 == 0 ? &even_group : &odd_group;
    ARMCI_Group *other = me % 2 == 0 ? &odd_group : &even_group;
    int size = me % 2 == 0 ? n_even : n_odd;
    int grank, gsize;
    CHECK(ARMCI_Group_rank(mine, &grank));
    ARMCI_Group_size(mine, &gsize);
    EXPECT(grank == me / 2 && gsize == size);
    EXPECT(ARMCI_Absolute_id(mine, grank) == me);
    if (n_odd > 0) {
        int outside;
        CHECK(ARMCI_Group_rank(other, &outside));
        EXPECT(outside == -1);
    }
    ARMCI_Group_get_world(&world);
    ARMCI_Group_get_default(&def);
    EXPECT(world == def);

    /* Within the group: put to the next member, fence, the group's barrier, check. */
    void **bases = calloc((size_t)size, sizeof(void *));
    CHECK(ARMCI_Malloc_group(bases, 64 * sizeof(long), mine));
    int next = (grank + 1) % size, prev = (grank + size - 1) % size;
    long words[64];
    for (int w = 0; w < 64; w++) words[w] = 1000L * me + w;
    int next_rank = ARMCI_Absolute_id(mine, next);
    CHECK(ARMCI_Put(words, bases[next], sizeof words, next_rank));
    ARMCI_Fence(next_rank);
    armci_msg_group_barrier(mine);
    const long *got = bases[grank];
    for (int w = 0; w < 64; w++) EXPECT(got[w] == 1000L * ARMCI_Absolute_id(mine, prev) + w);
    int ranks[2] = {grank, me};
    armci_msg_group_igop(ranks, 2, "+", mine);
    EXPECT(ranks[0] == size * (size - 1) / 2);
    int sum_of_members = 0;
    for (int g = 0; g < size; g++) sum_of_members += ARMCI_Absolute_id(mine, g);
    EXPECT(ranks[1] == sum_of_members);
    double token[40];
    for (int i = 0; i < 40; i++) token[i] = grank == size - 1 ? 3.5 * me + i : -1.0;
    armci_msg_group_bcast(token, sizeof token, size - 1, mine);
    for (int i = 0; i < 40; i++) EXPECT(token[i] == 3.5 * ARMCI_Absolute_id(mine, size - 1) + i);
    double total[1] = {1.0};
    armci_msg_group_dgop(total, 1, "+", mine);
    EXPECT(total[0] == (double)size);
    CHECK(ARMCI_Free_group(bases[grank], mine));

    /* The group as the default: ARMCI_Malloc's pointer array is by group rank. */
    ARMCI_Group_set_default(mine);
    ARMCI_Group_get_default(&def);
    EXPECT(def == *mine);
    CHECK(ARMCI_Malloc(bases, sizeof(int)));
    int mark = 77 + me;
    CHECK(ARMCI_Put(&mark, bases[next], sizeof mark, next_rank));
    ARMCI_Fence(next_rank);
    armci_msg_group_barrier(mine);
    EXPECT(*(int *)bases[grank] == 77 + ARMCI_Absolute_id(mine, prev));
    CHECK(ARMCI_Free(bases[grank]));
    ARMCI_Group_set_default(&world);
    free(bases);
    ARMCI_Group_free(&even_group);
    if (n_odd > 0) ARMCI_Group_free(&odd_group);
    ARMCI_Barrier();
}

int main(int argc, char **argv) {
    EXPECT(ARMCI_Initialized() == 0);
    CHECK(ARMCI_Init_args(&argc, &argv));
    me = armci_msg_me();
    nproc = armci_msg_nproc();
    if (argc > 1 && strcmp(argv[1], "error") == 0) {
        ARMCI_Error("armci_api: an error on purpose", 42);
    }
    EXPECT(ARMCI_Initialized() == 1);
    put_flag();
    values();
    strided();
    vector();
    nonblocking();
    messages();
    groups();
    printf("armci_api: rank %d ok\n", me);
    fflush(stdout);
    ARMCI_Finalize();
    return 0;
}
