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

int main(int argc, char **argv) {
    CHECK(ARMCI_Init());
    me = armci_msg_me();
    nproc = armci_msg_nproc();
    if (argc > 1 && strcmp(argv[1], "error") == 0) {
        ARMCI_Error("armci_api: an error on purpose", 42);
    }
    put_flag();
    printf("armci_api: rank %d ok\n", me);
    fflush(stdout);
    ARMCI_Finalize();
    return 0;
}
