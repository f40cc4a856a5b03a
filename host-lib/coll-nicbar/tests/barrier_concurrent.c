/*
 * Barriers and non-blocking barriers on several communicators at once: MPI_COMM_WORLD, a dup of
 * it, and two splits (halves and parities). Each round starts an MPI_Ibarrier on the dup and on
 * the parity split, runs blocking barriers on the halves and on the world meanwhile, computes,
 * and waits. A barrier is checked, not trusted: before entering it each rank posts the round
 * into a shared-memory window, and after it every member must have posted that round.
 *
 * Usage: barrier_concurrent ROUNDS. Exits 0 and prints "concurrent: N rounds ok" on rank 0.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

enum { WORLD, DUP, HALVES, PARITY, KINDS };
static const char *names[KINDS] = {"world", "dup", "halves", "parity"};

static volatile int *posted; /* posted[kind * world_size + world_rank] = last round entered */
static int world_rank, world_size;
static MPI_Win window;

static void post(int kind, int round)
{
    posted[kind * world_size + world_rank] = round;
    MPI_Win_sync(window);
}

static int check(int kind, MPI_Comm comm, int round)
{
    MPI_Group group, world_group;
    int size, failures = 0;
    MPI_Win_sync(window);
    MPI_Comm_group(comm, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Comm_size(comm, &size);
    for (int member = 0; member < size; member++) {
        int in_world;
        MPI_Group_translate_ranks(group, 1, &member, world_group, &in_world);
        int seen = posted[kind * world_size + in_world];
        if (seen < round) {
            fprintf(stderr, "rank %d: %s barrier of round %d passed, but world rank %d posted "
                            "only round %d\n", world_rank, names[kind], round, in_world, seen);
            failures++;
        }
    }
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    return failures;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 100, failures = 0;
    MPI_Comm comms[KINDS], node;
    int *base;
    MPI_Aint bytes;
    int unit;
    double sink = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    comms[WORLD] = MPI_COMM_WORLD;
    MPI_Comm_dup(MPI_COMM_WORLD, &comms[DUP]);
    MPI_Comm_split(MPI_COMM_WORLD, world_rank < world_size / 2, world_rank, &comms[HALVES]);
    MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &comms[PARITY]);

    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Win_allocate_shared(world_rank == 0 ? (MPI_Aint) (KINDS * world_size * sizeof(int)) : 0,
                            sizeof(int), MPI_INFO_NULL, node, &base, &window);
    MPI_Win_shared_query(window, 0, &bytes, &unit, &base);
    posted = base;
    MPI_Win_lock_all(MPI_MODE_NOCHECK, window);
    if (world_rank == 0) {
        for (int i = 0; i < KINDS * world_size; i++) posted[i] = -1;
    }
    MPI_Win_sync(window);
    MPI_Barrier(node);

    for (int round = 0; round < rounds; round++) {
        MPI_Request requests[2];
        post(DUP, round);
        MPI_Ibarrier(comms[DUP], &requests[0]);
        post(PARITY, round);
        MPI_Ibarrier(comms[PARITY], &requests[1]);
        post(HALVES, round);
        MPI_Barrier(comms[HALVES]);
        failures += check(HALVES, comms[HALVES], round);
        for (int i = 0; i < 1000; i++) sink += i * 0.5; /* compute while the barriers run */
        int done = 0;
        MPI_Test(&requests[0], &done, MPI_STATUS_IGNORE);
        if (done) failures += check(DUP, comms[DUP], round);
        MPI_Wait(&requests[1], MPI_STATUS_IGNORE);
        failures += check(PARITY, comms[PARITY], round);
        if (!done) {
            MPI_Wait(&requests[0], MPI_STATUS_IGNORE);
            failures += check(DUP, comms[DUP], round);
        }
        post(WORLD, round);
        MPI_Barrier(comms[WORLD]);
        failures += check(WORLD, comms[WORLD], round);
    }
    MPI_Win_unlock_all(window);
    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (world_rank == 0) {
        if (failures == 0) printf("concurrent: %d rounds ok (%g)\n", rounds, sink > 0 ? 1.0 : 0.0);
        else printf("concurrent: %d failures\n", failures);
    }
    MPI_Win_free(&window);
    for (int kind = DUP; kind < KINDS; kind++) MPI_Comm_free(&comms[kind]);
    MPI_Finalize();
    return failures ? 1 : 0;
}
