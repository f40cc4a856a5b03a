/*
 * The reproducible sum (coll_nicbar_reproducible_sum 1): MPI_Allreduce, MPI_Reduce,
 * MPI_Iallreduce and MPI_Allreduce in place of one MPI_DOUBLE or MPI_FLOAT with MPI_SUM give
 * every rank the bits of the exact sum rounded once, on MPI_COMM_WORLD, on a split of it in the
 * opposite rank order and on its two halves. The values are large powers of two of both signs
 * and small integers, so an ordinary floating-point sum depends on the order of its additions
 * (2^53 + 1 is 2^53 in double precision), while the exact sum is an integer the program computes
 * itself and C converts to the nearest floating-point number.
 *
 * usage: reproducible_check [ROUNDS]   prints "reproducible_check: ok N checks" on rank 0
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int failures, checks;

/* World rank `r`'s value: +-2^bits every third rank (alternating signs), else a small integer
 * that differs from round to round. */
static int64_t value(int r, int bits, int round)
{
    if (0 == r % 3) {
        int64_t big = (int64_t) 1 << bits;
        return 0 == (r / 3) % 2 ? big : -big;
    }
    return 1 + (r + round) % 5;
}

static void check(const char *what, const char *comm, double got, double expected)
{
    checks++;
    if (got != expected) {
        failures++;
        fprintf(stderr, "reproducible_check: %s on %s: got %.17g, expected %.17g\n", what, comm,
                got, expected);
    }
}

/* Checks the sums of `comm`, whose members are the world ranks `members[0..count)`. */
static void run(MPI_Comm comm, const char *name, const int *members, int count, int world_rank,
                int round)
{
    int64_t exact = 0, exact_single = 0;
    for (int i = 0; i < count; i++) {
        exact += value(members[i], 53, round);
        exact_single += value(members[i], 24, round);
    }
    double expected = (double) exact;
    float expected_single = (float) exact_single;
    double mine = (double) value(world_rank, 53, round), sum = 0;
    float mine_single = (float) value(world_rank, 24, round), sum_single = 0;
    int rank;
    MPI_Comm_rank(comm, &rank);

    MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, comm);
    check("MPI_Allreduce (double)", name, sum, expected);
    MPI_Allreduce(&mine_single, &sum_single, 1, MPI_FLOAT, MPI_SUM, comm);
    check("MPI_Allreduce (float)", name, sum_single, expected_single);
    sum = mine;
    MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, comm);
    check("MPI_Allreduce in place", name, sum, expected);
    MPI_Request request;
    MPI_Iallreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, comm, &request);
    MPI_Wait(&request, MPI_STATUS_IGNORE);
    check("MPI_Iallreduce", name, sum, expected);
    int root = round % count;
    sum = 0;
    MPI_Reduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, root, comm);
    if (rank == root) {
        check("MPI_Reduce", name, sum, expected);
    }
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    int world_rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    int *everyone = malloc(sizeof(int) * (size_t) size);
    int *half = malloc(sizeof(int) * (size_t) size);
    int half_count = 0, first_half = world_rank < size / 2;
    for (int r = 0; r < size; r++) {
        everyone[r] = r;
        if ((r < size / 2) == first_half) {
            half[half_count++] = r;
        }
    }
    MPI_Comm reversed, halves;
    MPI_Comm_split(MPI_COMM_WORLD, 0, size - world_rank, &reversed);
    MPI_Comm_split(MPI_COMM_WORLD, first_half, world_rank, &halves);

    for (int round = 0; round < rounds; round++) {
        run(MPI_COMM_WORLD, "MPI_COMM_WORLD", everyone, size, world_rank, round);
        run(reversed, "the reversed split", everyone, size, world_rank, round);
        run(halves, "a half", half, half_count, world_rank, round);
    }

    int all_failures = 0, all_checks = 0;
    MPI_Reduce(&failures, &all_failures, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&checks, &all_checks, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (0 == world_rank) {
        if (0 == all_failures) {
            printf("reproducible_check: ok %d checks\n", all_checks);
        } else {
            printf("reproducible_check: %d of %d checks failed\n", all_failures, all_checks);
        }
    }
    MPI_Comm_free(&reversed);
    MPI_Comm_free(&halves);
    free(everyone);
    free(half);
    MPI_Finalize();
    return 0 == all_failures ? 0 : 1;
}
