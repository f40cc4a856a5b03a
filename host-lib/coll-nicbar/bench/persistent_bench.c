/*
 * What a persistent collective's start costs beside the call it replaces, for whichever coll
 * component serves the communicator: an 8-byte MPI_DOUBLE MPI_SUM allreduce and a barrier, each
 * as the blocking call, the non-blocking call waited for at once, and a persistent request
 * (MPIX_Allreduce_init, MPIX_Barrier_init) started and waited for.
 *
 * Usage: persistent_bench ITERATIONS. Rank 0 prints one line:
 *   result allreduce_us=<mean> iallreduce_us=<mean> pallreduce_us=<mean>
 *          iallreduce_post_us=<mean> pallreduce_post_us=<mean>
 *          barrier_us=<mean> pbarrier_us=<mean> pbarrier_post_us=<mean>
 * Each *_us is the mean time per operation over ITERATIONS back-to-back operations after a
 * warm-up, the largest over the ranks; *_post_us is the mean time in the call that starts it
 * (MPI_Iallreduce, MPI_Start) alone, the largest over the ranks.
 */
#include <mpi.h>
#include <mpi-ext.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    double whole; /* seconds per operation */
    double post;  /* seconds per operation in the starting call */
} timing_t;

enum { BLOCKING, NONBLOCKING, PERSISTENT };

/* `iterations` allreduces (or barriers, `barrier` set) of `form`, timed at this rank. */
static timing_t run(int form, int barrier, int iterations)
{
    double in = 1.0, out = 0.0, posting = 0.0;
    MPI_Request request = MPI_REQUEST_NULL;
    if (PERSISTENT == form) {
        if (barrier) {
            MPIX_Barrier_init(MPI_COMM_WORLD, MPI_INFO_NULL, &request);
        } else {
            MPIX_Allreduce_init(&in, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD,
                                MPI_INFO_NULL, &request);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (int i = 0; i < iterations; i++) {
        if (BLOCKING == form) {
            if (barrier) {
                MPI_Barrier(MPI_COMM_WORLD);
            } else {
                MPI_Allreduce(&in, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            }
            continue;
        }
        double before = MPI_Wtime();
        if (PERSISTENT == form) {
            MPI_Start(&request);
        } else if (barrier) {
            MPI_Ibarrier(MPI_COMM_WORLD, &request);
        } else {
            MPI_Iallreduce(&in, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &request);
        }
        posting += MPI_Wtime() - before;
        MPI_Wait(&request, MPI_STATUS_IGNORE);
    }
    timing_t timing = {(MPI_Wtime() - start) / iterations, posting / iterations};
    if (PERSISTENT == form) {
        MPI_Request_free(&request);
    }
    MPI_Allreduce(MPI_IN_PLACE, &timing.whole, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &timing.post, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return timing;
}

int main(int argc, char **argv)
{
    int iterations = argc > 1 ? atoi(argv[1]) : 1000, rank;
    int warmup = iterations / 10 + 10;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int form = BLOCKING; form <= PERSISTENT; form++) {
        (void) run(form, 0, warmup);
        (void) run(form, 1, warmup);
    }
    timing_t allreduce = run(BLOCKING, 0, iterations);
    timing_t iallreduce = run(NONBLOCKING, 0, iterations);
    timing_t pallreduce = run(PERSISTENT, 0, iterations);
    timing_t barrier = run(BLOCKING, 1, iterations);
    timing_t pbarrier = run(PERSISTENT, 1, iterations);
    if (0 == rank) {
        printf("result allreduce_us=%.2f iallreduce_us=%.2f pallreduce_us=%.2f "
               "iallreduce_post_us=%.2f pallreduce_post_us=%.2f barrier_us=%.2f "
               "pbarrier_us=%.2f pbarrier_post_us=%.2f\n",
               allreduce.whole * 1e6, iallreduce.whole * 1e6, pallreduce.whole * 1e6,
               iallreduce.post * 1e6, pallreduce.post * 1e6, barrier.whole * 1e6,
               pbarrier.whole * 1e6, pbarrier.post * 1e6);
    }
    MPI_Finalize();
    return 0;
}
