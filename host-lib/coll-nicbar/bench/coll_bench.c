/*
 * Latency of the data collectives — MPI_Bcast, MPI_Scatter, MPI_Gather, MPI_Alltoall and the v
 * forms, and MPI_Allreduce (a sum of doubles) — for whichever coll component serves the
 * communicator, over message sizes (bytes per rank: the broadcast's and the allreduce's message,
 * the scatter's and gather's block, the all-to-all's block to each rank; an allreduce of fewer
 * than 8 bytes is skipped).
 *
 * Usage: coll_bench SIZES TIME_BUDGET_MS ALLTOALL_LIMIT [COLLECTIVES]. SIZES is a comma-separated
 * list of byte counts; COLLECTIVES, a comma-separated list of the names below (default: all). Each (collective, size) runs a warm-up and then as many iterations as fit about
 * TIME_BUDGET_MS (at least 3, at most 1000); the root rotates. An all-to-all whose whole
 * exchange (block x size x size) exceeds ALLTOALL_LIMIT bytes is skipped. Rank 0 prints, per
 * measurement:
 *   result collective=<name> bytes=<n> us=<mean> iterations=<k>
 * where the mean is the largest over the ranks.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BCAST, SCATTER, GATHER, SCATTERV, GATHERV, ALLTOALL, ALLTOALLV, ALLREDUCE, COLLECTIVES };
static const char *names[COLLECTIVES] = {"bcast",   "scatter",  "gather",    "scatterv",
                                         "gatherv", "alltoall", "alltoallv", "allreduce"};

static int rank, size;
static char *send_buffer, *receive_buffer;
static int *counts, *displs;

static void run(int collective, int bytes, int root)
{
    switch (collective) {
    case BCAST:
        MPI_Bcast(send_buffer, bytes, MPI_BYTE, root, MPI_COMM_WORLD);
        break;
    case SCATTER:
        MPI_Scatter(send_buffer, bytes, MPI_BYTE, receive_buffer, bytes, MPI_BYTE, root,
                    MPI_COMM_WORLD);
        break;
    case GATHER:
        MPI_Gather(send_buffer, bytes, MPI_BYTE, receive_buffer, bytes, MPI_BYTE, root,
                   MPI_COMM_WORLD);
        break;
    case SCATTERV:
        MPI_Scatterv(send_buffer, counts, displs, MPI_BYTE, receive_buffer, bytes, MPI_BYTE, root,
                     MPI_COMM_WORLD);
        break;
    case GATHERV:
        MPI_Gatherv(send_buffer, bytes, MPI_BYTE, receive_buffer, counts, displs, MPI_BYTE, root,
                    MPI_COMM_WORLD);
        break;
    case ALLTOALL:
        MPI_Alltoall(send_buffer, bytes, MPI_BYTE, receive_buffer, bytes, MPI_BYTE,
                     MPI_COMM_WORLD);
        break;
    case ALLTOALLV:
        MPI_Alltoallv(send_buffer, counts, displs, MPI_BYTE, receive_buffer, counts, displs,
                      MPI_BYTE, MPI_COMM_WORLD);
        break;
    case ALLREDUCE:
        MPI_Allreduce(send_buffer, receive_buffer, bytes / (int) sizeof(double), MPI_DOUBLE,
                      MPI_SUM, MPI_COMM_WORLD);
        break;
    }
}

/* Whether `name` is one of the comma-separated `list`. */
static int listed(const char *list, const char *name)
{
    size_t length = strlen(name);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t word = end ? (size_t) (end - p) : strlen(p);
        if (word == length && 0 == strncmp(p, name, length)) {
            return 1;
        }
        if (!end) {
            break;
        }
        p = end + 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *sizes = argc > 1 ? argv[1] : "8,1024,65536";
    double budget = (argc > 2 ? atof(argv[2]) : 200.0) / 1000.0;
    double alltoall_limit = argc > 3 ? atof(argv[3]) : 64.0 * 1024 * 1024;
    const char *only = argc > 4 ? argv[4] : NULL;
    long largest = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (const char *p = sizes; *p;) {
        long bytes = strtol(p, (char **) &p, 10);
        if (bytes > largest) largest = bytes;
        if (*p == ',') p++;
        else if (*p) break;
    }
    send_buffer = calloc((size_t) largest * size + 1, 1);
    receive_buffer = calloc((size_t) largest * size + 1, 1);
    counts = malloc(size * sizeof *counts);
    displs = malloc(size * sizeof *displs);
    if (!send_buffer || !receive_buffer || !counts || !displs) {
        fprintf(stderr, "coll_bench: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int collective = 0; collective < COLLECTIVES; collective++) {
        if (only && !listed(only, names[collective])) {
            continue;
        }
        for (const char *p = sizes; *p;) {
            int bytes = (int) strtol(p, (char **) &p, 10);
            if (*p == ',') p++;
            int all_to_all = collective == ALLTOALL || collective == ALLTOALLV;
            if (all_to_all && (double) bytes * size * size > alltoall_limit) {
                continue;
            }
            if (collective == ALLREDUCE && bytes < (int) sizeof(double)) {
                continue;
            }
            for (int r = 0; r < size; r++) {
                counts[r] = bytes;
                displs[r] = r * bytes;
            }
            /* Warm-up, and how many iterations fit the budget. */
            MPI_Barrier(MPI_COMM_WORLD);
            double start = MPI_Wtime();
            run(collective, bytes, 0);
            double once = MPI_Wtime() - start;
            MPI_Allreduce(MPI_IN_PLACE, &once, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            int iterations = once > 0 ? (int) (budget / once) : 1000;
            if (iterations < 3) iterations = 3;
            if (iterations > 1000) iterations = 1000;
            MPI_Barrier(MPI_COMM_WORLD);
            start = MPI_Wtime();
            for (int i = 0; i < iterations; i++) {
                run(collective, bytes, i % size);
            }
            double mean = (MPI_Wtime() - start) / iterations * 1e6;
            MPI_Allreduce(MPI_IN_PLACE, &mean, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (0 == rank) {
                printf("result collective=%s bytes=%d us=%.2f iterations=%d\n", names[collective],
                       bytes, mean, iterations);
                fflush(stdout);
            }
        }
    }
    free(send_buffer);
    free(receive_buffer);
    free(counts);
    free(displs);
    MPI_Finalize();
    return 0;
}
