/*
 * One rank dies between collectives; every other rank's next one returns an error whose message
 * names a missing rank, instead of hanging.
 *
 * Usage: coll_kill VICTIM [alltoall|allreduce|iallreduce [LATE]]. The collective is MPI_Alltoall
 * (over the NIC's messages), an 8-byte MPI_Allreduce (combined in the NIC), or an MPI_Iallreduce
 * of 64 Ki doubles and its MPI_Wait (over the NIC's messages, in the background, where the
 * component's allreduce over messages is on). Prints "rank R: <MPI call> failed: <message>" on
 * each survivor and exits 0 if the message names a missing rank; exits 1 otherwise (which rank
 * it names, the caller checks). With LATE, that rank enters the failing
 * collective 0.3 s after the others, by when they have failed and exited. (The wait only steers
 * the run to that order; what is checked holds in any order.)
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One collective of `mode`; its MPI code. */
static int collective(const char *mode, int *send, int *receive, double *vector, double *sum)
{
    if (0 == strcmp(mode, "allreduce")) {
        return MPI_Allreduce(MPI_IN_PLACE, sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
    if (0 == strcmp(mode, "iallreduce")) {
        MPI_Request request;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, vector, 65536, MPI_DOUBLE, MPI_SUM,
                                MPI_COMM_WORLD, &request);
        return MPI_SUCCESS == rc ? MPI_Wait(&request, MPI_STATUS_IGNORE) : rc;
    }
    return MPI_Alltoall(send, 1024, MPI_INT, receive, 1024, MPI_INT, MPI_COMM_WORLD);
}

int main(int argc, char **argv)
{
    int rank, size, victim, rc, length;
    char message[MPI_MAX_ERROR_STRING];
    int *send, *receive;
    double sum = 1.0, *vector;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    victim = argc > 1 ? atoi(argv[1]) : size - 1;
    const char *mode = argc > 2 ? argv[2] : "alltoall";
    int late = argc > 3 ? atoi(argv[3]) : -1;
    const char *call = 0 == strcmp(mode, "allreduce")    ? "MPI_Allreduce"
                       : 0 == strcmp(mode, "iallreduce") ? "MPI_Iallreduce"
                                                          : "MPI_Alltoall";
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    send = calloc(size * 1024, sizeof *send);
    receive = calloc(size * 1024, sizeof *receive);
    vector = calloc(65536, sizeof *vector);
    for (int i = 0; i < 10; i++) {
        rc = collective(mode, send, receive, vector, &sum);
        if (MPI_SUCCESS != rc) {
            fprintf(stderr, "rank %d: %s %d failed before any rank died\n", rank, call, i);
            return 1;
        }
    }
    if (MPI_SUCCESS != MPI_Barrier(MPI_COMM_WORLD)) {
        return 1;
    }
    if (rank == victim) {
        raise(SIGKILL);
    }
    if (rank == late) {
        usleep(300000);
    }
    rc = collective(mode, send, receive, vector, &sum);
    if (MPI_SUCCESS == rc) {
        fprintf(stderr, "rank %d: %s completed without rank %d\n", rank, call, victim);
        return 1;
    }
    MPI_Error_string(rc, message, &length);
    printf("rank %d: %s failed: %s\n", rank, call, message);
    fflush(stdout);
    /* The others cannot finalize with a dead member; leave without MPI_Finalize. */
    _exit(strstr(message, " is missing") ? 0 : 1);
}
