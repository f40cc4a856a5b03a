/*
 * coll/nicbar: the reductions the NIC does not combine (longer than it carries, user operations,
 * derived types), over its messages: the library's allreduce (recursive doubling, Rabenseifner's
 * or the ring) with Open MPI's operation combining, MPI_Allreduce and MPI_Reduce waiting for it,
 * MPI_Iallreduce and MPI_Ireduce running it in the background, every wait on the endpoint and
 * the progress function moving it on.
 */
#include "coll_nicbar.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "ompi/datatype/ompi_datatype.h"

#define C mca_coll_nicbar_component

/* What the library's allreduce calls to combine: Open MPI's operation on `count` elements,
 * through MPI_Reduce_local (the operation's own code, user-defined ones too; Open MPI's internal
 * op header needs Fortran headers its development package does not ship). The library sees
 * element `i` at `i * extent` from the buffer's start, where MPI sees it at `true_lb` past its
 * typed base: the base is `true_lb` before what the library hands over. */
typedef struct {
    struct ompi_op_t *op;
    struct ompi_datatype_t *dtype;
    ptrdiff_t extent;
    ptrdiff_t true_lb;
} combine_t;

static void combine(const void *source, void *target, size_t count, void *argument)
{
    combine_t *with = argument;
    const char *from = (const char *) source - with->true_lb;
    char *to = (char *) target - with->true_lb;
    while (count > 0) {
        int part = count > INT_MAX ? INT_MAX : (int) count;
        MPI_Reduce_local(from, to, part, with->dtype, with->op);
        from += (size_t) part * (size_t) with->extent;
        to += (size_t) part * (size_t) with->extent;
        count -= (size_t) part;
    }
}

/* How `count` elements of `dtype` lie for the library, which splits a vector between any two
 * elements: each element's bytes within a slot of `extent` bytes, the slots side by side. */
typedef struct {
    ptrdiff_t extent;
    ptrdiff_t true_lb;
    /* Every byte of the slots is data, from the typed base on (the predefined types but the
     * padded pairs, contiguous derived ones): the library works in the user's buffer. Else a
     * copy of the data packed into slots, holes and all, keeps the user's holes untouched. */
    int dense;
} layout_t;

static int layout(struct ompi_datatype_t *dtype, layout_t *out)
{
    size_t size = 0;
    ptrdiff_t lb = 0, extent = 0, true_lb = 0, true_extent = 0;
    ompi_datatype_type_size(dtype, &size);
    ompi_datatype_get_extent(dtype, &lb, &extent);
    ompi_datatype_get_true_extent(dtype, &true_lb, &true_extent);
    /* An element's data within its extent, so that slots never overlap (a type resized below
     * its data, or of negative extent, is not). */
    if (0 == size || extent <= 0 || true_extent > extent) {
        return 0;
    }
    out->extent = extent;
    out->true_lb = true_lb;
    out->dense = (ptrdiff_t) size == extent && 0 == true_lb;
    return 1;
}

/* Whether a reduction of `count` elements of `dtype` that the NIC does not combine goes over
 * the NIC's messages: any type whose elements do not overlap, predefined or derived (MPI takes
 * derived ones under user operations), the rest to the component below. Depends only on what
 * MPI makes the same on every rank. */
int mca_coll_nicbar_reduce_by_messages(int count, struct ompi_datatype_t *dtype)
{
    layout_t unused;
    return C.allreduce_algorithm >= 0 && count > 0 && layout(dtype, &unused);
}

/* MPI_Allreduce (root < 0) or MPI_Reduce to `root` over the NIC's messages: the allreduce runs
 * in the result buffer, or in a scratch one (a reduce's other ranks; types with holes), every
 * rank getting the same bits; a reduce's root keeps them. */
int mca_coll_nicbar_reduce_messages(const void *sbuf, void *rbuf, int count,
                                    struct ompi_datatype_t *dtype, struct ompi_op_t *op,
                                    struct ompi_communicator_t *comm,
                                    mca_coll_nicbar_module_t *self, int root)
{
    layout_t lay;
    nicbar_coll_op call;
    int state, commutative = 0, keeps = root < 0 || ompi_comm_rank(comm) == root;
    const char *operation = root < 0 ? "MPI_Allreduce" : "MPI_Reduce";
    const void *input = MPI_IN_PLACE == sbuf ? rbuf : sbuf;
    char *slots = rbuf;

    if (!layout(dtype, &lay)) {
        return MPI_ERR_TYPE;
    }
    size_t length = (size_t) lay.extent * (size_t) count;
    combine_t with = {op, dtype, lay.extent, lay.true_lb};
    MPI_Op_commutative(op, &commutative);
    if (!keeps || !lay.dense) {
        /* calloc: a type's holes go to the other ranks, zeros rather than this heap's bytes. */
        slots = calloc(1, length);
        if (NULL == slots) {
            return MPI_ERR_NO_MEM;
        }
    }
    if (lay.dense) {
        if (input != slots) {
            memcpy(slots, input, length);
        }
    } else {
        ompi_datatype_copy_content_same_ddt(dtype, (size_t) count, slots - lay.true_lb,
                                            (char *) input);
    }
    mca_coll_nicbar_op_init(&call, self, comm, C.allreduce_algorithm);
    pthread_mutex_lock(&C.lock);
    state = nicbar_coll_allreduce(C.endpoint, self->group, &call, slots, length,
                                  (size_t) lay.extent, combine, &with, commutative);
    pthread_mutex_unlock(&C.lock);
    if (keeps && !lay.dense && NICBAR_COLL_COMPLETED == state) {
        ompi_datatype_copy_content_same_ddt(dtype, (size_t) count, rbuf, slots - lay.true_lb);
    }
    if (slots != rbuf) {
        free(slots);
    }
    return mca_coll_nicbar_outcome(state, &call, comm, operation);
}

/* A non-blocking reduction over messages under way: what its end needs. */
struct mca_coll_nicbar_ireduce_t {
    combine_t with; /* the operation and type retained until the end */
    layout_t lay;
    int count;
    size_t length;
    void *rbuf;  /* where the result goes (NULL: dropped, a non-root of MPI_Ireduce) */
    char *slots; /* a type with holes: the result in slots, before its data goes to rbuf */
    nicbar_coll_op call;
};

static void ireduce_free(mca_coll_nicbar_ireduce_t *state)
{
    OBJ_RELEASE(state->with.dtype);
    OBJ_RELEASE(state->with.op);
    free(state->slots);
    free(state);
}

/* MPI_Iallreduce (root < 0) or MPI_Ireduce to `root` over the NIC's messages: the library copies
 * the input (packed into slots first for a type with holes) and runs the allreduce in the
 * background; the request's end takes the result. The operation and type are retained, as MPI
 * lets the program free them once the call returns. */
int mca_coll_nicbar_ireduce_messages(const void *sbuf, void *rbuf, int count,
                                     struct ompi_datatype_t *dtype, struct ompi_op_t *op,
                                     struct ompi_communicator_t *comm,
                                     mca_coll_nicbar_module_t *self, int root,
                                     ompi_request_t **out)
{
    int commutative = 0, keeps = root < 0 || ompi_comm_rank(comm) == root;
    const char *operation = root < 0 ? "MPI_Iallreduce" : "MPI_Ireduce";
    const void *input = MPI_IN_PLACE == sbuf ? rbuf : sbuf;
    mca_coll_nicbar_ireduce_t *state = calloc(1, sizeof *state);
    mca_coll_nicbar_request_t *request = mca_coll_nicbar_request_new(comm, operation);

    if (NULL == state || NULL == request || !layout(dtype, &state->lay)) {
        int rc = NULL == state || NULL == request ? MPI_ERR_NO_MEM : MPI_ERR_TYPE;
        free(state);
        if (NULL != request) {
            OBJ_RELEASE(request);
        }
        return rc;
    }
    state->count = count;
    state->length = (size_t) state->lay.extent * (size_t) count;
    state->with = (combine_t){op, dtype, state->lay.extent, state->lay.true_lb};
    state->rbuf = keeps ? rbuf : NULL;
    OBJ_RETAIN(dtype);
    OBJ_RETAIN(op);
    if (!state->lay.dense) {
        state->slots = calloc(1, state->length);
        if (NULL == state->slots) {
            ireduce_free(state);
            OBJ_RELEASE(request);
            return MPI_ERR_NO_MEM;
        }
        ompi_datatype_copy_content_same_ddt(dtype, (size_t) count,
                                            state->slots - state->lay.true_lb, (char *) input);
        input = state->slots;
    }
    MPI_Op_commutative(op, &commutative);
    mca_coll_nicbar_op_init(&state->call, self, comm, C.allreduce_algorithm);
    pthread_mutex_lock(&C.lock);
    request->ticket = nicbar_coll_iallreduce(C.endpoint, self->group, &state->call, input,
                                             state->length, (size_t) state->lay.extent,
                                             combine, &state->with, commutative);
    if (0 == request->ticket) {
        pthread_mutex_unlock(&C.lock);
        /* Refused (a failure would name a rank): as the blocking forms report either. */
        int refused = state->call.failed_rank < 0 ? NICBAR_COLL_UNKNOWN : NICBAR_COLL_FAILED;
        int rc = mca_coll_nicbar_outcome(refused, &state->call, comm, operation);
        ireduce_free(state);
        OBJ_RELEASE(request);
        return rc;
    }
    request->messages = state;
    return mca_coll_nicbar_post(comm, request, out);
}

/* Whether `request`'s reduction over messages has ended (1, its MPI code in `*code`, the result
 * in place and its state freed) or not yet (0). C.lock held. */
int mca_coll_nicbar_ireduce_messages_end(mca_coll_nicbar_request_t *request, int *code)
{
    mca_coll_nicbar_ireduce_t *state = request->messages;
    void *result = NULL != state->slots ? (void *) state->slots : state->rbuf;
    if (NULL == state->rbuf) {
        result = NULL;
    }
    int ended = nicbar_coll_iallreduce_test(C.endpoint, request->ticket, result, state->length,
                                            &state->call);
    if (NICBAR_COLL_PENDING == ended) {
        return 0;
    }
    if (NICBAR_COLL_COMPLETED == ended && NULL != state->slots && NULL != state->rbuf) {
        ompi_datatype_copy_content_same_ddt(state->with.dtype, (size_t) state->count, state->rbuf,
                                            state->slots - state->lay.true_lb);
    }
    *code = mca_coll_nicbar_outcome(ended, &state->call, request->super.req_mpi_object.comm,
                                    request->operation);
    ireduce_free(state);
    request->messages = NULL;
    return 1;
}
