/*
 * MPI_Barrier latency and MPI_Ibarrier overlap, as OSU's osu_barrier and osu_ibarrier define
 * them, for whichever coll component serves the communicator — or, given `allreduce BYTES`, the
 * same of MPI_Allreduce and MPI_Iallreduce (a sum of BYTES / 8 doubles, as osu_allreduce and
 * osu_iallreduce measure them).
 *
 * Usage: barrier_bench ITERATIONS [allreduce BYTES]. Rank 0 prints one line (the names are the
 * barrier's whichever collective ran):
 *   result barrier_us=<mean> ibarrier_pure_us=<mean> overlap_pct=<percent> post_us=<mean>
 *          wait_us=<mean> ended_wait_us=<mean>
 * Latency is the mean over ITERATIONS back-to-back barriers, the largest over the ranks. Overlap
 * (OSU): t_pure is an Ibarrier waited for at once; t_total an Ibarrier with t_pure of compute
 * between its start and its wait; t_compute that compute alone;
 * overlap = 100 * max(0, min(1, 1 - (t_total - t_compute) / t_pure)), the smallest over the ranks.
 * post_us and wait_us split t_total - t_compute: the time in the MPI_Ibarrier call and in the
 * MPI_Wait after the compute (each the largest over the ranks), so a reader sees where the time
 * that did not overlap went. ended_wait_us: the MPI_Wait of a collective long over, the process
 * having slept 100 us after starting it (leaving its core to whatever runs the collective, on a
 * host with none to spare), the largest over the ranks: what the call itself costs.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile double sink;
static double *input, *output;
static int count;

/* The collective measured, blocking and non-blocking. */
static void blocking(void)
{
    if (count > 0) {
        MPI_Allreduce(input, output, count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
    }
}

static void post(MPI_Request *request)
{
    if (count > 0) {
        MPI_Iallreduce(input, output, count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, request);
    } else {
        MPI_Ibarrier(MPI_COMM_WORLD, request);
    }
}

/* Computes for about `seconds` (a loop calibrated against MPI_Wtime). */
static void compute(double seconds)
{
    double start = MPI_Wtime();
    double x = 0;
    while (MPI_Wtime() - start < seconds) {
        for (int i = 0; i < 100; i++) x += i * 0.5;
    }
    sink = x;
}

int main(int argc, char **argv)
{
    int iterations = argc > 1 ? atoi(argv[1]) : 1000, rank;
    int warmup = iterations / 10 + 10;
    double begin, barrier, pure, total, cpu, overlap, posting, waiting;
    MPI_Request request;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc > 2) {
        int bytes = argc > 3 ? atoi(argv[3]) : 0;
        if (0 != strcmp(argv[2], "allreduce") || bytes < (int) sizeof(double)) {
            if (0 == rank) {
                fprintf(stderr, "usage: barrier_bench ITERATIONS [allreduce BYTES(>= 8)]\n");
            }
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        count = bytes / (int) sizeof(double);
        input = calloc((size_t) count, sizeof(double));
        output = calloc((size_t) count, sizeof(double));
        if (NULL == input || NULL == output) {
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }

    for (int i = 0; i < warmup; i++) blocking();
    begin = MPI_Wtime();
    for (int i = 0; i < iterations; i++) blocking();
    barrier = (MPI_Wtime() - begin) / iterations;

    for (int i = 0; i < warmup; i++) {
        post(&request);
        MPI_Wait(&request, MPI_STATUS_IGNORE);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    begin = MPI_Wtime();
    for (int i = 0; i < iterations; i++) {
        post(&request);
        MPI_Wait(&request, MPI_STATUS_IGNORE);
    }
    pure = (MPI_Wtime() - begin) / iterations;
    /* Every rank computes for the same time: the largest pure latency. */
    MPI_Allreduce(MPI_IN_PLACE, &pure, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

    MPI_Barrier(MPI_COMM_WORLD);
    total = 0;
    cpu = 0;
    posting = 0;
    waiting = 0;
    for (int i = 0; i < iterations; i++) {
        double t0 = MPI_Wtime(), t1, t2;
        post(&request);
        t1 = MPI_Wtime();
        compute(pure);
        t2 = MPI_Wtime();
        cpu += t2 - t1;
        MPI_Wait(&request, MPI_STATUS_IGNORE);
        total += MPI_Wtime() - t0;
        posting += t1 - t0;
        waiting += MPI_Wtime() - t2;
    }
    total /= iterations;
    cpu /= iterations;
    posting /= iterations;
    waiting /= iterations;
    overlap = 100.0 * (1.0 - (total - cpu) / pure);
    overlap = overlap < 0 ? 0 : overlap > 100 ? 100 : overlap;

    double ended_wait = 0;
    int ended = iterations < 1000 ? iterations : 1000;
    for (int i = 0; i < ended; i++) {
        const struct timespec asleep = {0, 100 * 1000};
        post(&request);
        nanosleep(&asleep, NULL);
        double t0 = MPI_Wtime();
        MPI_Wait(&request, MPI_STATUS_IGNORE);
        ended_wait += MPI_Wtime() - t0;
        /* The next one starts together: no rank's sleep hides another's late start. */
        MPI_Barrier(MPI_COMM_WORLD);
    }
    ended_wait /= ended;

    MPI_Allreduce(MPI_IN_PLACE, &barrier, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &overlap, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &posting, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &waiting, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &ended_wait, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("result barrier_us=%.2f ibarrier_pure_us=%.2f overlap_pct=%.1f post_us=%.2f "
               "wait_us=%.2f ended_wait_us=%.2f\n",
               barrier * 1e6, pure * 1e6, overlap, posting * 1e6, waiting * 1e6,
               ended_wait * 1e6);
    }
    free(input);
    free(output);
    MPI_Finalize();
    return 0;
}
