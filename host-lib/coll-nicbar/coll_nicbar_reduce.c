/*
 * coll/nicbar: MPI_Allreduce, MPI_Reduce, MPI_Iallreduce and MPI_Ireduce, and the persistent
 * MPIX_Allreduce_init and MPIX_Reduce_init. A predefined operation
 * on a predefined type, up to NICBAR_NIC_REDUCE_MAX bytes, combines in the NIC: a barrier whose
 * packets carry the values, recursive doubling in a fixed order, so every rank gets the same bits
 * in every run (docs/mpi.md). Longer vectors, user operations and derived types run over the
 * NIC's messages (coll_nicbar_reduce_messages.c: recursive doubling, Rabenseifner's or the
 * ring, Open MPI's operation combining), the non-blocking forms in the background. Every rank
 * chooses alike: the choice depends only on the operation, the type and the count, which MPI
 * makes the same on every rank.
 *
 * MPI_Reduce is an allreduce whose result only the root keeps: in the NIC, a reduction to one
 * rank costs what the reduction to all costs.
 */
#include "coll_nicbar.h"

#include <string.h>

#include "ompi/datatype/ompi_datatype.h"


#define C mca_coll_nicbar_component

/* Reductions combined in the NIC by this process. Guarded by C.lock. */
static uint64_t reductions;

uint64_t mca_coll_nicbar_reductions(void)
{
    return reductions;
}

/* One more reduction combined in the NIC (C.lock held). */
void mca_coll_nicbar_count_reduction(void)
{
    reductions++;
}

/* The NIC's operation for `op`, or 0 for one it does not have (user operations, MPI_REPLACE). */
static int32_t nic_op(struct ompi_op_t *op)
{
    const struct {
        MPI_Op op;
        int32_t nic;
    } ops[] = {
        {MPI_SUM, NICBAR_REDUCE_SUM},       {MPI_PROD, NICBAR_REDUCE_PROD},
        {MPI_MIN, NICBAR_REDUCE_MIN},       {MPI_MAX, NICBAR_REDUCE_MAX},
        {MPI_LAND, NICBAR_REDUCE_LAND},     {MPI_LOR, NICBAR_REDUCE_LOR},
        {MPI_LXOR, NICBAR_REDUCE_LXOR},     {MPI_BAND, NICBAR_REDUCE_BAND},
        {MPI_BOR, NICBAR_REDUCE_BOR},       {MPI_BXOR, NICBAR_REDUCE_BXOR},
        {MPI_MINLOC, NICBAR_REDUCE_MINLOC}, {MPI_MAXLOC, NICBAR_REDUCE_MAXLOC},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        if (ops[i].op == op) {
            return ops[i].nic;
        }
    }
    return 0;
}

/* One MPI type the NIC combines: its element type there, and the bytes of one MPI element. */
typedef struct {
    int32_t type;
    size_t size;
} nic_type_t;

/*
 * The NIC's element type for one of Fortran's types (0 if none): INTEGER, INTEGER4 and INTEGER8
 * as the integers of their size, REAL, REAL4, REAL8 and DOUBLE PRECISION as `float` or `double`
 * by theirs (the Fortran compiler's kinds: Open MPI says how long they are), and MPI_2INTEGER of
 * two 4-byte INTEGERs as the NIC's (value, index) pairs for MINLOC and MAXLOC. MPI's logical
 * operations are defined on Fortran's LOGICAL, not its INTEGER: LOGICAL takes them as the
 * integer of its size, whose logical operations give 1 or 0 as Open MPI's own do (C's `&&`,
 * `||` and `!=` on the values), and INTEGER leaves them to the component below.
 */
static nic_type_t fortran_type(struct ompi_datatype_t *dtype, int32_t op)
{
    nic_type_t none = {0, 0};
    int logical = NICBAR_REDUCE_LAND == op || NICBAR_REDUCE_LOR == op || NICBAR_REDUCE_LXOR == op;
    if (MPI_LOGICAL == dtype) {
        size_t size = 0;
        ompi_datatype_type_size(dtype, &size);
        if (!logical || (4 != size && 8 != size)) {
            return none;
        }
        return (nic_type_t){4 == size ? NICBAR_REDUCE_INT32 : NICBAR_REDUCE_INT64, size};
    }
    int pair = MPI_2INTEGER == dtype;
    int integer = MPI_INTEGER == dtype;
#if OMPI_HAVE_FORTRAN_INTEGER4
    integer = integer || MPI_INTEGER4 == dtype;
#endif
#if OMPI_HAVE_FORTRAN_INTEGER8
    integer = integer || MPI_INTEGER8 == dtype;
#endif
    int real = MPI_REAL == dtype || MPI_DOUBLE_PRECISION == dtype;
#if OMPI_HAVE_FORTRAN_REAL4
    real = real || MPI_REAL4 == dtype;
#endif
#if OMPI_HAVE_FORTRAN_REAL8
    real = real || MPI_REAL8 == dtype;
#endif
    if (!pair && !integer && !real) {
        return none;
    }
    size_t size = 0;
    ompi_datatype_type_size(dtype, &size);
    int pairwise = NICBAR_REDUCE_MINLOC == op || NICBAR_REDUCE_MAXLOC == op;
    int bitwise = NICBAR_REDUCE_BAND == op || NICBAR_REDUCE_BOR == op || NICBAR_REDUCE_BXOR == op;
    if (pairwise) {
        return pair && 8 == size ? (nic_type_t){NICBAR_REDUCE_INT32, 8} : none;
    }
    if (4 != size && 8 != size) {
        return none;
    }
    if (integer && !logical) {
        return (nic_type_t){4 == size ? NICBAR_REDUCE_INT32 : NICBAR_REDUCE_INT64, size};
    }
    if (real && !bitwise && !logical) {
        return (nic_type_t){4 == size ? NICBAR_REDUCE_FLOAT : NICBAR_REDUCE_DOUBLE, size};
    }
    return none;
}

/*
 * The NIC's element type for `dtype` under `op` (0 if none): the integer and floating-point
 * types for the arithmetic and comparing operations, integers and C's bool for the logical
 * ones, integers and MPI_BYTE for the bitwise ones (MPI's rules), and for MINLOC and MAXLOC the
 * pair types laid out as the NIC's packed (value, int) pairs: MPI_2INT and MPI_FLOAT_INT
 * (MPI_DOUBLE_INT, MPI_LONG_INT and MPI_SHORT_INT have padding in C); and Fortran's types
 * (fortran_type).
 */
static nic_type_t nic_type(struct ompi_datatype_t *dtype, int32_t op)
{
    const struct {
        MPI_Datatype dtype;
        int32_t type;
        size_t size;
    } integers[] = {
        {MPI_SIGNED_CHAR, NICBAR_REDUCE_INT8, 1},
        {MPI_INT8_T, NICBAR_REDUCE_INT8, 1},
        {MPI_UNSIGNED_CHAR, NICBAR_REDUCE_UINT8, 1},
        {MPI_UINT8_T, NICBAR_REDUCE_UINT8, 1},
        {MPI_SHORT, NICBAR_REDUCE_INT16, sizeof(short)},
        {MPI_INT16_T, NICBAR_REDUCE_INT16, 2},
        {MPI_UNSIGNED_SHORT, NICBAR_REDUCE_UINT16, sizeof(unsigned short)},
        {MPI_UINT16_T, NICBAR_REDUCE_UINT16, 2},
        {MPI_INT, NICBAR_REDUCE_INT32, sizeof(int)},
        {MPI_INT32_T, NICBAR_REDUCE_INT32, 4},
        {MPI_UNSIGNED, NICBAR_REDUCE_UINT32, sizeof(unsigned)},
        {MPI_UINT32_T, NICBAR_REDUCE_UINT32, 4},
        {MPI_LONG, 8 == sizeof(long) ? NICBAR_REDUCE_INT64 : NICBAR_REDUCE_INT32, sizeof(long)},
        {MPI_LONG_LONG_INT, NICBAR_REDUCE_INT64, sizeof(long long)},
        {MPI_INT64_T, NICBAR_REDUCE_INT64, 8},
        {MPI_UNSIGNED_LONG, 8 == sizeof(unsigned long) ? NICBAR_REDUCE_UINT64
                                                       : NICBAR_REDUCE_UINT32,
         sizeof(unsigned long)},
        {MPI_UNSIGNED_LONG_LONG, NICBAR_REDUCE_UINT64, sizeof(unsigned long long)},
        {MPI_UINT64_T, NICBAR_REDUCE_UINT64, 8},
    };
    nic_type_t none = {0, 0};
    if (NICBAR_REDUCE_MINLOC == op || NICBAR_REDUCE_MAXLOC == op) {
        if (MPI_2INT == dtype && 4 == sizeof(int)) {
            return (nic_type_t){NICBAR_REDUCE_INT32, 8};
        }
        if (MPI_FLOAT_INT == dtype && 4 == sizeof(int) && 4 == sizeof(float)) {
            return (nic_type_t){NICBAR_REDUCE_FLOAT, 8};
        }
        return fortran_type(dtype, op);
    }
    int bitwise = NICBAR_REDUCE_BAND == op || NICBAR_REDUCE_BOR == op || NICBAR_REDUCE_BXOR == op;
    int logical = NICBAR_REDUCE_LAND == op || NICBAR_REDUCE_LOR == op || NICBAR_REDUCE_LXOR == op;
    for (size_t i = 0; i < sizeof integers / sizeof integers[0]; i++) {
        if (integers[i].dtype == dtype) {
            return (nic_type_t){integers[i].type, integers[i].size};
        }
    }
    if (MPI_BYTE == dtype) {
        return bitwise ? (nic_type_t){NICBAR_REDUCE_UINT8, 1} : none;
    }
    if (MPI_C_BOOL == dtype) {
        /* C's bool takes the logical operations alone, as 1 or 0 (Open MPI's own alike). */
        return logical && 1 == sizeof(_Bool) ? (nic_type_t){NICBAR_REDUCE_UINT8, 1} : none;
    }
    if (bitwise || logical) {
        return fortran_type(dtype, op);
    }
    if (MPI_FLOAT == dtype && 4 == sizeof(float)) {
        return (nic_type_t){NICBAR_REDUCE_FLOAT, 4};
    }
    if (MPI_DOUBLE == dtype && 8 == sizeof(double)) {
        return (nic_type_t){NICBAR_REDUCE_DOUBLE, 8};
    }
    return fortran_type(dtype, op);
}

/* What the NIC combines for one call: its operation, type and bytes; `length` 0 if it cannot. */
typedef struct {
    int32_t op;
    int32_t type;
    size_t length;
} nic_reduction_t;

static nic_reduction_t nic_reduction(int count, struct ompi_datatype_t *dtype,
                                     struct ompi_op_t *op)
{
    nic_reduction_t none = {0, 0, 0};
    int32_t nop = nic_op(op);
    if (0 == nop || count <= 0) {
        return none;
    }
    nic_type_t type = nic_type(dtype, nop);
    if (0 == type.type || (size_t) count > NICBAR_NIC_REDUCE_MAX / type.size) {
        return none;
    }
    int floating = NICBAR_REDUCE_FLOAT == type.type || NICBAR_REDUCE_DOUBLE == type.type;
    if (C.reproducible_sum && NICBAR_REDUCE_SUM == nop && floating && 1 == count) {
        /* One value: what the NIC's reproducible sum takes (its accumulator fills the 32
         * bytes a reduction carries). */
        nop = NICBAR_REDUCE_SUM_REPRODUCIBLE;
    }
    return (nic_reduction_t){nop, type.type, (size_t) count * type.size};
}

/* Starts `reduction` of `data` in the NIC under C.lock; returns its ticket (0: not started). */
static uint64_t start(mca_coll_nicbar_module_t *self, nic_reduction_t reduction, const void *data)
{
    uint64_t ticket = nicbar_coll_allreduce_start(C.endpoint, self->group, reduction.op,
                                                  reduction.type, data, reduction.length);
    if (0 != ticket) {
        reductions++;
    }
    return ticket;
}

/* Runs `reduction` of `data` in the NIC and, if `result` is not NULL, writes its result there. */
static int reduce_in_nic(struct ompi_communicator_t *comm, mca_coll_nicbar_module_t *self,
                         nic_reduction_t reduction, const void *data, void *result,
                         const char *operation)
{
    unsigned char value[NICBAR_NIC_REDUCE_MAX];
    uint64_t ticket;
    int rc;

    pthread_mutex_lock(&C.lock);
    ticket = start(self, reduction, data);
    pthread_mutex_unlock(&C.lock);
    rc = mca_coll_nicbar_wait(comm, ticket, operation);
    if (MPI_SUCCESS != rc) {
        return rc;
    }
    pthread_mutex_lock(&C.lock);
    int64_t got = nicbar_coll_allreduce_result(C.endpoint, ticket, value, sizeof value);
    pthread_mutex_unlock(&C.lock);
    if (got != (int64_t) reduction.length) {
        return MPI_ERR_INTERN;
    }
    if (NULL != result) {
        memcpy(result, value, reduction.length);
    }
    return MPI_SUCCESS;
}

int mca_coll_nicbar_allreduce(const void *sbuf, void *rbuf, int count,
                              struct ompi_datatype_t *dtype, struct ompi_op_t *op,
                              struct ompi_communicator_t *comm, mca_coll_base_module_t *module)
{
    mca_coll_nicbar_module_t *self = (mca_coll_nicbar_module_t *) module;
    nic_reduction_t reduction = nic_reduction(count, dtype, op);
    if (0 == reduction.length) {
        if (mca_coll_nicbar_reduce_by_messages(count, dtype)) {
            return mca_coll_nicbar_reduce_messages(sbuf, rbuf, count, dtype, op, comm, self, -1);
        }
        return self->previous.allreduce(sbuf, rbuf, count, dtype, op, comm,
                                        self->previous.allreduce_module);
    }
    const void *data = MPI_IN_PLACE == sbuf ? rbuf : sbuf;
    return reduce_in_nic(comm, self, reduction, data, rbuf, "MPI_Allreduce");
}

int mca_coll_nicbar_reduce(const void *sbuf, void *rbuf, int count, struct ompi_datatype_t *dtype,
                           struct ompi_op_t *op, int root, struct ompi_communicator_t *comm,
                           mca_coll_base_module_t *module)
{
    mca_coll_nicbar_module_t *self = (mca_coll_nicbar_module_t *) module;
    nic_reduction_t reduction = nic_reduction(count, dtype, op);
    if (0 == reduction.length) {
        if (mca_coll_nicbar_reduce_by_messages(count, dtype)) {
            return mca_coll_nicbar_reduce_messages(sbuf, rbuf, count, dtype, op, comm, self,
                                                   root);
        }
        return self->previous.reduce(sbuf, rbuf, count, dtype, op, root, comm,
                                     self->previous.reduce_module);
    }
    int is_root = ompi_comm_rank(comm) == root;
    const void *data = is_root && MPI_IN_PLACE == sbuf ? rbuf : sbuf;
    return reduce_in_nic(comm, self, reduction, data, is_root ? rbuf : NULL, "MPI_Reduce");
}

/* The non-blocking forms: the progress function takes the result and completes the request. */
static int ireduce_in_nic(struct ompi_communicator_t *comm, mca_coll_nicbar_module_t *self,
                          nic_reduction_t reduction, const void *data, void *result,
                          const char *operation, ompi_request_t **out)
{
    mca_coll_nicbar_request_t *request = mca_coll_nicbar_request_new(comm, operation);
    if (NULL == request) {
        return MPI_ERR_NO_MEM;
    }
    request->reduction = 1;
    request->result = result;
    request->result_length = reduction.length;
    pthread_mutex_lock(&C.lock);
    request->ticket = start(self, reduction, data);
    return mca_coll_nicbar_post(comm, request, out);
}

int mca_coll_nicbar_iallreduce(const void *sbuf, void *rbuf, int count,
                               struct ompi_datatype_t *dtype, struct ompi_op_t *op,
                               struct ompi_communicator_t *comm, ompi_request_t **request,
                               mca_coll_base_module_t *module)
{
    mca_coll_nicbar_module_t *self = (mca_coll_nicbar_module_t *) module;
    nic_reduction_t reduction = nic_reduction(count, dtype, op);
    if (0 == reduction.length) {
        if (mca_coll_nicbar_reduce_by_messages(count, dtype)) {
            return mca_coll_nicbar_ireduce_messages(sbuf, rbuf, count, dtype, op, comm, self, -1,
                                                    request);
        }
        return self->previous.iallreduce(sbuf, rbuf, count, dtype, op, comm, request,
                                         self->previous.iallreduce_module);
    }
    const void *data = MPI_IN_PLACE == sbuf ? rbuf : sbuf;
    return ireduce_in_nic(comm, self, reduction, data, rbuf, "MPI_Iallreduce", request);
}

int mca_coll_nicbar_ireduce(const void *sbuf, void *rbuf, int count,
                            struct ompi_datatype_t *dtype, struct ompi_op_t *op, int root,
                            struct ompi_communicator_t *comm, ompi_request_t **request,
                            mca_coll_base_module_t *module)
{
    mca_coll_nicbar_module_t *self = (mca_coll_nicbar_module_t *) module;
    nic_reduction_t reduction = nic_reduction(count, dtype, op);
    if (0 == reduction.length) {
        if (mca_coll_nicbar_reduce_by_messages(count, dtype)) {
            return mca_coll_nicbar_ireduce_messages(sbuf, rbuf, count, dtype, op, comm, self,
                                                    root, request);
        }
        return self->previous.ireduce(sbuf, rbuf, count, dtype, op, root, comm, request,
                                      self->previous.ireduce_module);
    }
    int is_root = ompi_comm_rank(comm) == root;
    const void *data = is_root && MPI_IN_PLACE == sbuf ? rbuf : sbuf;
    return ireduce_in_nic(comm, self, reduction, data, is_root ? rbuf : NULL, "MPI_Ireduce",
                          request);
}

/*
 * The persistent forms: the reduction compiled once for this rank (its operation, type and
 * length fixed), each MPI_Start one send token with the input read from the buffer then; the
 * rest, as the blocking forms, to the component below.
 */
static int init_in_nic(struct ompi_communicator_t *comm, mca_coll_nicbar_module_t *self,
                       nic_reduction_t reduction, const void *data, void *result,
                       const char *operation, ompi_request_t **out)
{
    char error[MPI_MAX_ERROR_STRING] = "";
    nicbar_coll_persistent *persistent;

    pthread_mutex_lock(&C.lock);
    persistent = nicbar_coll_allreduce_init(C.endpoint, self->group, reduction.op, reduction.type,
                                            reduction.length, error, sizeof error);
    pthread_mutex_unlock(&C.lock);
    if (NULL == persistent) {
        return mca_coll_nicbar_failure_code(comm, operation, -1, error);
    }
    return mca_coll_nicbar_persistent_new(comm, operation, persistent, data, result,
                                          reduction.length, out);
}

/* A persistent reduction the NIC does not combine, and the component below has no persistent
 * form of: said, as an error of the component's class. */
static int no_persistent_form(struct ompi_communicator_t *comm, const char *operation)
{
    return mca_coll_nicbar_failure_code(
        comm, operation, -1,
        "the NIC combines up to 32 bytes of the predefined operations and types only, and no "
        "component below offers this persistent reduction");
}

int mca_coll_nicbar_allreduce_init(const void *sbuf, void *rbuf, int count,
                                   struct ompi_datatype_t *dtype, struct ompi_op_t *op,
                                   struct ompi_communicator_t *comm, struct ompi_info_t *info,
                                   ompi_request_t **request, mca_coll_base_module_t *module)
{
    mca_coll_nicbar_module_t *self = (mca_coll_nicbar_module_t *) module;
    nic_reduction_t reduction = nic_reduction(count, dtype, op);
    if (0 == reduction.length) {
        if (NULL == self->previous.allreduce_init) {
            return no_persistent_form(comm, "MPIX_Allreduce_init");
        }
        return self->previous.allreduce_init(sbuf, rbuf, count, dtype, op, comm, info, request,
                                             self->previous.allreduce_init_module);
    }
    const void *data = MPI_IN_PLACE == sbuf ? rbuf : sbuf;
    return init_in_nic(comm, self, reduction, data, rbuf, "MPIX_Allreduce_init", request);
}

int mca_coll_nicbar_reduce_init(const void *sbuf, void *rbuf, int count,
                                struct ompi_datatype_t *dtype, struct ompi_op_t *op, int root,
                                struct ompi_communicator_t *comm, struct ompi_info_t *info,
                                ompi_request_t **request, mca_coll_base_module_t *module)
{
    mca_coll_nicbar_module_t *self = (mca_coll_nicbar_module_t *) module;
    nic_reduction_t reduction = nic_reduction(count, dtype, op);
    if (0 == reduction.length) {
        if (NULL == self->previous.reduce_init) {
            return no_persistent_form(comm, "MPIX_Reduce_init");
        }
        return self->previous.reduce_init(sbuf, rbuf, count, dtype, op, root, comm, info,
                                          request, self->previous.reduce_init_module);
    }
    int is_root = ompi_comm_rank(comm) == root;
    const void *data = is_root && MPI_IN_PLACE == sbuf ? rbuf : sbuf;
    return init_in_nic(comm, self, reduction, data, is_root ? rbuf : NULL, "MPIX_Reduce_init",
                       request);
}
