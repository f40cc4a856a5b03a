/*
 * MPI_Allreduce, MPI_Reduce, MPI_Iallreduce and MPI_Ireduce checked for every predefined
 * operation on every type the NIC combines, and on types and lengths it does not (which go to
 * the component below): each result against a reference every rank computes itself, folding
 * every rank's input in rank order with MPI_Reduce_local (Open MPI's own operation code).
 * Inputs are small integers, exact in every type, so every order of combination gives the same
 * bits. Fortran's types too, at the sizes its compiler gave them, and the truth types (C's bool,
 * Fortran's LOGICAL) under the logical operations. Runs on MPI_COMM_WORLD, a dup
 * of it and a split of it; in place and not; every root.
 * Then long vectors (which go over the NIC's messages) and user-defined operations: one that
 * does not commute (composing affine maps on MPI_2INT, so only rank order gives the reference)
 * and one that does; and derived types under user operations, dense, with holes and with their
 * data past their lower bound, whose holes in the result must stay untouched; and a long
 * MPI_Iallreduce that only a blocking MPI_Allreduce on another communicator can move on.
 *
 * usage: reduce_check [ROUNDS [long]]   prints "reduce_check: ok N checks" on rank 0; "long"
 *                                       runs only the long vectors and the user operations
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
    int pair;    /* a (value, int) type of MINLOC and MAXLOC */
    int fortran; /* Fortran's: its size is the compiler's kind, asked of MPI */
    int boolean; /* C's bool or Fortran's LOGICAL: the logical operations alone */
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
        if (MPI_2INT == type->type || MPI_2INTEGER == type->type) {
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
    size_t bytes = (size_t) count * (size_t) type->size;
    unsigned char *mine = malloc(bytes), *expected = malloc(bytes), *theirs = malloc(bytes),
                  *got = malloc(bytes);
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

    memset(got, 0xa5, bytes);
    MPI_Allreduce(mine, got, count, type->type, op->op, comm);
    check(same(type, got, expected, count), "MPI_Allreduce", type, op, count, comm_name);

    memcpy(got, mine, bytes);
    MPI_Allreduce(MPI_IN_PLACE, got, count, type->type, op->op, comm);
    check(same(type, got, expected, count), "MPI_Allreduce in place", type, op, count,
          comm_name);

    memset(got, 0xa5, bytes);
    MPI_Iallreduce(mine, got, count, type->type, op->op, comm, &request);
    MPI_Wait(&request, MPI_STATUS_IGNORE);
    check(same(type, got, expected, count), "MPI_Iallreduce", type, op, count, comm_name);

    int root = (count + 1) % size;
    memset(got, 0xa5, bytes);
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
    free(mine);
    free(expected);
    free(theirs);
    free(got);
}

/* An affine map x -> a x + b (mod 2^32) as an MPI_2INT: composing them is associative and does
 * not commute. */
typedef struct {
    int a, b;
} affine_t;

/* inout = in o inout: the map that applies inout's, then in's. */
static void compose(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void) type;
    const affine_t *f = in;
    affine_t *g = inout;
    for (int i = 0; i < *len; i++) {
        uint32_t a = (uint32_t) f[i].a * (uint32_t) g[i].a;
        uint32_t b = (uint32_t) f[i].a * (uint32_t) g[i].b + (uint32_t) f[i].b;
        g[i].a = (int) a;
        g[i].b = (int) b;
    }
}

/* inout = in + inout, wrapping: commutes. */
static void wrapping_sum(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void) type;
    const uint64_t *x = in;
    uint64_t *y = inout;
    for (int i = 0; i < *len; i++) {
        y[i] += x[i];
    }
}

/* A user operation's input: large values, so that any other order or a lost rank shows. */
static void user_input(MPI_Datatype type, int rank, int count, void *buffer)
{
    for (int i = 0; i < count; i++) {
        uint64_t value = (uint64_t) (rank + 1) * 0x9e3779b97f4a7c15u + (uint64_t) i * 0xbf58476d1ce4e5b9u;
        if (MPI_2INT == type) {
            affine_t *maps = buffer;
            maps[i].a = (int) (value | 1);
            maps[i].b = (int) (value >> 32);
        } else {
            ((uint64_t *) buffer)[i] = value;
        }
    }
}

/* MPI_Allreduce (in place and not) and MPI_Reduce to every other root of `count` elements of
 * `type` with the user operation `op`, against the reference folded in rank order. */
static void run_user(MPI_Comm comm, const char *comm_name, MPI_Datatype type, MPI_Op op,
                     const char *op_name, int count)
{
    int rank, size, type_size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    MPI_Type_size(type, &type_size);
    size_t bytes = (size_t) count * (size_t) type_size;
    unsigned char *mine = malloc(bytes), *expected = malloc(bytes), *theirs = malloc(bytes),
                  *got = malloc(bytes);
    type_t described = {type, MPI_2INT == type ? "MPI_2INT" : "MPI_UINT64_T", type_size, 0, 0, 0};
    op_t named = {op, op_name};

    user_input(type, 0, count, expected);
    for (int other = 1; other < size; other++) {
        user_input(type, other, count, theirs);
        memcpy(got, expected, bytes);
        memcpy(expected, theirs, bytes);
        MPI_Reduce_local(got, expected, count, type, op);
    }
    user_input(type, rank, count, mine);

    memset(got, 0xa5, bytes);
    MPI_Allreduce(mine, got, count, type, op, comm);
    check(0 == memcmp(got, expected, bytes), "MPI_Allreduce", &described, &named, count,
          comm_name);
    memcpy(got, mine, bytes);
    MPI_Allreduce(MPI_IN_PLACE, got, count, type, op, comm);
    check(0 == memcmp(got, expected, bytes), "MPI_Allreduce in place", &described, &named, count,
          comm_name);
    for (int root = 0; root < size; root += 2) {
        memset(got, 0xa5, bytes);
        MPI_Reduce(mine, got, count, type, op, root, comm);
        if (rank == root) {
            check(0 == memcmp(got, expected, bytes), "MPI_Reduce", &described, &named, count,
                  comm_name);
        }
    }
    free(mine);
    free(expected);
    free(theirs);
    free(got);
}

/* Derived types, which MPI reduces under user operations only: where each element's data lies
 * in its extent, the rest being holes a reduction must leave as they were. */
typedef struct {
    MPI_Datatype type;
    const char *name;
    MPI_Op op;
    const char *op_name;
    int extent;
    int fields;     /* 8-byte fields of an element */
    int offsets[2]; /* where they lie in it */
} derived_t;

/* Two uint64_t side by side (MPI_Type_contiguous): summed, wrapping. */
static void pair_sum(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void) type;
    const uint64_t *x = in;
    uint64_t *y = inout;
    for (int i = 0; i < 2 * *len; i++) {
        y[i] += x[i];
    }
}

/* Two uint64_t with a third's hole between them (MPI_Type_vector(2, 1, 2)): summed. */
static void holed_sum(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void) type;
    const uint64_t *x = in;
    uint64_t *y = inout;
    for (int i = 0; i < *len; i++) {
        y[3 * i] += x[3 * i];
        y[3 * i + 2] += x[3 * i + 2];
    }
}

/* An affine map 8 bytes into a 16-byte element (a struct resized to lower bound 0): composed,
 * which does not commute. */
static void shifted_compose(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void) type;
    for (int i = 0; i < *len; i++) {
        int one = 1;
        compose((char *) in + 16 * i + 8, (char *) inout + 16 * i + 8, &one, NULL);
    }
}

/* Fills the data of `count` elements of `type` with rank `rank`'s values. */
static void derived_input(const derived_t *type, int rank, int count, unsigned char *buffer)
{
    for (int i = 0; i < count; i++) {
        for (int f = 0; f < type->fields; f++) {
            uint64_t value = (uint64_t) (rank + 1) * 0x9e3779b97f4a7c15u +
                             (uint64_t) (i * type->fields + f) * 0xbf58476d1ce4e5b9u;
            value |= 1; /* an affine map's factor, odd */
            memcpy(buffer + (size_t) i * (size_t) type->extent + type->offsets[f], &value, 8);
        }
    }
}

/* Whether `got` holds `expected`'s data and its holes still hold the 0xa5 they were given. */
static int same_derived(const derived_t *type, const unsigned char *got,
                        const unsigned char *expected, int count)
{
    for (int i = 0; i < count; i++) {
        const unsigned char *g = got + (size_t) i * (size_t) type->extent;
        const unsigned char *e = expected + (size_t) i * (size_t) type->extent;
        for (int byte = 0; byte < type->extent; byte++) {
            int data = 0;
            for (int f = 0; f < type->fields; f++) {
                data |= byte >= type->offsets[f] && byte < type->offsets[f] + 8;
            }
            if (data ? g[byte] != e[byte] : 0xa5 != g[byte]) {
                return 0;
            }
        }
    }
    return 1;
}

/* MPI_Allreduce (in place and not) and MPI_Reduce to every other root of `count` elements of
 * a derived type, against the reference folded in rank order. */
static void run_derived(MPI_Comm comm, const char *comm_name, const derived_t *type, int count)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    size_t bytes = (size_t) count * (size_t) type->extent;
    unsigned char *mine = malloc(bytes), *expected = malloc(bytes), *theirs = malloc(bytes),
                  *got = malloc(bytes);
    type_t described = {type->type, type->name, type->extent, 0, 0, 0};
    op_t named = {type->op, type->op_name};

    memset(mine, 0xa5, bytes);
    memset(expected, 0xa5, bytes);
    memset(theirs, 0xa5, bytes);
    derived_input(type, 0, count, expected);
    for (int other = 1; other < size; other++) {
        derived_input(type, other, count, theirs);
        memcpy(got, expected, bytes);
        memcpy(expected, theirs, bytes);
        MPI_Reduce_local(got, expected, count, type->type, type->op);
    }
    derived_input(type, rank, count, mine);

    memset(got, 0xa5, bytes);
    MPI_Allreduce(mine, got, count, type->type, type->op, comm);
    check(same_derived(type, got, expected, count), "MPI_Allreduce", &described, &named, count,
          comm_name);
    memcpy(got, mine, bytes);
    MPI_Allreduce(MPI_IN_PLACE, got, count, type->type, type->op, comm);
    check(same_derived(type, got, expected, count), "MPI_Allreduce in place", &described,
          &named, count, comm_name);
    for (int root = 1; root < size; root += 2) {
        memset(got, 0xa5, bytes);
        MPI_Reduce(mine, got, count, type->type, type->op, root, comm);
        if (rank == root) {
            check(same_derived(type, got, expected, count), "MPI_Reduce", &described, &named,
                  count, comm_name);
        }
    }
    free(mine);
    free(expected);
    free(theirs);
    free(got);
}

/* A long MPI_Iallreduce on `comm` and a long MPI_Allreduce on `other` (its dup), started in
 * that order everywhere; even ranks run the blocking one before they wait for the first, odd
 * ranks after. Valid MPI: the even ranks' MPI_Allreduce must move the MPI_Iallreduce on, which
 * the odd ranks wait for before they join it. */
static void run_overlapped(MPI_Comm comm, MPI_Comm other, const char *comm_name)
{
    const int count = 30001;
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    long *first = malloc(count * sizeof(long)), *second = malloc(count * sizeof(long));
    long *got_first = malloc(count * sizeof(long)), *got_second = malloc(count * sizeof(long));
    for (int i = 0; i < count; i++) {
        first[i] = rank + i;
        second[i] = 2 * rank - i;
    }
    MPI_Request request;
    MPI_Iallreduce(first, got_first, count, MPI_LONG, MPI_SUM, comm, &request);
    if (0 == rank % 2) {
        MPI_Allreduce(second, got_second, count, MPI_LONG, MPI_SUM, other);
        MPI_Wait(&request, MPI_STATUS_IGNORE);
    } else {
        MPI_Wait(&request, MPI_STATUS_IGNORE);
        MPI_Allreduce(second, got_second, count, MPI_LONG, MPI_SUM, other);
    }
    long ranks = (long) size * (size - 1) / 2;
    int ok = 1;
    for (int i = 0; i < count; i++) {
        ok &= got_first[i] == ranks + (long) size * i;
        ok &= got_second[i] == 2 * ranks - (long) size * i;
    }
    type_t described = {MPI_LONG, "MPI_LONG", (int) sizeof(long), 0, 1, 0};
    op_t named = {MPI_SUM, "MPI_SUM"};
    check(ok, "MPI_Iallreduce around an MPI_Allreduce", &described, &named, count, comm_name);
    free(first);
    free(second);
    free(got_first);
    free(got_second);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 1;
    int long_only = argc > 2 && 0 == strcmp(argv[2], "long");
    int rank, total;
    MPI_Comm dup, split;
    type_t types[] = {
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
        {MPI_INTEGER, "MPI_INTEGER", 0, 0, 1, 0, 1},
        {MPI_REAL, "MPI_REAL", 0, 1, 1, 0, 1},
        {MPI_DOUBLE_PRECISION, "MPI_DOUBLE_PRECISION", 0, 1, 1, 0, 1},
#if OMPI_HAVE_FORTRAN_INTEGER8
        {MPI_INTEGER8, "MPI_INTEGER8", 0, 0, 1, 0, 1},
#endif
        {MPI_2INTEGER, "MPI_2INTEGER", 0, 0, 1, 1, 1},
        {MPI_C_BOOL, "MPI_C_BOOL", 1, 0, 0, 0, 0, 1},
        {MPI_LOGICAL, "MPI_LOGICAL", 0, 0, 0, 0, 1, 1},
    };
    const op_t ops[] = {
        {MPI_SUM, "MPI_SUM"},   {MPI_PROD, "MPI_PROD"},     {MPI_MIN, "MPI_MIN"},
        {MPI_MAX, "MPI_MAX"},   {MPI_LAND, "MPI_LAND"},     {MPI_LOR, "MPI_LOR"},
        {MPI_LXOR, "MPI_LXOR"}, {MPI_BAND, "MPI_BAND"},     {MPI_BOR, "MPI_BOR"},
        {MPI_BXOR, "MPI_BXOR"}, {MPI_MINLOC, "MPI_MINLOC"}, {MPI_MAXLOC, "MPI_MAXLOC"},
    };

    MPI_Init(&argc, &argv);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        if (types[t].fortran) {
            MPI_Type_size(types[t].type, &types[t].size);
        }
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &total);
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, total - rank, &split);
    MPI_Op composition, sum;
    MPI_Op_create(compose, 0, &composition);
    MPI_Op_create(wrapping_sum, 1, &sum);
    derived_t derived[3] = {
        {MPI_DATATYPE_NULL, "2 MPI_UINT64_T (contiguous)", MPI_OP_NULL, "a wrapping sum", 16, 2,
         {0, 8}},
        {MPI_DATATYPE_NULL, "2 MPI_UINT64_T a hole apart (vector)", MPI_OP_NULL, "a wrapping sum",
         24, 2, {0, 16}},
        {MPI_DATATYPE_NULL, "MPI_2INT 8 bytes into 16 (struct, resized)", MPI_OP_NULL,
         "composition", 16, 1, {8}},
    };
    MPI_Type_contiguous(2, MPI_UINT64_T, &derived[0].type);
    MPI_Op_create(pair_sum, 1, &derived[0].op);
    MPI_Type_vector(2, 1, 2, MPI_UINT64_T, &derived[1].type);
    MPI_Op_create(holed_sum, 1, &derived[1].op);
    {
        MPI_Datatype shifted;
        int one = 1;
        MPI_Aint at = 8;
        MPI_Datatype pair = MPI_2INT;
        MPI_Type_create_struct(1, &one, &at, &pair, &shifted);
        MPI_Type_create_resized(shifted, 0, 16, &derived[2].type);
        MPI_Type_free(&shifted);
    }
    MPI_Op_create(shifted_compose, 0, &derived[2].op);
    for (int d = 0; d < 3; d++) {
        MPI_Type_commit(&derived[d].type);
    }
    for (int round = 0; round < rounds; round++) {
        for (size_t t = 0; t < sizeof types / sizeof types[0] && !long_only; t++) {
            const type_t *type = &types[t];
            for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
                const op_t *op = &ops[o];
                int pairwise = MPI_MINLOC == op->op || MPI_MAXLOC == op->op;
                int bitwise = MPI_BAND == op->op || MPI_BOR == op->op || MPI_BXOR == op->op;
                int logical = MPI_LAND == op->op || MPI_LOR == op->op || MPI_LXOR == op->op;
                /* MPI's rules: what each operation is defined on. */
                if (pairwise != type->pair || (type->floating && (bitwise || logical)) ||
                    (MPI_BYTE == type->type && !bitwise) ||
                    (type->fortran && !type->boolean && logical) ||
                    (type->boolean && !logical)) {
                    continue;
                }
                /* Fortran kinds this program does not lay out: (INTEGER, INTEGER) of two
                 * 4-byte ones, else 4 or 8 bytes. */
                if (type->fortran && (type->pair ? 8 != type->size
                                                 : 4 != type->size && 8 != type->size)) {
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
        /* Long vectors: recursive doubling's sizes and Rabenseifner's (over 64 KiB), an odd
         * count, so that blocks split unevenly; MPI_DOUBLE_INT, whose C layout pads. */
        const int longs[][2] = {{6, 0}, {14, 0}, {6, 2}, {14, 3}, {15, 8}, {16, 10}, {18, 11}};
        for (size_t l = 0; l < sizeof longs / sizeof longs[0]; l++) {
            for (int count = 1001; count <= 40001; count += 39000) {
                run(MPI_COMM_WORLD, "MPI_COMM_WORLD", &types[longs[l][0]], &ops[longs[l][1]],
                    count);
                run(split, "a split of MPI_COMM_WORLD", &types[longs[l][0]], &ops[longs[l][1]],
                    count);
            }
        }
        for (int count = 1; count <= 20001; count += 10000) {
            run_user(MPI_COMM_WORLD, "MPI_COMM_WORLD", MPI_2INT, composition, "composition",
                     count);
            run_user(split, "a split of MPI_COMM_WORLD", MPI_2INT, composition, "composition",
                     count);
            run_user(MPI_COMM_WORLD, "MPI_COMM_WORLD", MPI_UINT64_T, sum, "a wrapping sum",
                     count);
            run_user(dup, "a dup of MPI_COMM_WORLD", MPI_UINT64_T, sum, "a wrapping sum", count);
        }
        run_overlapped(MPI_COMM_WORLD, dup, "MPI_COMM_WORLD and its dup");
        for (int d = 0; d < 3; d++) {
            for (int count = 1; count <= 40001; count += 20000) {
                run_derived(MPI_COMM_WORLD, "MPI_COMM_WORLD", &derived[d], count);
                run_derived(split, "a split of MPI_COMM_WORLD", &derived[d], count);
            }
        }
    }
    MPI_Op_free(&composition);
    MPI_Op_free(&sum);
    for (int d = 0; d < 3; d++) {
        MPI_Type_free(&derived[d].type);
        MPI_Op_free(&derived[d].op);
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
