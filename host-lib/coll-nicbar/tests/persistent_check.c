/*
 * Persistent collectives (MPIX_Barrier_init, MPIX_Allreduce_init, MPIX_Reduce_init of Open MPI's
 * pcollreq extension) checked as a program uses them: each request made once, started ROUNDS
 * times with new inputs written into its buffers between starts, completed with MPI_Wait or
 * MPI_Test, then freed. Every result against a reference every rank computes itself, folding
 * every rank's input in rank order with MPI_Reduce_local (Open MPI's own operation code), for
 * several operations and types, in place and not, and one too long for the NIC (the component
 * below serves it). Then MPI_Startall of a persistent barrier and a persistent allreduce on two
 * communicators of the same members, the even ranks listing them in one order and the odd ranks
 * in the other (MPI orders collectives per communicator only).
 *
 * usage: persistent_check [ROUNDS]   each reduction started ROUNDS times, the barrier and the
 *                                    MPI_Startall 4 * ROUNDS times; prints
 *                                    "persistent_check: ok N checks" on rank 0
 */
#include <mpi.h>
#include <mpi-ext.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MOST 64 /* bytes of the longest vector: past the NIC's 32 */

typedef struct {
    MPI_Datatype type;
    const char *name;
    int size;
} type_t;

typedef struct {
    MPI_Op op;
    const char *name;
} op_t;

static int failures, checks;

static void check(int ok, const char *what, const type_t *type, const op_t *op, int count,
                  int round)
{
    checks++;
    if (!ok) {
        int rank;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        if (failures++ < 20) {
            printf("persistent_check: rank %d: start %d of %s of %d %s with %s differs from "
                   "the reference\n",
                   rank, round, what, count, type->name, op->name);
        }
    }
}

/*
 * Rank `rank`'s input at start `round`: small values every operation keeps exact in every type
 * (a product of at most a few twos, truth values for the logical operations), different at each
 * start so that a start that reads an old input is seen.
 */
static void input(const type_t *type, MPI_Op op, int rank, int round, int count, void *buffer)
{
    for (int i = 0; i < count; i++) {
        long value;
        if (MPI_PROD == op) {
            value = (rank + i + round) % 4 == 0 ? 2 : 1;
        } else if (MPI_LOR == op || MPI_LAND == op) {
            value = (rank + 2 * i + round) % 3 != 0;
        } else if (MPI_BXOR == op) {
            value = (rank * 37 + i * 11 + round * 5) & 0x7f;
        } else {
            value = (rank * 7 + i * 5 + round * 3) % 13 - 6;
        }
        char *at = (char *) buffer + (size_t) i * (size_t) type->size;
        if (MPI_DOUBLE == type->type) {
            double v = (double) value;
            memcpy(at, &v, sizeof v);
        } else if (MPI_FLOAT == type->type) {
            float v = (float) value;
            memcpy(at, &v, sizeof v);
        } else if (MPI_INT == type->type) {
            int v = (int) value;
            memcpy(at, &v, sizeof v);
        } else if (MPI_LONG_LONG_INT == type->type) {
            long long v = value;
            memcpy(at, &v, sizeof v);
        } else { /* MPI_SHORT */
            short v = (short) value;
            memcpy(at, &v, sizeof v);
        }
    }
}

/* What every rank's input at start `round` reduces to, folded in rank order. */
static void reference(const type_t *type, const op_t *op, int size, int round, int count,
                      void *expected)
{
    unsigned char theirs[MOST], folded[MOST];
    size_t bytes = (size_t) count * (size_t) type->size;
    input(type, op->op, 0, round, count, expected);
    for (int other = 1; other < size; other++) {
        input(type, op->op, other, round, count, theirs);
        memcpy(folded, expected, bytes);
        memcpy(expected, theirs, bytes);
        MPI_Reduce_local(folded, expected, count, type->type, op->op);
    }
}

/* Persistent allreduce (in place or not) and reduce of `count` elements, started `rounds` times. */
static void run(MPI_Comm comm, const type_t *type, const op_t *op, int count, int rounds)
{
    int rank, size, flag;
    unsigned char mine[MOST], got[MOST], in_place[MOST], reduced[MOST], expected[MOST];
    size_t bytes = (size_t) count * (size_t) type->size;
    MPI_Request allreduce, allreduce_in_place, reduce;

    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    int root = (count + rounds) % size;
    MPIX_Allreduce_init(mine, got, count, type->type, op->op, comm, MPI_INFO_NULL, &allreduce);
    MPIX_Allreduce_init(MPI_IN_PLACE, in_place, count, type->type, op->op, comm, MPI_INFO_NULL,
                        &allreduce_in_place);
    MPIX_Reduce_init(mine, rank == root ? reduced : NULL, count, type->type, op->op, root, comm,
                     MPI_INFO_NULL, &reduce);
    for (int round = 0; round < rounds; round++) {
        input(type, op->op, rank, round, count, mine);
        memcpy(in_place, mine, bytes);
        memset(got, 0xa5, sizeof got);
        memset(reduced, 0xa5, sizeof reduced);
        reference(type, op, size, round, count, expected);

        MPI_Start(&allreduce);
        /* Completed by MPI_Test on even starts, by MPI_Wait on odd ones. */
        if (0 == round % 2) {
            do {
                MPI_Test(&allreduce, &flag, MPI_STATUS_IGNORE);
            } while (!flag);
        } else {
            MPI_Wait(&allreduce, MPI_STATUS_IGNORE);
        }
        check(0 == memcmp(got, expected, bytes), "MPIX_Allreduce_init", type, op, count, round);

        MPI_Start(&allreduce_in_place);
        MPI_Wait(&allreduce_in_place, MPI_STATUS_IGNORE);
        check(0 == memcmp(in_place, expected, bytes), "MPIX_Allreduce_init in place", type, op,
              count, round);

        MPI_Start(&reduce);
        MPI_Wait(&reduce, MPI_STATUS_IGNORE);
        if (rank == root) {
            check(0 == memcmp(reduced, expected, bytes), "MPIX_Reduce_init", type, op, count,
                  round);
        }
    }
    MPI_Request_free(&allreduce);
    MPI_Request_free(&allreduce_in_place);
    MPI_Request_free(&reduce);
    check(MPI_REQUEST_NULL == allreduce && MPI_REQUEST_NULL == reduce, "MPI_Request_free", type,
          op, count, rounds);
}

/*
 * MPI_Startall of a persistent barrier of `first` and a persistent allreduce of `second` (the
 * same members), listed in opposite orders by even and odd ranks, `rounds` times.
 */
static void startall_opposite(MPI_Comm first, MPI_Comm second, int rounds)
{
    int rank, size;
    long long mine, sum;
    MPI_Request requests[2], listed[2];
    const type_t type = {MPI_LONG_LONG_INT, "MPI_LONG_LONG_INT", (int) sizeof(long long)};
    const op_t op = {MPI_SUM, "MPI_SUM"};

    MPI_Comm_rank(first, &rank);
    MPI_Comm_size(first, &size);
    MPIX_Barrier_init(first, MPI_INFO_NULL, &requests[0]);
    MPIX_Allreduce_init(&mine, &sum, 1, MPI_LONG_LONG_INT, MPI_SUM, second, MPI_INFO_NULL,
                        &requests[1]);
    for (int round = 0; round < rounds; round++) {
        mine = (long long) rank * 1000 + round;
        sum = -1;
        listed[0] = requests[rank % 2];
        listed[1] = requests[1 - rank % 2];
        MPI_Startall(2, listed);
        MPI_Waitall(2, listed, MPI_STATUSES_IGNORE);
        long long expected = 1000LL * size * (size - 1) / 2 + (long long) size * round;
        check(sum == expected, "MPI_Startall of a barrier and an allreduce", &type, &op, 1, round);
    }
    MPI_Request_free(&requests[0]);
    MPI_Request_free(&requests[1]);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    int rank, total;
    MPI_Comm dup;
    MPI_Request barrier;
    const type_t types[] = {
        {MPI_SHORT, "MPI_SHORT", (int) sizeof(short)},
        {MPI_INT, "MPI_INT", (int) sizeof(int)},
        {MPI_LONG_LONG_INT, "MPI_LONG_LONG_INT", (int) sizeof(long long)},
        {MPI_FLOAT, "MPI_FLOAT", (int) sizeof(float)},
        {MPI_DOUBLE, "MPI_DOUBLE", (int) sizeof(double)},
    };
    const op_t ops[] = {
        {MPI_SUM, "MPI_SUM"}, {MPI_PROD, "MPI_PROD"}, {MPI_MIN, "MPI_MIN"},
        {MPI_MAX, "MPI_MAX"}, {MPI_LOR, "MPI_LOR"},   {MPI_BXOR, "MPI_BXOR"},
    };

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &total);
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);

    /* A persistent barrier: many starts, beside the blocking barrier of the same communicator. */
    MPIX_Barrier_init(MPI_COMM_WORLD, MPI_INFO_NULL, &barrier);
    for (int round = 0; round < 4 * rounds; round++) {
        MPI_Start(&barrier);
        MPI_Wait(&barrier, MPI_STATUS_IGNORE);
        if (0 == round % 3) {
            MPI_Barrier(MPI_COMM_WORLD);
        }
    }
    MPI_Request_free(&barrier);
    checks++;

    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int floating = MPI_FLOAT == types[t].type || MPI_DOUBLE == types[t].type;
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
            /* MPI's rules: no logical or bitwise operation on floating point. */
            if (floating && (MPI_LOR == ops[o].op || MPI_BXOR == ops[o].op)) {
                continue;
            }
            run(MPI_COMM_WORLD, &types[t], &ops[o], 1, rounds);
            run(dup, &types[t], &ops[o], 32 / types[t].size, rounds);
        }
        /* Past the NIC's 32 bytes: the component below's persistent form. */
        run(dup, &types[t], &ops[0], MOST / types[t].size, rounds);
    }

    startall_opposite(MPI_COMM_WORLD, dup, 4 * rounds);

    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (0 == rank) {
        if (0 == failures) {
            printf("persistent_check: ok %d checks\n", checks);
        } else {
            printf("persistent_check: %d checks failed\n", failures);
        }
    }
    MPI_Comm_free(&dup);
    MPI_Finalize();
    return 0 == failures ? 0 : 1;
}
