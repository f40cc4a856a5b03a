/*
 * armci_counter: every rank accumulates into, takes the mutex of, and fetches-and-adds at every
 * other rank, ROUNDS times (argv[1], default 25); then each rank checks the totals in its own
 * memory and prints "armci_counter: rank R ok". Exits non-zero at the first thing wrong.
 *
 *     nicctl emulate --units 4 &
 *     nicbar-armci-run -n 4 --units 4 ./armci_counter 25
 */
#include <armci.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                   \
    do {                                                                              \
        if ((call) != 0) {                                                            \
            fprintf(stderr, "%s failed: %s\n", #call, nicbar_armci_last_error());     \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* The layout of each rank's memory. */
struct counters {
    double sum;         /* ARMCI_Acc(ARMCI_ACC_DBL) */
    long total;         /* ARMCI_Acc(ARMCI_ACC_LNG) */
    long locked;        /* get, add, put, fence under the rank's mutex */
    long fetched;       /* ARMCI_Rmw(ARMCI_FETCH_AND_ADD_LONG) */
    int ints[2];        /* ARMCI_Rmw(ARMCI_FETCH_AND_ADD) on ints[1] */
};

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 25;
    CHECK(ARMCI_Init());
    int me = armci_msg_me();
    int nproc = armci_msg_nproc();
    void **bases = calloc((size_t)nproc, sizeof(void *));
    CHECK(ARMCI_Malloc(bases, sizeof(struct counters)));
    CHECK(ARMCI_Create_mutexes(1));
    ARMCI_Barrier();

    for (int round = 0; round < rounds; round++) {
        for (int step = 0; step < nproc; step++) {
            int target = (me + step) % nproc;
            struct counters *there = bases[target];
            double half = 0.5, one = 1.0;
            long two = 2, three = 3;
            CHECK(ARMCI_Acc(ARMCI_ACC_DBL, &half, &one, &there->sum, sizeof one, target));
            CHECK(ARMCI_Acc(ARMCI_ACC_LNG, &two, &three, &there->total, sizeof three, target));

            ARMCI_Lock(0, target);
            long value;
            CHECK(ARMCI_Get(&there->locked, &value, sizeof value, target));
            value += 1;
            CHECK(ARMCI_Put(&value, &there->locked, sizeof value, target));
            ARMCI_Fence(target);
            ARMCI_Unlock(0, target);

            long previous;
            CHECK(ARMCI_Rmw(ARMCI_FETCH_AND_ADD_LONG, &previous, &there->fetched, 10, target));
            int before;
            CHECK(ARMCI_Rmw(ARMCI_FETCH_AND_ADD, &before, &there->ints[1], -1, target));
        }
    }
    ARMCI_Barrier();

    const struct counters *mine = bases[me];
    long visits = (long)rounds * nproc;
    int ok = mine->sum == 0.5 * (double)visits && mine->total == 6 * visits &&
             mine->locked == visits && mine->fetched == 10 * visits &&
             mine->ints[1] == -visits && mine->ints[0] == 0;
    if (!ok) {
        fprintf(stderr,
                "rank %d: sum %g total %ld locked %ld fetched %ld ints %d %d, expected %ld "
                "visits\n",
                me, mine->sum, mine->total, mine->locked, mine->fetched, mine->ints[0],
                mine->ints[1], visits);
        return 1;
    }
    /* A swap hands back what was there. */
    int token = 1000 + me, old = 0;
    int right = (me + 1) % nproc;
    struct counters *next = bases[right];
    ARMCI_Barrier();
    CHECK(ARMCI_Rmw(ARMCI_SWAP, &token, &next->ints[0], 0, right));
    if (token != 0) {
        fprintf(stderr, "rank %d: the swap returned %d, not 0\n", me, token);
        return 1;
    }
    ARMCI_Barrier();
    old = mine->ints[0];
    if (old != 1000 + (me + nproc - 1) % nproc) {
        fprintf(stderr, "rank %d: the swap left %d\n", me, old);
        return 1;
    }

    CHECK(ARMCI_Destroy_mutexes());
    CHECK(ARMCI_Free(bases[me]));
    printf("armci_counter: rank %d ok\n", me);
    fflush(stdout);
    free(bases);
    ARMCI_Finalize();
    return 0;
}
