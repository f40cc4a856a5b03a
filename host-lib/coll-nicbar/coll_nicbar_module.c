/*
 * coll/nicbar: the module of one communicator: MPI_Barrier, MPI_Ibarrier, MPIX_Barrier_init,
 * the wait and the requests every collective in the NIC shares (barriers and reductions,
 * non-blocking and persistent), the progress function that completes them, and the errors that
 * name a missing rank.
 */
#include "coll_nicbar.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opal/runtime/opal_progress.h"
#include "opal/util/output.h"
#include "ompi/proc/proc.h"

#define C mca_coll_nicbar_component

static void module_construct(mca_coll_nicbar_module_t *module)
{
    module->group = NULL;
    module->sequence = 0;
    memset(&module->previous, 0, sizeof module->previous);
}

#define PREVIOUS_MODULES(apply)                                                              \
    apply(bcast) apply(scatter) apply(scatterv) apply(gather) apply(gatherv) apply(alltoall) \
    apply(alltoallv) apply(allreduce) apply(reduce) apply(iallreduce) apply(ireduce)
/* Those a component below may lack. */
#define PREVIOUS_OPTIONAL(apply) apply(barrier_init) apply(allreduce_init) apply(reduce_init)

static void module_destruct(mca_coll_nicbar_module_t *module)
{
#define RELEASE(name)                                      \
    if (NULL != module->previous.name##_module) {          \
        OBJ_RELEASE(module->previous.name##_module);       \
        module->previous.name##_module = NULL;             \
    }
    PREVIOUS_MODULES(RELEASE)
    PREVIOUS_OPTIONAL(RELEASE)
#undef RELEASE
    nicbar_coll_group_free(module->group);
    module->group = NULL;
}

/*
 * Called once every component's module is chosen, lowest priority first: the communicator's
 * collectives are then those of the components below this one. Saves them (and holds their
 * modules) for the collectives switched off here.
 */
int mca_coll_nicbar_enable(mca_coll_base_module_t *base, struct ompi_communicator_t *comm)
{
    mca_coll_nicbar_module_t *module = (mca_coll_nicbar_module_t *) base;
#define SAVE(name)                                                                   \
    if (NULL == comm->c_coll->coll_##name || NULL == comm->c_coll->coll_##name##_module) { \
        return OMPI_ERROR;                                                               \
    }                                                                                    \
    module->previous.name = comm->c_coll->coll_##name;                                   \
    module->previous.name##_module = comm->c_coll->coll_##name##_module;                 \
    OBJ_RETAIN(module->previous.name##_module);
    PREVIOUS_MODULES(SAVE)
#undef SAVE
#define SAVE_OPTIONAL(name)                                                              \
    if (NULL != comm->c_coll->coll_##name && NULL != comm->c_coll->coll_##name##_module) { \
        module->previous.name = comm->c_coll->coll_##name;                               \
        module->previous.name##_module = comm->c_coll->coll_##name##_module;             \
        OBJ_RETAIN(module->previous.name##_module);                                      \
    }
    PREVIOUS_OPTIONAL(SAVE_OPTIONAL)
#undef SAVE_OPTIONAL
    return OMPI_SUCCESS;
}

OBJ_CLASS_INSTANCE(mca_coll_nicbar_module_t, mca_coll_base_module_t, module_construct,
                   module_destruct);
OBJ_CLASS_INSTANCE(mca_coll_nicbar_request_t, ompi_request_t, NULL, NULL);

/* The non-blocking barriers not yet complete, in start order. Guarded by C.lock. */
static mca_coll_nicbar_request_t **outstanding;
static size_t outstanding_count, outstanding_capacity;

/*
 * The MPI error code for a failed barrier: a code of the component's error class whose string
 * is `message` (so MPI_Error_string names the missing rank).
 */
int mca_coll_nicbar_failure_code(ompi_communicator_t *comm, const char *operation,
                                 int failed_rank, const char *reason)
{
    char text[MPI_MAX_ERROR_STRING], name[MPI_MAX_OBJECT_NAME + 32];
    int code;
    if ('\0' != comm->c_name[0]) {
        snprintf(name, sizeof name, "%s", comm->c_name);
    } else {
        snprintf(name, sizeof name, "communicator %u", (unsigned) comm->c_contextid);
    }
    if (failed_rank >= 0) {
        snprintf(text, sizeof text, "%s on %s: rank %d is missing (%s)", operation, name,
                 failed_rank, reason);
    } else {
        snprintf(text, sizeof text, "%s on %s failed in the NIC: %s", operation, name, reason);
    }
    if (C.verbose >= 1) {
        opal_output(0, "coll:nicbar: rank %u: %s", OMPI_PROC_MY_NAME->vpid, text);
    }
    if (MPI_UNDEFINED == C.error_class && MPI_SUCCESS != MPI_Add_error_class(&C.error_class)) {
        C.error_class = MPI_UNDEFINED;
        return MPI_ERR_OTHER;
    }
    if (MPI_SUCCESS != MPI_Add_error_code(C.error_class, &code)) {
        return MPI_ERR_OTHER;
    }
    (void) MPI_Add_error_string(code, text);
    return code;
}

/*
 * Waits for the NIC collective with `ticket` to end: spins C.spin polls, then sleeps on the port
 * between calls to opal_progress. A failure becomes an error code naming the missing rank.
 */
int mca_coll_nicbar_wait(struct ompi_communicator_t *comm, uint64_t ticket, const char *operation)
{
    char reason[MPI_MAX_ERROR_STRING] = "";
    int failed_rank = -1, state;

    if (0 == ticket) {
        return MPI_ERR_INTERN;
    }
    for (int polls = 0;; polls++) {
        pthread_mutex_lock(&C.lock);
        state = nicbar_coll_barrier_test(C.endpoint, ticket, &failed_rank, reason, sizeof reason);
        if (NICBAR_COLL_PENDING == state && polls >= C.spin) {
            /* Sleep on the port until the NIC reports (the end wakes it at once), but not so
             * long that other traffic of this process starves: it needs opal_progress. */
            (void) nicbar_coll_wait(C.endpoint, 200);
            /* Most often the end is what woke it: take it now, before opal_progress yields
             * the core to the other processes of a host with none to spare. */
            state = nicbar_coll_barrier_test(C.endpoint, ticket, &failed_rank, reason,
                                             sizeof reason);
        }
        pthread_mutex_unlock(&C.lock);
        if (NICBAR_COLL_COMPLETED == state) {
            return MPI_SUCCESS;
        }
        if (NICBAR_COLL_FAILED == state) {
            return mca_coll_nicbar_failure_code(comm, operation, failed_rank, reason);
        }
        if (NICBAR_COLL_UNKNOWN == state) {
            return MPI_ERR_INTERN;
        }
        opal_progress();
        mca_coll_nicbar_idle_yield();
    }
}

/*
 * After a poll that found nothing: where the host has no core for the NIC's thread beside one
 * for each process, gives the core away, as Open MPI's own progress does under
 * mpi_yield_when_idle. Open MPI sets that only where it counts more processes than slots, and it
 * does not count the NIC's thread: a process that spun without yielding kept that thread, which
 * lingers runnable after its work rather than sleeping, off the core until the scheduler's next
 * tick (an MPI_Ibarrier took 4 ms at 2 processes on 2 cores).
 */
void mca_coll_nicbar_idle_yield(void)
{
    if (C.no_core_for_nic && !opal_progress_yield_when_idle) {
        sched_yield();
    }
}

int mca_coll_nicbar_barrier(struct ompi_communicator_t *comm, mca_coll_base_module_t *module)
{
    mca_coll_nicbar_module_t *self = (mca_coll_nicbar_module_t *) module;
    uint64_t ticket;

    pthread_mutex_lock(&C.lock);
    ticket = nicbar_coll_barrier_start(C.endpoint, self->group);
    pthread_mutex_unlock(&C.lock);
    return mca_coll_nicbar_wait(comm, ticket, "MPI_Barrier");
}

static int request_free(ompi_request_t **request)
{
    if (!REQUEST_COMPLETE(*request)) {
        return MPI_ERR_REQUEST;
    }
    OMPI_REQUEST_FINI(*request);
    OBJ_RELEASE(*request);
    *request = MPI_REQUEST_NULL;
    return MPI_SUCCESS;
}

static int request_cancel(ompi_request_t *request, int complete)
{
    (void) request;
    (void) complete;
    return MPI_ERR_REQUEST; /* collectives cannot be cancelled */
}

/* A new active request of `comm` for a non-blocking `operation` in the NIC, or NULL. */
mca_coll_nicbar_request_t *mca_coll_nicbar_request_new(struct ompi_communicator_t *comm,
                                                       const char *operation)
{
    mca_coll_nicbar_request_t *request = OBJ_NEW(mca_coll_nicbar_request_t);
    if (NULL == request) {
        return NULL;
    }
    OMPI_REQUEST_INIT(&request->super, false);
    request->super.req_type = OMPI_REQUEST_COLL;
    request->super.req_state = OMPI_REQUEST_ACTIVE;
    request->super.req_free = request_free;
    request->super.req_cancel = request_cancel;
    request->super.req_mpi_object.comm = comm;
    request->super.req_status.MPI_SOURCE = MPI_ANY_SOURCE;
    request->super.req_status.MPI_TAG = MPI_ANY_TAG;
    request->super.req_status.MPI_ERROR = MPI_SUCCESS;
    request->super.req_status._cancelled = 0;
    request->super.req_status._ucount = 0;
    request->ticket = 0;
    request->operation = operation;
    request->reduction = 0;
    request->result = NULL;
    request->result_length = 0;
    request->persistent = NULL;
    request->data = NULL;
    request->messages = NULL;
    return request;
}

/* Adds `request` to the outstanding ones; C.lock held. Returns 0, or -1 with no memory for it. */
static int outstanding_add(mca_coll_nicbar_request_t *request)
{
    if (outstanding_count == outstanding_capacity) {
        size_t capacity = outstanding_capacity ? 2 * outstanding_capacity : 16;
        void *grown = realloc(outstanding, capacity * sizeof *outstanding);
        if (NULL == grown) {
            return -1;
        }
        outstanding = grown;
        outstanding_capacity = capacity;
    }
    outstanding[outstanding_count++] = request;
    return 0;
}

/*
 * The MPI code of `request`'s end, the NIC's `state` for its ticket (`failed_rank`, `reason`:
 * a failure's), taking a reduction's result into place. C.lock held.
 */
static int take_end(mca_coll_nicbar_request_t *request, int state, int failed_rank,
                    const char *reason)
{
    if (NICBAR_COLL_FAILED == state) {
        return mca_coll_nicbar_failure_code(request->super.req_mpi_object.comm,
                                            request->operation, failed_rank, reason);
    }
    if (NICBAR_COLL_COMPLETED != state) {
        return MPI_ERR_INTERN;
    }
    if (request->reduction) {
        unsigned char value[NICBAR_NIC_REDUCE_MAX];
        int64_t got = nicbar_coll_allreduce_result(C.endpoint, request->ticket, value,
                                                   sizeof value);
        if (got != (int64_t) request->result_length) {
            return MPI_ERR_INTERN;
        }
        if (NULL != request->result) {
            memcpy(request->result, value, request->result_length);
        }
    }
    return MPI_SUCCESS;
}

/*
 * Hands `request`, whose collective the caller started under C.lock (its ticket set), to the
 * progress function, and gives it to MPI as `*out`. Called with C.lock held; releases it. A
 * request whose start failed (ticket 0) is freed.
 */
int mca_coll_nicbar_post(struct ompi_communicator_t *comm, mca_coll_nicbar_request_t *request,
                         ompi_request_t **out)
{
    (void) comm;
    if (0 == request->ticket) {
        pthread_mutex_unlock(&C.lock);
        OBJ_RELEASE(request);
        return MPI_ERR_INTERN;
    }
    if (0 != outstanding_add(request)) {
        if (NULL != request->messages) {
            /* Run to its end here, which every wait on the endpoint moves on. */
            int rc;
            while (!mca_coll_nicbar_ireduce_messages_end(request, &rc)) {
                (void) nicbar_coll_wait(C.endpoint, 100);
            }
            pthread_mutex_unlock(&C.lock);
            OBJ_RELEASE(request);
            return MPI_SUCCESS == rc ? MPI_ERR_NO_MEM : rc;
        }
        /* The collective runs on in the NIC; waiting for it here keeps its members' order. */
        pthread_mutex_unlock(&C.lock);
        int rc = mca_coll_nicbar_wait(comm, request->ticket, request->operation);
        OBJ_RELEASE(request);
        return MPI_SUCCESS == rc ? MPI_ERR_NO_MEM : rc;
    }
    pthread_mutex_unlock(&C.lock);
    *out = &request->super;
    return MPI_SUCCESS;
}

int mca_coll_nicbar_ibarrier(struct ompi_communicator_t *comm, ompi_request_t **request,
                             mca_coll_base_module_t *module)
{
    mca_coll_nicbar_module_t *self = (mca_coll_nicbar_module_t *) module;
    mca_coll_nicbar_request_t *barrier = mca_coll_nicbar_request_new(comm, "MPI_Ibarrier");
    if (NULL == barrier) {
        return MPI_ERR_NO_MEM;
    }
    pthread_mutex_lock(&C.lock);
    barrier->ticket = nicbar_coll_barrier_start(C.endpoint, self->group);
    return mca_coll_nicbar_post(comm, barrier, request);
}

/*
 * MPI_Start and MPI_Startall: each request's compiled collective goes to the endpoint's queue,
 * one send token, in the order given (MPI orders a communicator's starts as its collectives).
 */
static int persistent_start(size_t count, ompi_request_t **requests)
{
    for (size_t i = 0; i < count; i++) {
        mca_coll_nicbar_request_t *request = (mca_coll_nicbar_request_t *) requests[i];
        request->super.req_state = OMPI_REQUEST_ACTIVE;
        request->super.req_complete = REQUEST_PENDING;
        request->super.req_status.MPI_ERROR = MPI_SUCCESS;
        pthread_mutex_lock(&C.lock);
        request->ticket = nicbar_coll_persistent_start(
            C.endpoint, request->persistent, request->data,
            request->reduction ? request->result_length : 0);
        if (0 == request->ticket) {
            pthread_mutex_unlock(&C.lock);
            request->super.req_state = OMPI_REQUEST_INACTIVE;
            request->super.req_complete = REQUEST_COMPLETED;
            return MPI_ERR_INTERN;
        }
        if (request->reduction) {
            mca_coll_nicbar_count_reduction();
        }
        if (0 == outstanding_add(request)) {
            pthread_mutex_unlock(&C.lock);
            continue;
        }
        pthread_mutex_unlock(&C.lock);
        /* No memory to track it: run it to its end here, which keeps its members' order. */
        int rc = mca_coll_nicbar_wait(request->super.req_mpi_object.comm, request->ticket,
                                      request->operation);
        if (MPI_SUCCESS == rc) {
            pthread_mutex_lock(&C.lock);
            rc = take_end(request, NICBAR_COLL_COMPLETED, -1, "");
            pthread_mutex_unlock(&C.lock);
        }
        request->super.req_status.MPI_ERROR = rc;
        ompi_request_complete(&request->super, true);
    }
    return MPI_SUCCESS;
}

/* MPI_Request_free of a persistent request, not started or complete: its compiled collective
 * goes too (starts still queued keep their own copy). */
static int persistent_free(ompi_request_t **request)
{
    mca_coll_nicbar_request_t *self = (mca_coll_nicbar_request_t *) *request;
    if (!REQUEST_COMPLETE(*request)) {
        return MPI_ERR_REQUEST;
    }
    nicbar_coll_persistent_free(self->persistent);
    self->persistent = NULL;
    OMPI_REQUEST_FINI(*request);
    OBJ_RELEASE(*request);
    *request = MPI_REQUEST_NULL;
    return MPI_SUCCESS;
}

/*
 * A persistent request of `comm` for `operation` over `persistent` (which it owns from now on,
 * freed with it): `data` is a reduction's input of `length` bytes, read at each start (NULL for
 * a barrier), `result` where its result goes (NULL: dropped).
 */
int mca_coll_nicbar_persistent_new(struct ompi_communicator_t *comm, const char *operation,
                                   nicbar_coll_persistent *persistent, const void *data,
                                   void *result, size_t length, ompi_request_t **out)
{
    mca_coll_nicbar_request_t *request = mca_coll_nicbar_request_new(comm, operation);
    if (NULL == request) {
        nicbar_coll_persistent_free(persistent);
        return MPI_ERR_NO_MEM;
    }
    OMPI_REQUEST_INIT(&request->super, true); /* inactive, and complete until started */
    request->super.req_start = persistent_start;
    request->super.req_free = persistent_free;
    request->persistent = persistent;
    request->data = data;
    request->reduction = NULL != data;
    request->result = result;
    request->result_length = length;
    *out = &request->super;
    return MPI_SUCCESS;
}

int mca_coll_nicbar_barrier_init(struct ompi_communicator_t *comm, struct ompi_info_t *info,
                                 ompi_request_t **request, mca_coll_base_module_t *module)
{
    mca_coll_nicbar_module_t *self = (mca_coll_nicbar_module_t *) module;
    char error[MPI_MAX_ERROR_STRING] = "";
    nicbar_coll_persistent *persistent;
    (void) info;

    pthread_mutex_lock(&C.lock);
    persistent = nicbar_coll_barrier_init(C.endpoint, self->group, error, sizeof error);
    pthread_mutex_unlock(&C.lock);
    if (NULL == persistent) {
        /* The group's barrier runs in the NIC or nowhere: the same on every rank. */
        return mca_coll_nicbar_failure_code(comm, "MPIX_Barrier_init", -1, error);
    }
    return mca_coll_nicbar_persistent_new(comm, "MPIX_Barrier_init", persistent, NULL, NULL, 0,
                                          request);
}

/*
 * Registered with opal_progress: takes the NIC's barrier ends and completes their requests, so
 * MPI_Test and MPI_Wait work and the barrier runs while the program computes.
 */
int mca_coll_nicbar_progress(void)
{
    char reason[MPI_MAX_ERROR_STRING];
    mca_coll_nicbar_request_t *ended[64];
    int codes[64], count = 0;

    if (0 == outstanding_count || 0 != pthread_mutex_trylock(&C.lock)) {
        return 0;
    }
    for (size_t i = 0; i < outstanding_count && count < 64;) {
        mca_coll_nicbar_request_t *barrier = outstanding[i];
        if (NULL != barrier->messages) {
            if (!mca_coll_nicbar_ireduce_messages_end(barrier, &codes[count])) {
                i++;
                continue;
            }
        } else {
            int failed_rank = -1;
            int state = nicbar_coll_barrier_test(C.endpoint, barrier->ticket, &failed_rank,
                                                 reason, sizeof reason);
            if (NICBAR_COLL_PENDING == state) {
                i++;
                continue;
            }
            codes[count] = take_end(barrier, state, failed_rank, reason);
        }
        ended[count++] = barrier;
        memmove(&outstanding[i], &outstanding[i + 1],
                (outstanding_count - i - 1) * sizeof *outstanding);
        outstanding_count--;
    }
    pthread_mutex_unlock(&C.lock);
    for (int i = 0; i < count; i++) {
        ended[i]->super.req_status.MPI_ERROR = codes[i];
        ompi_request_complete(&ended[i]->super, true);
    }
    if (0 == count) {
        /* A request waits on the NIC: MPI_Wait and MPI_Test loops spin through here. */
        mca_coll_nicbar_idle_yield();
    }
    return count;
}

/* At close: requests never waited for are completed, so nothing is left to the NIC. */
void mca_coll_nicbar_finalize_requests(void)
{
    while (outstanding_count > 0) {
        if (0 == mca_coll_nicbar_progress()) {
            pthread_mutex_lock(&C.lock);
            (void) nicbar_coll_wait(C.endpoint, 1000);
            pthread_mutex_unlock(&C.lock);
        }
    }
    free(outstanding);
    outstanding = NULL;
    outstanding_capacity = 0;
}
