/*
 * coll/nicbar: the data collectives (CollGM's MPI_Bcast, MPI_Scatter[v], MPI_Gather[v],
 * MPI_Alltoall[v]). The component's part is MPI's datatypes: each buffer becomes contiguous
 * bytes (in place when the datatype's layout is contiguous, else packed with Open MPI's
 * convertor), the library moves the bytes between the ranks (nicbar_coll_bcast() and its
 * siblings: algorithms, segmentation, reliable transfers), and packed receives are unpacked.
 * MPI_Allreduce and MPI_Reduce of what the NIC does not combine go here too, on predefined
 * types: the library runs the algorithm over messages and calls back Open MPI's own operation
 * (user-defined ones included) to combine. A collective switched off by its MCA parameter (-1)
 * goes to the component below.
 */
#include "coll_nicbar.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opal/datatype/opal_convertor.h"
#include "opal/runtime/opal_progress.h"
#include "ompi/datatype/ompi_datatype.h"

#define C mca_coll_nicbar_component

/* `count` elements of `dtype` at `user` as contiguous bytes: `bytes` is the user's memory when
 * the layout is contiguous, else `scratch` (packed from the user's data for a send or a preload,
 * unpacked into it after a receive). */
typedef struct {
    void *bytes;
    size_t length;
    void *scratch;
    void *user;
    size_t count;
    ompi_datatype_t *dtype;
} view_t;

static const view_t empty_view = {NULL, 0, NULL, NULL, 0, NULL};

/* Where a view of no bytes points: never NULL, which the library reads as MPI_IN_PLACE (a rank
 * may pass NULL with a count of 0). */
static char no_bytes[1];

/* Packs `view`'s user data into its scratch. */
static int pack(view_t *view)
{
    opal_convertor_t convertor;
    struct iovec iov = {.iov_base = view->scratch, .iov_len = view->length};
    uint32_t iov_count = 1;
    size_t max_data = view->length;
    int rc;
    OBJ_CONSTRUCT(&convertor, opal_convertor_t);
    rc = opal_convertor_copy_and_prepare_for_send(ompi_mpi_local_convertor, &view->dtype->super,
                                                  view->count, view->user, 0, &convertor);
    if (OPAL_SUCCESS == rc) {
        rc = opal_convertor_pack(&convertor, &iov, &iov_count, &max_data) < 0 ? OMPI_ERROR
                                                                              : OMPI_SUCCESS;
    }
    OBJ_DESTRUCT(&convertor);
    return OPAL_SUCCESS == rc && max_data == view->length ? MPI_SUCCESS : MPI_ERR_TYPE;
}

/* Unpacks `view`'s scratch into its user data. */
static int unpack(view_t *view)
{
    opal_convertor_t convertor;
    struct iovec iov = {.iov_base = view->scratch, .iov_len = view->length};
    uint32_t iov_count = 1;
    size_t max_data = view->length;
    int rc;
    OBJ_CONSTRUCT(&convertor, opal_convertor_t);
    rc = opal_convertor_copy_and_prepare_for_recv(ompi_mpi_local_convertor, &view->dtype->super,
                                                  view->count, view->user, 0, &convertor);
    if (OPAL_SUCCESS == rc) {
        rc = opal_convertor_unpack(&convertor, &iov, &iov_count, &max_data) < 0 ? OMPI_ERROR
                                                                                : OMPI_SUCCESS;
    }
    OBJ_DESTRUCT(&convertor);
    return OPAL_SUCCESS == rc && max_data == view->length ? MPI_SUCCESS : MPI_ERR_TYPE;
}

enum { VIEW_RECEIVE = 0, VIEW_SEND = 1, VIEW_PRELOAD = 2, VIEW_COPY = 4 };

/* Makes `view` of `count` elements of `dtype` at `user`. VIEW_SEND or VIEW_PRELOAD: its bytes
 * hold the user's data; VIEW_COPY: always in scratch (when the user's memory is written during
 * the call). */
static int view_make(view_t *view, const void *user, size_t count, ompi_datatype_t *dtype,
                     int flags)
{
    size_t size = 0;
    ptrdiff_t true_lb = 0, true_extent = 0;
    *view = empty_view;
    view->user = (void *) user;
    view->count = count;
    view->dtype = dtype;
    ompi_datatype_type_size(dtype, &size);
    view->length = size * count;
    if (0 == view->length) {
        view->bytes = no_bytes;
        return MPI_SUCCESS;
    }
    if (!(flags & VIEW_COPY) && ompi_datatype_is_contiguous_memory_layout(dtype, count)) {
        ompi_datatype_get_true_extent(dtype, &true_lb, &true_extent);
        view->bytes = (char *) user + true_lb;
        return MPI_SUCCESS;
    }
    view->scratch = malloc(view->length);
    if (NULL == view->scratch) {
        return MPI_ERR_NO_MEM;
    }
    view->bytes = view->scratch;
    if (flags & (VIEW_SEND | VIEW_PRELOAD)) {
        return pack(view);
    }
    return MPI_SUCCESS;
}

/* After a receive: unpacks a packed view (unless `failed`), and frees its scratch. */
static int view_finish(view_t *view, int receive, int failed)
{
    int rc = MPI_SUCCESS;
    if (NULL != view->scratch && receive && !failed) {
        rc = unpack(view);
    }
    free(view->scratch);
    view->scratch = NULL;
    return rc;
}

/* The work a collective runs while it waits: Open MPI's progress (the component's own lock is
 * held, so its progress function steps aside), then the core to the NIC where it has none. */
static void idle(void *argument)
{
    (void) argument;
    opal_progress();
    mca_coll_nicbar_idle_yield();
}

void mca_coll_nicbar_op_init(nicbar_coll_op *op, mca_coll_nicbar_module_t *self,
                             struct ompi_communicator_t *comm, int algorithm)
{
    memset(op, 0, sizeof *op);
    op->context = (uint32_t) comm->c_contextid;
    op->sequence = ++self->sequence;
    op->algorithm = algorithm < 0 ? 0 : algorithm;
    op->segment = C.segment > 0 ? (uint64_t) C.segment : 0;
    op->spin = C.spin > 0 ? (uint32_t) C.spin : 0;
    op->idle = idle;
    op->idle_argument = NULL;
    op->failed_rank = -1;
}

/* The MPI code for how the library's call ended. */
int mca_coll_nicbar_outcome(int state, nicbar_coll_op *op, struct ompi_communicator_t *comm,
                            const char *operation)
{
    if (NICBAR_COLL_COMPLETED == state) {
        return MPI_SUCCESS;
    }
    if (NICBAR_COLL_FAILED == state) {
        return mca_coll_nicbar_failure_code(comm, operation, op->failed_rank, op->message);
    }
    if (C.verbose >= 1) {
        opal_output(0, "coll:nicbar: %s refused: %s", operation, op->message);
    }
    return MPI_ERR_ARG;
}

#define LOCKED(call)                              \
    do {                                          \
        pthread_mutex_lock(&C.lock);              \
        state = (call);                           \
        pthread_mutex_unlock(&C.lock);            \
    } while (0)

int mca_coll_nicbar_bcast(void *buffer, int count, struct ompi_datatype_t *dtype, int root,
                          struct ompi_communicator_t *comm, mca_coll_base_module_t *module)
{
    mca_coll_nicbar_module_t *self = (mca_coll_nicbar_module_t *) module;
    nicbar_coll_op op;
    view_t view;
    int rc, state, at_root = ompi_comm_rank(comm) == root;

    if (C.bcast_algorithm < 0) {
        return self->previous.bcast(buffer, count, dtype, root, comm,
                                    self->previous.bcast_module);
    }
    rc = view_make(&view, buffer, (size_t) count, dtype, at_root ? VIEW_SEND : VIEW_RECEIVE);
    if (MPI_SUCCESS != rc) {
        view_finish(&view, 0, 1);
        return rc;
    }
    mca_coll_nicbar_op_init(&op, self, comm, C.bcast_algorithm);
    LOCKED(nicbar_coll_bcast(C.endpoint, self->group, &op, view.bytes, view.length, root));
    rc = view_finish(&view, !at_root, NICBAR_COLL_COMPLETED != state);
    return NICBAR_COLL_COMPLETED == state
               ? rc
               : mca_coll_nicbar_outcome(state, &op, comm, "MPI_Bcast");
}

int mca_coll_nicbar_scatter(const void *sbuf, int scount, struct ompi_datatype_t *sdtype,
                            void *rbuf, int rcount, struct ompi_datatype_t *rdtype, int root,
                            struct ompi_communicator_t *comm, mca_coll_base_module_t *module)
{
    mca_coll_nicbar_module_t *self = (mca_coll_nicbar_module_t *) module;
    int size = ompi_comm_size(comm), at_root = ompi_comm_rank(comm) == root;
    int in_place = at_root && MPI_IN_PLACE == rbuf;
    nicbar_coll_op op;
    view_t send = empty_view, receive = empty_view;
    size_t block = 0;
    int rc = MPI_SUCCESS, state = NICBAR_COLL_UNKNOWN;

    if (C.scatter_algorithm < 0) {
        return self->previous.scatter(sbuf, scount, sdtype, rbuf, rcount, rdtype, root, comm,
                                      self->previous.scatter_module);
    }
    if (at_root) {
        rc = view_make(&send, sbuf, (size_t) scount * size, sdtype, VIEW_SEND);
        block = send.length / size;
    }
    if (MPI_SUCCESS == rc && !in_place) {
        rc = view_make(&receive, rbuf, (size_t) rcount, rdtype, VIEW_RECEIVE);
        block = receive.length;
    }
    if (MPI_SUCCESS == rc) {
        mca_coll_nicbar_op_init(&op, self, comm, C.scatter_algorithm);
        LOCKED(nicbar_coll_scatter(C.endpoint, self->group, &op, send.bytes,
                                   in_place ? NULL : receive.bytes, block, root));
    }
    view_finish(&send, 0, 1);
    {
        int unpacked = view_finish(&receive, 1, NICBAR_COLL_COMPLETED != state);
        if (MPI_SUCCESS != rc) {
            return rc;
        }
        return NICBAR_COLL_COMPLETED == state
                   ? unpacked
                   : mca_coll_nicbar_outcome(state, &op, comm, "MPI_Scatter");
    }
}

int mca_coll_nicbar_gather(const void *sbuf, int scount, struct ompi_datatype_t *sdtype,
                           void *rbuf, int rcount, struct ompi_datatype_t *rdtype, int root,
                           struct ompi_communicator_t *comm, mca_coll_base_module_t *module)
{
    mca_coll_nicbar_module_t *self = (mca_coll_nicbar_module_t *) module;
    int size = ompi_comm_size(comm), at_root = ompi_comm_rank(comm) == root;
    int in_place = at_root && MPI_IN_PLACE == sbuf;
    nicbar_coll_op op;
    view_t send = empty_view, receive = empty_view;
    size_t block = 0;
    int rc = MPI_SUCCESS, state = NICBAR_COLL_UNKNOWN;

    if (C.gather_algorithm < 0) {
        return self->previous.gather(sbuf, scount, sdtype, rbuf, rcount, rdtype, root, comm,
                                     self->previous.gather_module);
    }
    if (!in_place) {
        rc = view_make(&send, sbuf, (size_t) scount, sdtype, VIEW_SEND);
        block = send.length;
    }
    if (MPI_SUCCESS == rc && at_root) {
        /* In place, the root's own block is read from the receive buffer: preload it. */
        rc = view_make(&receive, rbuf, (size_t) rcount * size, rdtype,
                       in_place ? VIEW_PRELOAD : VIEW_RECEIVE);
        block = receive.length / size;
    }
    if (MPI_SUCCESS == rc) {
        mca_coll_nicbar_op_init(&op, self, comm, C.gather_algorithm);
        LOCKED(nicbar_coll_gather(C.endpoint, self->group, &op, in_place ? NULL : send.bytes,
                                  receive.bytes, block, root));
    }
    view_finish(&send, 0, 1);
    {
        int unpacked = view_finish(&receive, 1, NICBAR_COLL_COMPLETED != state);
        if (MPI_SUCCESS != rc) {
            return rc;
        }
        return NICBAR_COLL_COMPLETED == state
                   ? unpacked
                   : mca_coll_nicbar_outcome(state, &op, comm, "MPI_Gather");
    }
}

/* The span of user memory a view reaches, for the overlap check. */
typedef struct {
    uintptr_t start, end;
    int index;
} span_t;

static int span_order(const void *a, const void *b)
{
    const span_t *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start ? 1 : x->index - y->index;
}

/*
 * Receive blocks that share bytes are erroneous in MPI, but Open MPI's own collectives take them
 * without a word, and programs pass them (displacements computed for timing, not for content).
 * Each such block lands in scratch instead and is unpacked in rank order at the end, so that the
 * library never writes two blocks over one another and the last rank's bytes stay, every run.
 */
static int separate_overlapping(view_t *views, int n, void **bytes)
{
    span_t *spans = malloc((size_t) (n > 0 ? n : 1) * sizeof *spans);
    char *overlaps = calloc((size_t) (n > 0 ? n : 1), 1);
    int count = 0, rc = MPI_SUCCESS;
    uintptr_t reach = 0;
    if (NULL == spans || NULL == overlaps) {
        free(spans);
        free(overlaps);
        return MPI_ERR_NO_MEM;
    }
    for (int i = 0; i < n; i++) {
        ptrdiff_t lb = 0, extent = 0, true_lb = 0, true_extent = 0;
        if (0 == views[i].length || NULL == views[i].dtype) {
            continue;
        }
        ompi_datatype_get_extent(views[i].dtype, &lb, &extent);
        ompi_datatype_get_true_extent(views[i].dtype, &true_lb, &true_extent);
        /* Every byte the count elements may touch, whatever the sign of the extent. */
        ptrdiff_t first = true_lb, last = true_lb + true_extent;
        ptrdiff_t step = (ptrdiff_t) (views[i].count - 1) * extent;
        if (step < 0) {
            first += step;
        } else {
            last += step;
        }
        spans[count].start = (uintptr_t) views[i].user + (uintptr_t) first;
        spans[count].end = (uintptr_t) views[i].user + (uintptr_t) last;
        spans[count].index = i;
        count++;
    }
    qsort(spans, (size_t) count, sizeof *spans, span_order);
    for (int k = 0; k < count; k++) {
        if (spans[k].start < reach) {
            /* It overlaps every block before it (by start) that ends past its start. */
            overlaps[spans[k].index] = 1;
            for (int j = k - 1; j >= 0; j--) {
                if (spans[j].end > spans[k].start) {
                    overlaps[spans[j].index] = 1;
                }
            }
        }
        if (spans[k].end > reach) {
            reach = spans[k].end;
        }
    }
    for (int i = 0; i < n && MPI_SUCCESS == rc; i++) {
        if (!overlaps[i] || NULL != views[i].scratch) {
            continue;
        }
        views[i].scratch = malloc(views[i].length);
        if (NULL == views[i].scratch) {
            rc = MPI_ERR_NO_MEM;
            break;
        }
        views[i].bytes = views[i].scratch;
        bytes[i] = views[i].bytes;
    }
    free(spans);
    free(overlaps);
    return rc;
}

/* Views of the blocks of a v form: block i is counts[i] elements at displs[i] extents. */
static int views_make(view_t *views, int n, const void *buf, const int *counts,
                      const int *displs, ompi_datatype_t *dtype, int flags, int skip, void **bytes,
                      size_t *lengths)
{
    ptrdiff_t lb = 0, extent = 0;
    ompi_datatype_get_extent(dtype, &lb, &extent);
    for (int i = 0; i < n; i++) {
        views[i] = empty_view;
    }
    for (int i = 0; i < n; i++) {
        int rc;
        if (i == skip) {
            bytes[i] = NULL;
            lengths[i] = 0;
            continue;
        }
        rc = view_make(&views[i], (const char *) buf + (ptrdiff_t) displs[i] * extent,
                       (size_t) counts[i], dtype, flags);
        if (MPI_SUCCESS != rc) {
            return rc;
        }
        bytes[i] = views[i].bytes;
        lengths[i] = views[i].length;
    }
    return flags & (VIEW_SEND | VIEW_PRELOAD) ? MPI_SUCCESS
                                              : separate_overlapping(views, n, bytes);
}

static int views_finish(view_t *views, int n, int receive, int failed)
{
    int rc = MPI_SUCCESS;
    for (int i = 0; i < n; i++) {
        int one = view_finish(&views[i], receive, failed);
        if (MPI_SUCCESS != one) {
            rc = one;
        }
    }
    return rc;
}

int mca_coll_nicbar_scatterv(const void *sbuf, const int *scounts, const int *displs,
                             struct ompi_datatype_t *sdtype, void *rbuf, int rcount,
                             struct ompi_datatype_t *rdtype, int root,
                             struct ompi_communicator_t *comm, mca_coll_base_module_t *module)
{
    mca_coll_nicbar_module_t *self = (mca_coll_nicbar_module_t *) module;
    int size = ompi_comm_size(comm), at_root = ompi_comm_rank(comm) == root;
    int in_place = at_root && MPI_IN_PLACE == rbuf;
    nicbar_coll_op op;
    view_t *sends = NULL, receive = empty_view;
    void **blocks = NULL;
    size_t *lengths = NULL;
    int rc = MPI_SUCCESS, state = NICBAR_COLL_UNKNOWN;

    if (C.scatter_algorithm < 0) {
        return self->previous.scatterv(sbuf, scounts, displs, sdtype, rbuf, rcount, rdtype, root,
                                       comm, self->previous.scatterv_module);
    }
    if (at_root) {
        sends = calloc(size, sizeof *sends);
        blocks = calloc(size, sizeof *blocks);
        lengths = calloc(size, sizeof *lengths);
        rc = NULL == sends || NULL == blocks || NULL == lengths
                 ? MPI_ERR_NO_MEM
                 : views_make(sends, size, sbuf, scounts, displs, sdtype, VIEW_SEND, -1, blocks,
                              lengths);
    }
    if (MPI_SUCCESS == rc && !in_place) {
        rc = view_make(&receive, rbuf, (size_t) rcount, rdtype, VIEW_RECEIVE);
    }
    if (MPI_SUCCESS == rc) {
        mca_coll_nicbar_op_init(&op, self, comm, 0);
        LOCKED(nicbar_coll_scatterv(C.endpoint, self->group, &op, (const void *const *) blocks,
                                    lengths, in_place ? NULL : receive.bytes, receive.length,
                                    root));
    }
    if (NULL != sends) {
        views_finish(sends, size, 0, 1);
    }
    free(sends);
    free(blocks);
    free(lengths);
    {
        int unpacked = view_finish(&receive, 1, NICBAR_COLL_COMPLETED != state);
        if (MPI_SUCCESS != rc) {
            return rc;
        }
        return NICBAR_COLL_COMPLETED == state
                   ? unpacked
                   : mca_coll_nicbar_outcome(state, &op, comm, "MPI_Scatterv");
    }
}

int mca_coll_nicbar_gatherv(const void *sbuf, int scount, struct ompi_datatype_t *sdtype,
                            void *rbuf, const int *rcounts, const int *displs,
                            struct ompi_datatype_t *rdtype, int root,
                            struct ompi_communicator_t *comm, mca_coll_base_module_t *module)
{
    mca_coll_nicbar_module_t *self = (mca_coll_nicbar_module_t *) module;
    int size = ompi_comm_size(comm), at_root = ompi_comm_rank(comm) == root;
    int in_place = at_root && MPI_IN_PLACE == sbuf;
    nicbar_coll_op op;
    view_t *receives = NULL, send = empty_view;
    void **blocks = NULL;
    size_t *lengths = NULL;
    int rc = MPI_SUCCESS, state = NICBAR_COLL_UNKNOWN;

    if (C.gather_algorithm < 0) {
        return self->previous.gatherv(sbuf, scount, sdtype, rbuf, rcounts, displs, rdtype, root,
                                      comm, self->previous.gatherv_module);
    }
    if (!in_place) {
        rc = view_make(&send, sbuf, (size_t) scount, sdtype, VIEW_SEND);
    }
    if (MPI_SUCCESS == rc && at_root) {
        receives = calloc(size, sizeof *receives);
        blocks = calloc(size, sizeof *blocks);
        lengths = calloc(size, sizeof *lengths);
        /* In place, the root's own block stays where it is: the library is given none. */
        rc = NULL == receives || NULL == blocks || NULL == lengths
                 ? MPI_ERR_NO_MEM
                 : views_make(receives, size, rbuf, rcounts, displs, rdtype, VIEW_RECEIVE,
                              in_place ? root : -1, blocks, lengths);
    }
    if (MPI_SUCCESS == rc) {
        mca_coll_nicbar_op_init(&op, self, comm, 0);
        LOCKED(nicbar_coll_gatherv(C.endpoint, self->group, &op, in_place ? NULL : send.bytes,
                                   send.length, (void *const *) blocks, lengths, root));
    }
    view_finish(&send, 0, 1);
    {
        int unpacked = NULL == receives
                           ? MPI_SUCCESS
                           : views_finish(receives, size, 1, NICBAR_COLL_COMPLETED != state);
        free(receives);
        free(blocks);
        free(lengths);
        if (MPI_SUCCESS != rc) {
            return rc;
        }
        return NICBAR_COLL_COMPLETED == state
                   ? unpacked
                   : mca_coll_nicbar_outcome(state, &op, comm, "MPI_Gatherv");
    }
}

int mca_coll_nicbar_alltoall(const void *sbuf, int scount, struct ompi_datatype_t *sdtype,
                             void *rbuf, int rcount, struct ompi_datatype_t *rdtype,
                             struct ompi_communicator_t *comm, mca_coll_base_module_t *module)
{
    mca_coll_nicbar_module_t *self = (mca_coll_nicbar_module_t *) module;
    int size = ompi_comm_size(comm);
    int in_place = MPI_IN_PLACE == sbuf;
    nicbar_coll_op op;
    view_t send = empty_view, receive = empty_view;
    int rc, state = NICBAR_COLL_UNKNOWN;

    if (C.alltoall_algorithm < 0) {
        return self->previous.alltoall(sbuf, scount, sdtype, rbuf, rcount, rdtype, comm,
                                       self->previous.alltoall_module);
    }
    /* In place, what is sent is the receive buffer as it was: a copy of it. */
    rc = in_place ? view_make(&send, rbuf, (size_t) rcount * size, rdtype, VIEW_SEND | VIEW_COPY)
                  : view_make(&send, sbuf, (size_t) scount * size, sdtype, VIEW_SEND);
    if (MPI_SUCCESS == rc) {
        rc = view_make(&receive, rbuf, (size_t) rcount * size, rdtype, VIEW_RECEIVE);
    }
    if (MPI_SUCCESS == rc) {
        mca_coll_nicbar_op_init(&op, self, comm, C.alltoall_algorithm);
        LOCKED(nicbar_coll_alltoall(C.endpoint, self->group, &op, send.bytes, receive.bytes,
                                    receive.length / size));
    }
    view_finish(&send, 0, 1);
    {
        int unpacked = view_finish(&receive, 1, NICBAR_COLL_COMPLETED != state);
        if (MPI_SUCCESS != rc) {
            return rc;
        }
        return NICBAR_COLL_COMPLETED == state
                   ? unpacked
                   : mca_coll_nicbar_outcome(state, &op, comm, "MPI_Alltoall");
    }
}

int mca_coll_nicbar_alltoallv(const void *sbuf, const int *scounts, const int *sdispls,
                              struct ompi_datatype_t *sdtype, void *rbuf, const int *rcounts,
                              const int *rdispls, struct ompi_datatype_t *rdtype,
                              struct ompi_communicator_t *comm, mca_coll_base_module_t *module)
{
    mca_coll_nicbar_module_t *self = (mca_coll_nicbar_module_t *) module;
    int size = ompi_comm_size(comm);
    int in_place = MPI_IN_PLACE == sbuf;
    nicbar_coll_op op;
    view_t *sends, *receives;
    void **send_blocks, **receive_blocks;
    size_t *send_lengths, *receive_lengths;
    int rc = MPI_SUCCESS, state = NICBAR_COLL_UNKNOWN, unpacked = MPI_SUCCESS;

    if (C.alltoall_algorithm < 0) {
        return self->previous.alltoallv(sbuf, scounts, sdispls, sdtype, rbuf, rcounts, rdispls,
                                        rdtype, comm, self->previous.alltoallv_module);
    }
    sends = calloc(size, sizeof *sends);
    receives = calloc(size, sizeof *receives);
    send_blocks = calloc(size, sizeof *send_blocks);
    receive_blocks = calloc(size, sizeof *receive_blocks);
    send_lengths = calloc(size, sizeof *send_lengths);
    receive_lengths = calloc(size, sizeof *receive_lengths);
    if (NULL == sends || NULL == receives || NULL == send_blocks ||
               NULL == receive_blocks || NULL == send_lengths || NULL == receive_lengths) {
        rc = MPI_ERR_NO_MEM;
    } else {
        /* In place, each block sent is a copy of the receive block it will replace. */
        rc = in_place ? views_make(sends, size, rbuf, rcounts, rdispls, rdtype,
                                   VIEW_SEND | VIEW_COPY, -1, send_blocks, send_lengths)
                      : views_make(sends, size, sbuf, scounts, sdispls, sdtype, VIEW_SEND, -1,
                                   send_blocks, send_lengths);
        if (MPI_SUCCESS == rc) {
            rc = views_make(receives, size, rbuf, rcounts, rdispls, rdtype, VIEW_RECEIVE, -1,
                            receive_blocks, receive_lengths);
        }
        if (MPI_SUCCESS == rc) {
            mca_coll_nicbar_op_init(&op, self, comm, C.alltoall_algorithm);
            LOCKED(nicbar_coll_alltoallv(C.endpoint, self->group, &op,
                                         (const void *const *) send_blocks, send_lengths,
                                         (void *const *) receive_blocks, receive_lengths));
        }
    }
    if (NULL != sends) {
        views_finish(sends, size, 0, 1);
    }
    if (NULL != receives) {
        unpacked = views_finish(receives, size, 1, NICBAR_COLL_COMPLETED != state);
    }
    free(sends);
    free(receives);
    free(send_blocks);
    free(receive_blocks);
    free(send_lengths);
    free(receive_lengths);
    if (MPI_SUCCESS != rc) {
        return rc;
    }
    return NICBAR_COLL_COMPLETED == state
               ? unpacked
               : mca_coll_nicbar_outcome(state, &op, comm, "MPI_Alltoallv");
}
