/*
 * Every data collective the component runs — MPI_Bcast, MPI_Scatter[v], MPI_Gather[v],
 * MPI_Alltoall[v] — checked against the result MPI defines: on MPI_COMM_WORLD, a dup of it and
 * a split into odd and even ranks (odd sizes when the world's is), every root, message sizes from
 * 0 bytes to MAX_BYTES, in place, and with a derived (strided, non-contiguous) datatype on some
 * ranks, and into receive blocks that overlap (erroneous, but taken), while a non-blocking
 * barrier is outstanding on the dup. Each result MPI defines is also folded into a digest, so that
 * runs through the component and through Open MPI's own collectives can be compared.
 *
 * Usage: coll_check [MAX_BYTES] (default 16 MiB; the sizes are 0, 4 and 8 B, 4,064 and 4,068
 * B, 100,000 B, 1 MiB and 16 MiB, up to MAX_BYTES). Exits 0 when every check passed; each rank
 * prints "coll_check: rank R digest D checks N failures F", rank 0 then "coll_check: ok".
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int world_rank, failures, checks;
static uint64_t digest = 1469598103934665603ull;

/* The int rank `source` contributes at `index` in operation `salt`. */
static int value(int source, long index, int salt)
{
    return (int) ((source * 1000003L + index * 7 + salt * 13L) ^ 0x5a5a);
}

static void fold(const int *data, long n)
{
    const unsigned char *bytes = (const unsigned char *) data;
    for (long i = 0; i < n * (long) sizeof(int); i++) {
        digest = (digest ^ bytes[i]) * 1099511628211ull;
    }
}

static void expect(int got, int want, const char *what, const char *comm, long n, int root,
                   long at)
{
    checks++;
    if (got != want) {
        if (failures < 20) {
            fprintf(stderr, "rank %d: %s on %s, %ld ints, root %d: index %ld is %d, not %d\n",
                    world_rank, what, comm, n, root, at, got, want);
        }
        failures++;
    }
}

/* n ints strided by 2: a non-contiguous datatype of n ints. */
static MPI_Datatype strided(long n)
{
    MPI_Datatype type;
    MPI_Type_vector((int) n, 1, 2, MPI_INT, &type);
    MPI_Type_commit(&type);
    return type;
}

static void check_code(int code, const char *what)
{
    if (MPI_SUCCESS != code) {
        char text[MPI_MAX_ERROR_STRING];
        int length = 0;
        MPI_Error_string(code, text, &length);
        fprintf(stderr, "rank %d: %s failed: %s\n", world_rank, what, text);
        failures++;
    }
}

static void bcasts(MPI_Comm comm, const char *name, long n, int salt)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    for (int root = 0; root < size; root++) {
        for (int derived = 0; derived < 2; derived++) {
            /* With `derived`, odd ranks use the strided type over 2n ints. */
            int use = derived && (rank % 2);
            int *buffer = malloc((2 * n + 1) * sizeof *buffer);
            for (long i = 0; i < 2 * n + 1; i++) buffer[i] = -1;
            for (long i = 0; i < n && rank == root; i++) buffer[use ? 2 * i : i] = value(root, i, salt);
            if (use) {
                MPI_Datatype type = strided(n);
                check_code(MPI_Bcast(buffer, n ? 1 : 0, type, root, comm), "MPI_Bcast");
                MPI_Type_free(&type);
            } else {
                check_code(MPI_Bcast(buffer, (int) n, MPI_INT, root, comm), "MPI_Bcast");
            }
            for (long i = 0; i < n; i++) {
                expect(buffer[use ? 2 * i : i], value(root, i, salt), "MPI_Bcast", name, n, root, i);
                if (use) expect(buffer[2 * i + 1], -1, "MPI_Bcast (gap)", name, n, root, i);
            }
            fold(buffer, use ? 2 * n : n);
            free(buffer);
            salt++;
        }
    }
}

static void scatters_gathers(MPI_Comm comm, const char *name, long n, int salt)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    for (int root = 0; root < size; root++) {
        for (int mode = 0; mode < 3; mode++) {
            /* mode 0: plain; 1: in place at the root; 2: the receivers use the strided type. */
            int in_place = mode == 1 && rank == root;
            int use = mode == 2;
            int *all = malloc((size * n + 1) * sizeof *all);
            int *mine = malloc((2 * n + 1) * sizeof *mine);
            MPI_Datatype type = use ? strided(n) : MPI_INT;
            int count = use ? (n ? 1 : 0) : (int) n;
            for (long i = 0; i < size * n; i++) all[i] = value(i / (n ? n : 1), i, salt);
            for (long i = 0; i < 2 * n + 1; i++) mine[i] = -1;
            /* With no data, the buffers may be NULL (mpi4py passes NULL). */
            check_code(MPI_Scatter(n ? all : NULL, (int) n, MPI_INT,
                                   in_place ? MPI_IN_PLACE : (n ? mine : NULL), count, type, root,
                                   comm),
                       "MPI_Scatter");
            if (!in_place) {
                for (long i = 0; i < n; i++)
                    expect(mine[use ? 2 * i : i], value(rank, rank * n + i, salt), "MPI_Scatter",
                           name, n, root, i);
                fold(mine, use ? 2 * n : n);
            }
            /* Gather back what was scattered, into a cleared buffer (the root's own block
             * left in place when in place). */
            for (long i = 0; i < size * n; i++) {
                if (!(in_place && i / (n ? n : 1) == rank)) all[i] = -1;
            }
            if (in_place) {
                check_code(MPI_Gather(MPI_IN_PLACE, (int) n, MPI_INT, all, (int) n, MPI_INT,
                                      root, comm),
                           "MPI_Gather");
            } else {
                check_code(MPI_Gather(n ? mine : NULL, count, type, n ? all : NULL, (int) n,
                                      MPI_INT, root, comm),
                           "MPI_Gather");
            }
            if (rank == root) {
                for (long i = 0; i < size * n; i++)
                    expect(all[i], value(i / n, i, salt), "MPI_Gather", name, n, root, i);
                fold(all, size * n);
            }
            if (use) MPI_Type_free(&type);
            free(all);
            free(mine);
            salt++;
        }
    }
}

/* The v forms: rank r's block is (r % 3) * n / 2 + 1 ints (never all equal), with a gap of 3
 * ints between blocks that must stay untouched. */
static void v_forms(MPI_Comm comm, const char *name, long n, int salt)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    int *counts = malloc(size * sizeof *counts), *displs = malloc(size * sizeof *displs);
    long total = 0;
    for (int r = 0; r < size; r++) {
        counts[r] = (int) ((r % 3) * n / 2 + (n ? 1 : 0));
        displs[r] = (int) total;
        total += counts[r] + 3;
    }
    for (int root = 0; root < size; root++) {
        for (int in_place = 0; in_place < 2; in_place++) {
            int here = in_place && rank == root;
            int *all = malloc((total + 1) * sizeof *all);
            int *mine = malloc((counts[rank] + 1) * sizeof *mine);
            for (int r = 0; r < size; r++)
                for (long i = 0; i < counts[r] + 3; i++)
                    all[displs[r] + i] = i < counts[r] ? value(r, i, salt) : -7;
            for (long i = 0; i < counts[rank]; i++) mine[i] = -1;
            check_code(MPI_Scatterv(all, counts, displs, MPI_INT,
                                    here ? MPI_IN_PLACE : (counts[rank] ? mine : NULL),
                                    counts[rank], MPI_INT, root, comm),
                       "MPI_Scatterv");
            if (!here) {
                for (long i = 0; i < counts[rank]; i++)
                    expect(mine[i], value(rank, i, salt), "MPI_Scatterv", name, n, root, i);
                fold(mine, counts[rank]);
            }
            for (int r = 0; r < size; r++)
                for (long i = 0; i < counts[r]; i++)
                    if (!(here && r == rank)) all[displs[r] + i] = -1;
            if (!here) {
                for (long i = 0; i < counts[rank]; i++) mine[i] = value(rank, i, salt + 1);
            } else {
                for (long i = 0; i < counts[rank]; i++) all[displs[rank] + i] = value(rank, i, salt + 1);
            }
            check_code(MPI_Gatherv(here ? MPI_IN_PLACE : (counts[rank] ? mine : NULL),
                                   counts[rank], MPI_INT, all, counts, displs, MPI_INT, root,
                                   comm),
                       "MPI_Gatherv");
            if (rank == root) {
                for (int r = 0; r < size; r++)
                    for (long i = 0; i < counts[r] + 3; i++)
                        expect(all[displs[r] + i], i < counts[r] ? value(r, i, salt + 1) : -7,
                               "MPI_Gatherv", name, n, root, displs[r] + i);
                fold(all, total);
            }
            free(all);
            free(mine);
            salt += 2;
        }
    }
    free(counts);
    free(displs);
}

static void alltoalls(MPI_Comm comm, const char *name, long n, int salt)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    for (int mode = 0; mode < 3; mode++) {
        /* mode 0: plain; 1: in place; 2: the receive side strided. */
        int use = mode == 2;
        int *send = malloc((size * n + 1) * sizeof *send);
        int *receive = malloc((2 * size * n + 1) * sizeof *receive);
        MPI_Datatype type = use ? strided(n) : MPI_INT;
        int count = use ? (n ? 1 : 0) : (int) n;
        MPI_Aint lb, extent;
        for (long i = 0; i < size * n; i++) send[i] = value(rank * size + (int) (i / n), i % n, salt);
        for (long i = 0; i < 2 * size * n + 1; i++) receive[i] = -1;
        if (use) {
            /* Blocks of the strided type must follow one another: resize its extent to 2n ints. */
            MPI_Datatype resized;
            MPI_Type_create_resized(type, 0, (MPI_Aint) (2 * n * sizeof(int)), &resized);
            MPI_Type_commit(&resized);
            MPI_Type_free(&type);
            type = resized;
        }
        MPI_Type_get_extent(type, &lb, &extent);
        if (mode == 1) {
            memcpy(receive, send, size * n * sizeof *send);
            check_code(MPI_Alltoall(MPI_IN_PLACE, 0, MPI_INT, receive, (int) n, MPI_INT, comm),
                       "MPI_Alltoall");
        } else {
            check_code(MPI_Alltoall(send, (int) n, MPI_INT, receive, count, type, comm),
                       "MPI_Alltoall");
        }
        for (int from = 0; from < size; from++)
            for (long i = 0; i < n; i++) {
                long at = use ? from * 2 * n + 2 * i : from * n + i;
                expect(receive[at], value(from * size + rank, i, salt), "MPI_Alltoall", name, n, -1,
                       at);
            }
        fold(receive, use ? 2 * size * n : size * n);
        if (use) MPI_Type_free(&type);
        free(send);
        free(receive);
        salt++;
    }
    /* Alltoallv: rank i sends ((i + j) % 3) * n / 2 ints to rank j, blocks 2 ints apart. */
    for (int in_place = 0; in_place < 2; in_place++) {
        int *sc = malloc(size * sizeof *sc), *sd = malloc(size * sizeof *sd);
        int *rc = malloc(size * sizeof *rc), *rd = malloc(size * sizeof *rd);
        long stotal = 0, rtotal = 0;
        for (int j = 0; j < size; j++) {
            sc[j] = (int) (((rank + j) % 3) * n / 2);
            sd[j] = (int) stotal;
            stotal += sc[j] + 2;
            rc[j] = (int) (((j + rank) % 3) * n / 2);
            rd[j] = (int) rtotal;
            rtotal += rc[j] + 2;
        }
        int *send = malloc((stotal + 1) * sizeof *send), *receive = malloc((rtotal + 1) * sizeof *receive);
        for (int j = 0; j < size; j++)
            for (long i = 0; i < sc[j]; i++) send[sd[j] + i] = value(rank * size + j, i, salt);
        for (long i = 0; i < rtotal; i++) receive[i] = -7;
        if (in_place) {
            /* In place the send and receive shapes are the receive's: rc == sc here. */
            for (int j = 0; j < size; j++)
                for (long i = 0; i < rc[j]; i++) receive[rd[j] + i] = value(rank * size + j, i, salt);
            check_code(MPI_Alltoallv(MPI_IN_PLACE, NULL, NULL, MPI_INT, receive, rc, rd, MPI_INT,
                                     comm),
                       "MPI_Alltoallv");
        } else {
            check_code(MPI_Alltoallv(send, sc, sd, MPI_INT, receive, rc, rd, MPI_INT, comm),
                       "MPI_Alltoallv");
        }
        for (int from = 0; from < size; from++)
            for (long i = 0; i < rc[from] + 2; i++)
                expect(receive[rd[from] + i], i < rc[from] ? value(from * size + rank, i, salt) : -7,
                       "MPI_Alltoallv", name, n, -1, rd[from] + i);
        fold(receive, rtotal);
        free(sc);
        free(sd);
        free(rc);
        free(rd);
        free(send);
        free(receive);
        salt++;
    }
}

/* Checks `all` after a collective into the overlapping blocks at `displs` (n ints each): an int
 * some block covers holds the value of one of the blocks covering it (block r's came from source
 * r * step + offset), any other int is still -1. */
static void expect_overlapped(const int *all, long span, const int *displs, int size, long n,
                              int step, int offset, int salt, const char *what, const char *name,
                              int root)
{
    for (long at = 0; at < span; at++) {
        int covered = 0, matched = 0;
        for (int r = 0; r < size; r++) {
            long i = at - displs[r];
            if (i >= 0 && i < n) {
                covered = 1;
                matched |= all[at] == value(r * step + offset, i, salt);
            }
        }
        expect(covered ? matched : all[at] == -1, 1, what, name, n, root, at);
    }
}

/*
 * Receive blocks that overlap, as programs written for timing pass them (MPICH's allgatherv4,
 * and Open MPI's own MPI_Allgatherv, which gathers into such blocks on the way): erroneous in
 * MPI, taken by Open MPI's collectives without a word, so they must run here too. Block r of
 * n ints starts at r * n / 2: every int a single block covers holds that block's value, every
 * int two cover holds one of theirs (which one MPI leaves open: nothing of it is folded).
 */
static void overlapping_receives(MPI_Comm comm, const char *name, long n, int salt)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    long span = (size - 1) * (n / 2) + n;
    int *counts = malloc(size * sizeof *counts), *displs = malloc(size * sizeof *displs);
    int *all = malloc((span + 1) * sizeof *all);
    int *mine = malloc((n + 1) * sizeof *mine);
    int *everywhere = malloc((size * n + 1) * sizeof *everywhere);
    for (int r = 0; r < size; r++) {
        counts[r] = (int) n;
        displs[r] = (int) (r * (n / 2));
    }
    for (int root = 0; root < size; root++) {
        for (long i = 0; i < n; i++) mine[i] = value(rank, i, salt);
        for (long i = 0; i < span; i++) all[i] = -1;
        check_code(MPI_Gatherv(mine, (int) n, MPI_INT, all, counts, displs, MPI_INT, root, comm),
                   "MPI_Gatherv into overlapping blocks");
        if (rank == root) {
            expect_overlapped(all, span, displs, size, n, 1, 0, salt,
                              "MPI_Gatherv into overlapping blocks", name, root);
        }
        salt++;
    }
    /* The same receive blocks in an all-to-all, from every rank. */
    for (int j = 0; j < size; j++)
        for (long i = 0; i < n; i++) everywhere[j * n + i] = value(rank * size + j, i, salt);
    int *sdispls = malloc(size * sizeof *sdispls);
    for (int j = 0; j < size; j++) sdispls[j] = (int) (j * n);
    for (long i = 0; i < span; i++) all[i] = -1;
    check_code(MPI_Alltoallv(everywhere, counts, sdispls, MPI_INT, all, counts, displs, MPI_INT,
                             comm),
               "MPI_Alltoallv into overlapping blocks");
    expect_overlapped(all, span, displs, size, n, size, rank, salt,
                      "MPI_Alltoallv into overlapping blocks", name, -1);
    free(sdispls);
    free(counts);
    free(displs);
    free(all);
    free(mine);
    free(everywhere);
}

int main(int argc, char **argv)
{
    long max_bytes = argc > 1 ? atol(argv[1]) : 16L << 20;
    const long sizes[] = {0, 1, 2, 1016, 1017, 25000, 262144, 4194304};
    MPI_Comm comms[3];
    const char *names[3] = {"world", "dup", "split"};
    int salt = 1;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_dup(MPI_COMM_WORLD, &comms[1]);
    MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, -world_rank, &comms[2]);
    comms[0] = MPI_COMM_WORLD;
    for (int c = 1; c < 3; c++) MPI_Comm_set_errhandler(comms[c], MPI_ERRORS_RETURN);

    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        long n = sizes[s];
        MPI_Request pending;
        if (n * (long) sizeof(int) > max_bytes) break;
        /* A non-blocking barrier runs in the NIC while the data collectives run. */
        check_code(MPI_Ibarrier(comms[1], &pending), "MPI_Ibarrier");
        for (int c = 0; c < 3; c++) {
            int size;
            MPI_Comm_size(comms[c], &size);
            bcasts(comms[c], names[c], n, salt);
            salt += 1000;
            scatters_gathers(comms[c], names[c], n, salt);
            salt += 1000;
            /* The v forms and all-to-all move size times more: a quarter of the size. */
            v_forms(comms[c], names[c], n / 4, salt);
            salt += 1000;
            alltoalls(comms[c], names[c], n / 4, salt);
            salt += 1000;
            overlapping_receives(comms[c], names[c], n / 4, salt);
            salt += 1000;
        }
        check_code(MPI_Wait(&pending, MPI_STATUS_IGNORE), "MPI_Wait of MPI_Ibarrier");
    }
    MPI_Comm_free(&comms[1]);
    MPI_Comm_free(&comms[2]);
    printf("coll_check: rank %d digest %016llx checks %d failures %d\n", world_rank,
           (unsigned long long) digest, checks, failures);
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    if (0 == world_rank && 0 == failures) {
        printf("coll_check: ok\n");
    }
    MPI_Finalize();
    return failures ? 1 : 0;
}
