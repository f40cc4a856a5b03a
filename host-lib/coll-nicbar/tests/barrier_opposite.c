/*
 * Non-blocking barriers on two communicators started in opposite orders: even ranks start
 * MPI_Ibarrier on A then on B, odd ranks on B then on A (A and B have the same members; MPI
 * orders collectives per communicator only), then MPI_Waitall. A valid MPI program: every round
 * must complete. A barrier is checked, not trusted: before entering it each rank posts the round
 * into a shared-memory window, and after it every member must have posted that round.
 *
 * Usage: barrier_opposite ROUNDS. Exits 0 and prints "opposite: N rounds ok" on rank 0.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

enum { A, B, KINDS };
static const char *names[KINDS] = {"A", "B"};

static volatile int *posted; /* posted[kind * world_size + world_rank] = last round entered */
static int world_rank, world_size;
static MPI_Win window;

static void post(int kind, int round)
{
    posted[kind * world_size + world_rank] = round;
    MPI_Win_sync(window);
}

static int check(int kind, int round)
{
    int failures = 0;
    MPI_Win_sync(window);
    for (int member = 0; member < world_size; member++) {
        int seen = posted[kind * world_size + member];
        if (seen < round) {
            fprintf(stderr, "rank %d: barrier %s of round %d passed, but rank %d posted only "
                            "round %d\n", world_rank, names[kind], round, member, seen);
            failures++;
        }
    }
    return failures;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 20, failures = 0;
    MPI_Comm comms[KINDS], node;
    int *base;
    MPI_Aint bytes;
    int unit;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    MPI_Comm_dup(MPI_COMM_WORLD, &comms[A]);
    MPI_Comm_split(MPI_COMM_WORLD, 0, world_rank, &comms[B]);

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
        MPI_Request requests[KINDS];
        int first = world_rank % 2 == 0 ? A : B, second = first == A ? B : A;
        post(first, round);
        MPI_Ibarrier(comms[first], &requests[0]);
        post(second, round);
        MPI_Ibarrier(comms[second], &requests[1]);
        MPI_Waitall(KINDS, requests, MPI_STATUSES_IGNORE);
        failures += check(A, round) + check(B, round);
    }
    MPI_Win_unlock_all(window);
    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (world_rank == 0) {
        if (failures == 0) printf("opposite: %d rounds ok\n", rounds);
        else printf("opposite: %d failures\n", failures);
    }
    MPI_Win_free(&window);
    MPI_Comm_free(&node);
    for (int kind = A; kind < KINDS; kind++) MPI_Comm_free(&comms[kind]);
    MPI_Finalize();
    return failures ? 1 : 0;
}
