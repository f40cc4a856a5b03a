/*
 * One rank dies between barriers; every other rank's next MPI_Barrier returns an error whose
 * message names the dead rank, instead of hanging.
 *
 * Usage: barrier_kill VICTIM [LATE]. Prints "rank R: MPI_Barrier failed: <message>" on each
 * survivor and exits 0 if the message names VICTIM; exits 1 otherwise. With LATE, that rank
 * enters the failing barrier 0.3 s after the others, by when they have failed and exited: it
 * must name the dead rank too, not a survivor that entered the barrier before it left. (The
 * wait only steers the run to that order; what is checked holds in any order.)
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank, size, victim, late, rc, length;
    char message[MPI_MAX_ERROR_STRING], expected[64];

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    victim = argc > 1 ? atoi(argv[1]) : size - 1;
    late = argc > 2 ? atoi(argv[2]) : -1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    for (int i = 0; i < 10; i++) {
        if (MPI_SUCCESS != MPI_Barrier(MPI_COMM_WORLD)) {
            fprintf(stderr, "rank %d: barrier %d failed before any rank died\n", rank, i);
            return 1;
        }
    }
    if (rank == victim) {
        raise(SIGKILL);
    }
    if (rank == late) {
        usleep(300000);
    }
    rc = MPI_Barrier(MPI_COMM_WORLD);
    if (MPI_SUCCESS == rc) {
        fprintf(stderr, "rank %d: MPI_Barrier completed without rank %d\n", rank, victim);
        return 1;
    }
    MPI_Error_string(rc, message, &length);
    printf("rank %d: MPI_Barrier failed: %s\n", rank, message);
    fflush(stdout);
    snprintf(expected, sizeof expected, "rank %d is missing", victim);
    /* The others cannot finalize with a dead member; leave without MPI_Finalize. */
    _exit(strstr(message, expected) ? 0 : 1);
}
