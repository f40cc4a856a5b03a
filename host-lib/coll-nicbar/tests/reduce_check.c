/*
 * MPI_Allreduce, MPI_Reduce, MPI_Iallreduce and MPI_Ireduce checked for every predefined
 * operation on every type the NIC combines, and on types and lengths it does not (which go to
 * the component below): each result against a reference every rank computes itself, folding
 * every rank's input in rank order with MPI_Reduce_local (Open MPI's own operation code).
 * Inputs are small integers, exact in every type, so every order of combination gives the same
 * bits. Runs on MPI_COMM_WORLD, a dup of it and a split of it; in place and not; every root.
 *
 * usage: reduce_check [ROUNDS]   prints "reduce_check: ok N checks" on rank 0
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MOST 64 /* bytes of the longest vector: past the NIC's 32, so the fallback runs too */

typedef struct {
    MPI_Datatype type;
    const char *name;
    int size;
    int floating;
    int is_signed;
    int pair; /* a (value, int) type of MINLOC and MAXLOC */
} type_t;

typedef struct {
    MPI_Op op;
    const char *name;
} op_t;

static int failures, checks;

/* Writes `value` as element `i` of `buffer`, of `type` (for pairs, with `index`). */
static void store(const type_t *type, void *buffer, int i, long value, int index)
{
    char *at = (char *) buffer + (size_t) i * (size_t) type->size;
    if (type->pair) {
        if (MPI_2INT == type->type) {
            int pair[2] = {(int) value, index};
            memcpy(at, pair, sizeof pair);
        } else if (MPI_FLOAT_INT == type->type) {
            struct {
                float value;
                int index;
            } pair = {(float) value, index};
            memcpy(at, &pair, sizeof pair);
        } else {
            struct {
                double value;
                int index;
            } pair = {(double) value, index};
            memcpy(at, &pair, sizeof pair);
        }
        return;
    }
    switch (type->size) {
    case 1: {
        int8_t v = (int8_t) value;
        memcpy(at, &v, 1);
        break;
    }
    case 2: {
        int16_t v = (int16_t) value;
        memcpy(at, &v, 2);
        break;
    }
    case 4:
        if (type->floating) {
            float v = (float) value;
            memcpy(at, &v, 4);
        } else {
            int32_t v = (int32_t) value;
            memcpy(at, &v, 4);
        }
        break;
    default:
        if (type->floating) {
            double v = (double) value;
            memcpy(at, &v, 8);
        } else {
            int64_t v = (int64_t) value;
            memcpy(at, &v, 8);
        }
        break;
    }
}

/*
 * Rank `rank`'s input: values the operation keeps exact in every type (a product of at most a
 * few twos, sums far below any overflow, truth values for the logical operations, negatives
 * only in signed types).
 */
static void input(const type_t *type, MPI_Op op, int rank, int count, void *buffer)
{
    for (int i = 0; i < count; i++) {
        long value;
        if (MPI_PROD == op) {
            value = (rank + i) % 4 == 0 ? 2 : 1;
        } else if (MPI_LAND == op || MPI_LOR == op || MPI_LXOR == op) {
            value = (rank * 3 + i) % 4 != 0;
            if (MPI_LOR == op) {
                value = (rank + 2 * i) % 5 == 0;
            }
        } else if (MPI_BAND == op || MPI_BOR == op || MPI_BXOR == op) {
            value = (rank * 37 + i * 11 + 5) & 0x7f;
        } else {
            value = (rank * 7 + i * 5) % 13;
            if (type->is_signed) {
                value -= 6;
            }
        }
        /* Pairs: the index is the rank, and equal values tie (MPI: the smaller index). */
        store(type, buffer, i, value, rank);
    }
}

/* Whether `count` elements of `type` hold the same values (not comparing the padding of
 * MPI_DOUBLE_INT's C struct, which no reduction writes). */
static int same(const type_t *type, const void *a, const void *b, int count)
{
    size_t meaningful = MPI_DOUBLE_INT == type->type ? sizeof(double) + sizeof(int)
                                                     : (size_t) type->size;
    for (int i = 0; i < count; i++) {
        size_t at = (size_t) i * (size_t) type->size;
        if (0 != memcmp((const char *) a + at, (const char *) b + at, meaningful)) {
            return 0;
        }
    }
    return 1;
}

static void check(int ok, const char *what, const type_t *type, const op_t *op, int count,
                  const char *comm_name)
{
    checks++;
    if (!ok) {
        int rank;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        if (failures++ < 20) {
            printf("reduce_check: rank %d: %s of %d %s with %s on %s differs from the reference\n",
                   rank, what, count, type->name, op->name, comm_name);
        }
    }
}

/* Every form of the reduction of `count` elements on `comm`, each against the reference. */
static void run(MPI_Comm comm, const char *comm_name, const type_t *type, const op_t *op,
                int count)
{
    int rank, size;
    unsigned char mine[MOST], expected[MOST], theirs[MOST], got[MOST];
    size_t bytes = (size_t) count * (size_t) type->size;
    MPI_Request request;

    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    input(type, op->op, 0, count, expected);
    for (int other = 1; other < size; other++) {
        input(type, op->op, other, count, theirs);
        /* inoutbuf = inbuf op inoutbuf: fold in rank order, the value so far on the left. */
        memcpy(got, expected, bytes);
        memcpy(expected, theirs, bytes);
        MPI_Reduce_local(got, expected, count, type->type, op->op);
    }
    input(type, op->op, rank, count, mine);

    memset(got, 0xa5, sizeof got);
    MPI_Allreduce(mine, got, count, type->type, op->op, comm);
    check(same(type, got, expected, count), "MPI_Allreduce", type, op, count, comm_name);

    memcpy(got, mine, bytes);
    MPI_Allreduce(MPI_IN_PLACE, got, count, type->type, op->op, comm);
    check(same(type, got, expected, count), "MPI_Allreduce in place", type, op, count,
          comm_name);

    memset(got, 0xa5, sizeof got);
    MPI_Iallreduce(mine, got, count, type->type, op->op, comm, &request);
    MPI_Wait(&request, MPI_STATUS_IGNORE);
    check(same(type, got, expected, count), "MPI_Iallreduce", type, op, count, comm_name);

    int root = (count + 1) % size;
    memset(got, 0xa5, sizeof got);
    MPI_Reduce(mine, got, count, type->type, op->op, root, comm);
    if (rank == root) {
        check(same(type, got, expected, count), "MPI_Reduce", type, op, count, comm_name);
    }

    if (rank == root) {
        memcpy(got, mine, bytes);
        MPI_Ireduce(MPI_IN_PLACE, got, count, type->type, op->op, root, comm, &request);
    } else {
        MPI_Ireduce(mine, NULL, count, type->type, op->op, root, comm, &request);
    }
    MPI_Wait(&request, MPI_STATUS_IGNORE);
    if (rank == root) {
        check(same(type, got, expected, count), "MPI_Ireduce in place", type, op, count,
              comm_name);
    }
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 1;
    int rank, total;
    MPI_Comm dup, split;
    const type_t types[] = {
        {MPI_SIGNED_CHAR, "MPI_SIGNED_CHAR", 1, 0, 1, 0},
        {MPI_UNSIGNED_CHAR, "MPI_UNSIGNED_CHAR", 1, 0, 0, 0},
        {MPI_INT8_T, "MPI_INT8_T", 1, 0, 1, 0},
        {MPI_UINT8_T, "MPI_UINT8_T", 1, 0, 0, 0},
        {MPI_SHORT, "MPI_SHORT", (int) sizeof(short), 0, 1, 0},
        {MPI_UNSIGNED_SHORT, "MPI_UNSIGNED_SHORT", (int) sizeof(short), 0, 0, 0},
        {MPI_INT, "MPI_INT", (int) sizeof(int), 0, 1, 0},
        {MPI_UNSIGNED, "MPI_UNSIGNED", (int) sizeof(int), 0, 0, 0},
        {MPI_INT32_T, "MPI_INT32_T", 4, 0, 1, 0},
        {MPI_LONG, "MPI_LONG", (int) sizeof(long), 0, 1, 0},
        {MPI_UNSIGNED_LONG, "MPI_UNSIGNED_LONG", (int) sizeof(long), 0, 0, 0},
        {MPI_LONG_LONG_INT, "MPI_LONG_LONG_INT", (int) sizeof(long long), 0, 1, 0},
        {MPI_UINT64_T, "MPI_UINT64_T", 8, 0, 0, 0},
        {MPI_FLOAT, "MPI_FLOAT", (int) sizeof(float), 1, 1, 0},
        {MPI_DOUBLE, "MPI_DOUBLE", (int) sizeof(double), 1, 1, 0},
        {MPI_BYTE, "MPI_BYTE", 1, 0, 0, 0},
        {MPI_2INT, "MPI_2INT", 2 * (int) sizeof(int), 0, 1, 1},
        {MPI_FLOAT_INT, "MPI_FLOAT_INT", 8, 1, 1, 1},
        {MPI_DOUBLE_INT, "MPI_DOUBLE_INT", 16, 1, 1, 1},
    };
    const op_t ops[] = {
        {MPI_SUM, "MPI_SUM"},   {MPI_PROD, "MPI_PROD"},     {MPI_MIN, "MPI_MIN"},
        {MPI_MAX, "MPI_MAX"},   {MPI_LAND, "MPI_LAND"},     {MPI_LOR, "MPI_LOR"},
        {MPI_LXOR, "MPI_LXOR"}, {MPI_BAND, "MPI_BAND"},     {MPI_BOR, "MPI_BOR"},
        {MPI_BXOR, "MPI_BXOR"}, {MPI_MINLOC, "MPI_MINLOC"}, {MPI_MAXLOC, "MPI_MAXLOC"},
    };

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &total);
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, total - rank, &split);
    for (int round = 0; round < rounds; round++) {
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            const type_t *type = &types[t];
            for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
                const op_t *op = &ops[o];
                int pairwise = MPI_MINLOC == op->op || MPI_MAXLOC == op->op;
                int bitwise = MPI_BAND == op->op || MPI_BOR == op->op || MPI_BXOR == op->op;
                int logical = MPI_LAND == op->op || MPI_LOR == op->op || MPI_LXOR == op->op;
                /* MPI's rules: what each operation is defined on. */
                if (pairwise != type->pair || (type->floating && (bitwise || logical)) ||
                    (MPI_BYTE == type->type && !bitwise)) {
                    continue;
                }
                /* One element, the most the NIC carries, and more (the fallback). */
                int counts[] = {1, 32 / type->size, MOST / type->size};
                for (size_t c = 0; c < 3; c++) {
                    run(MPI_COMM_WORLD, "MPI_COMM_WORLD", type, op, counts[c]);
                    run(dup, "a dup of MPI_COMM_WORLD", type, op, counts[c]);
                    run(split, "a split of MPI_COMM_WORLD", type, op, counts[c]);
                }
            }
        }
    }
    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (0 == rank) {
        if (0 == failures) {
            printf("reduce_check: ok %d checks\n", checks);
        } else {
            printf("reduce_check: %d checks failed\n", failures);
        }
    }
    MPI_Comm_free(&split);
    MPI_Comm_free(&dup);
    MPI_Finalize();
    return 0 == failures ? 0 : 1;
}
