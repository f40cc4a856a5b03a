/*
 * coll/nicbar: an Open MPI collective component that runs MPI_Barrier and MPI_Ibarrier in the
 * NIC, MPI_Allreduce, MPI_Reduce and their non-blocking forms in the NIC up to
 * NICBAR_NIC_REDUCE_MAX bytes, the persistent MPIX_Barrier_init, MPIX_Allreduce_init and
 * MPIX_Reduce_init of Open MPI's pcollreq extension the same way, and MPI_Bcast, MPI_Scatter[v], MPI_Gather[v] and MPI_Alltoall[v]
 * over the NIC's messages, through the nicbar library. The component is thin: it maps communicators to nicbar groups,
 * MPI datatypes to contiguous bytes, and nicbar's ends to MPI requests and errors; the barriers,
 * their queueing, the collectives' algorithms and transfers, and the failure reports are the
 * library's (nicbar/gm.h, the nicbar_coll_* calls).
 */
#ifndef MCA_COLL_NICBAR_H
#define MCA_COLL_NICBAR_H

#include "ompi_config.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "mpi.h"
#include "ompi/communicator/communicator.h"
#include "ompi/mca/coll/coll.h"
#include "ompi/request/request.h"

#include <nicbar/gm.h>

BEGIN_C_DECLS

/* What every process publishes through the modex: its port, or none. */
typedef struct {
    uint16_t node;      /* the NIC's node id */
    uint8_t port;       /* the port id */
    uint8_t reachable;  /* 0: this process has no port; the component is off for its comms */
} mca_coll_nicbar_address_t;

typedef struct {
    mca_coll_base_component_2_0_0_t super;
    /* MCA parameters */
    int priority;       /* -1 switches the component off */
    int algorithm;      /* NICBAR_COLL_ALGORITHM_* */
    int dissemination_n;
    int gb_dimension;
    int timeout_ms;     /* 0: the NIC's default */
    int verbose;
    int unit;           /* -1: the first free port of any unit */
    int spin;           /* polls before a blocking collective sleeps on the port */
    /* The data collectives' algorithms: -1 the component below serves, 0 chosen by size, else
     * the library's NICBAR_COLL_* number for the collective. */
    int bcast_algorithm;
    int scatter_algorithm;  /* and scatterv (always flat) */
    int gather_algorithm;   /* and gatherv (always flat) */
    int alltoall_algorithm; /* and alltoallv (linear or pairwise) */
    int allreduce_algorithm; /* and reduce, for what the NIC does not combine */
    int reproducible_sum;   /* MPI_SUM of one float or double as the NIC's reproducible sum */
    int segment;            /* bytes per segment of the segmented broadcasts (0: the library's) */
    char *map;              /* the selection map file for algorithm 0 (NULL or "": the library's
                             * default place; "off": none) */
    /* State */
    bool no_core_for_nic; /* the host has no core for the NIC beside one per local process */
    nicbar_coll_endpoint *endpoint;
    pthread_mutex_t lock; /* serialises calls on the endpoint (MPI_THREAD_MULTIPLE) */
    int error_class;      /* MPI error class of failed barriers, once added */
} mca_coll_nicbar_component_t;

OMPI_MODULE_DECLSPEC extern mca_coll_nicbar_component_t mca_coll_nicbar_component;

/* The collectives of the component below this one, for those switched off. */
typedef struct {
    mca_coll_base_module_bcast_fn_t bcast;
    mca_coll_base_module_t *bcast_module;
    mca_coll_base_module_scatter_fn_t scatter;
    mca_coll_base_module_t *scatter_module;
    mca_coll_base_module_scatterv_fn_t scatterv;
    mca_coll_base_module_t *scatterv_module;
    mca_coll_base_module_gather_fn_t gather;
    mca_coll_base_module_t *gather_module;
    mca_coll_base_module_gatherv_fn_t gatherv;
    mca_coll_base_module_t *gatherv_module;
    mca_coll_base_module_alltoall_fn_t alltoall;
    mca_coll_base_module_t *alltoall_module;
    mca_coll_base_module_alltoallv_fn_t alltoallv;
    mca_coll_base_module_t *alltoallv_module;
    mca_coll_base_module_allreduce_fn_t allreduce;
    mca_coll_base_module_t *allreduce_module;
    mca_coll_base_module_reduce_fn_t reduce;
    mca_coll_base_module_t *reduce_module;
    mca_coll_base_module_iallreduce_fn_t iallreduce;
    mca_coll_base_module_t *iallreduce_module;
    mca_coll_base_module_ireduce_fn_t ireduce;
    mca_coll_base_module_t *ireduce_module;
    /* The persistent forms, which a component below may lack (NULL then). */
    mca_coll_base_module_barrier_init_fn_t barrier_init;
    mca_coll_base_module_t *barrier_init_module;
    mca_coll_base_module_allreduce_init_fn_t allreduce_init;
    mca_coll_base_module_t *allreduce_init_module;
    mca_coll_base_module_reduce_init_fn_t reduce_init;
    mca_coll_base_module_t *reduce_init_module;
} mca_coll_nicbar_previous_t;

typedef struct {
    mca_coll_base_module_t super;
    nicbar_coll_group *group;
    uint32_t sequence;  /* data collectives run on the communicator (the same on every rank) */
    mca_coll_nicbar_previous_t previous;
} mca_coll_nicbar_module_t;
OBJ_CLASS_DECLARATION(mca_coll_nicbar_module_t);

/* A non-blocking reduction over the NIC's messages (coll_nicbar_reduce_messages.c). */
typedef struct mca_coll_nicbar_ireduce_t mca_coll_nicbar_ireduce_t;

/*
 * A non-blocking barrier or reduction: an Open MPI request completed by the progress function.
 * A persistent one (MPIX_Barrier_init, MPIX_Allreduce_init, MPIX_Reduce_init) keeps its
 * collective compiled in the library, and each MPI_Start posts it as one send token.
 */
typedef struct {
    ompi_request_t super;
    uint64_t ticket;
    const char *operation; /* for the error that names a missing rank */
    int reduction;         /* a reduction's result waits under the ticket */
    void *result;          /* where it goes (NULL: dropped, a non-root of MPI_Ireduce) */
    size_t result_length;
    nicbar_coll_persistent *persistent; /* NULL unless persistent */
    const void *data;                   /* a persistent reduction's input, read at each start */
    mca_coll_nicbar_ireduce_t *messages; /* a reduction over messages (NULL: in the NIC) */
} mca_coll_nicbar_request_t;
OBJ_CLASS_DECLARATION(mca_coll_nicbar_request_t);

int mca_coll_nicbar_init_query(bool enable_progress_threads, bool enable_mpi_threads);
mca_coll_base_module_t *mca_coll_nicbar_comm_query(struct ompi_communicator_t *comm,
                                                   int *priority);
int mca_coll_nicbar_barrier(struct ompi_communicator_t *comm, mca_coll_base_module_t *module);
int mca_coll_nicbar_ibarrier(struct ompi_communicator_t *comm, ompi_request_t **request,
                             mca_coll_base_module_t *module);
int mca_coll_nicbar_progress(void);
void mca_coll_nicbar_idle_yield(void);
int mca_coll_nicbar_wait(struct ompi_communicator_t *comm, uint64_t ticket,
                         const char *operation);
int mca_coll_nicbar_post(struct ompi_communicator_t *comm, mca_coll_nicbar_request_t *request,
                         ompi_request_t **out);
mca_coll_nicbar_request_t *mca_coll_nicbar_request_new(struct ompi_communicator_t *comm,
                                                       const char *operation);
int mca_coll_nicbar_allreduce(const void *sbuf, void *rbuf, int count,
                              struct ompi_datatype_t *dtype, struct ompi_op_t *op,
                              struct ompi_communicator_t *comm, mca_coll_base_module_t *module);
int mca_coll_nicbar_reduce(const void *sbuf, void *rbuf, int count, struct ompi_datatype_t *dtype,
                           struct ompi_op_t *op, int root, struct ompi_communicator_t *comm,
                           mca_coll_base_module_t *module);
int mca_coll_nicbar_iallreduce(const void *sbuf, void *rbuf, int count,
                               struct ompi_datatype_t *dtype, struct ompi_op_t *op,
                               struct ompi_communicator_t *comm, ompi_request_t **request,
                               mca_coll_base_module_t *module);
int mca_coll_nicbar_ireduce(const void *sbuf, void *rbuf, int count,
                            struct ompi_datatype_t *dtype, struct ompi_op_t *op, int root,
                            struct ompi_communicator_t *comm, ompi_request_t **request,
                            mca_coll_base_module_t *module);
uint64_t mca_coll_nicbar_reductions(void);
int mca_coll_nicbar_reduce_by_messages(int count, struct ompi_datatype_t *dtype);
int mca_coll_nicbar_reduce_messages(const void *sbuf, void *rbuf, int count,
                                    struct ompi_datatype_t *dtype, struct ompi_op_t *op,
                                    struct ompi_communicator_t *comm,
                                    mca_coll_nicbar_module_t *self, int root);
int mca_coll_nicbar_ireduce_messages(const void *sbuf, void *rbuf, int count,
                                     struct ompi_datatype_t *dtype, struct ompi_op_t *op,
                                     struct ompi_communicator_t *comm,
                                     mca_coll_nicbar_module_t *self, int root,
                                     ompi_request_t **out);
int mca_coll_nicbar_ireduce_messages_end(mca_coll_nicbar_request_t *request, int *code);
void mca_coll_nicbar_op_init(nicbar_coll_op *op, mca_coll_nicbar_module_t *self,
                             struct ompi_communicator_t *comm, int algorithm);
int mca_coll_nicbar_outcome(int state, nicbar_coll_op *op, struct ompi_communicator_t *comm,
                            const char *operation);
void mca_coll_nicbar_count_reduction(void);
int mca_coll_nicbar_persistent_new(struct ompi_communicator_t *comm, const char *operation,
                                   nicbar_coll_persistent *persistent, const void *data,
                                   void *result, size_t length, ompi_request_t **out);
int mca_coll_nicbar_barrier_init(struct ompi_communicator_t *comm, struct ompi_info_t *info,
                                 ompi_request_t **request, mca_coll_base_module_t *module);
int mca_coll_nicbar_allreduce_init(const void *sbuf, void *rbuf, int count,
                                   struct ompi_datatype_t *dtype, struct ompi_op_t *op,
                                   struct ompi_communicator_t *comm, struct ompi_info_t *info,
                                   ompi_request_t **request, mca_coll_base_module_t *module);
int mca_coll_nicbar_reduce_init(const void *sbuf, void *rbuf, int count,
                                struct ompi_datatype_t *dtype, struct ompi_op_t *op, int root,
                                struct ompi_communicator_t *comm, struct ompi_info_t *info,
                                ompi_request_t **request, mca_coll_base_module_t *module);
int mca_coll_nicbar_failure_code(ompi_communicator_t *comm, const char *operation,
                                 int failed_rank, const char *reason);
int mca_coll_nicbar_enable(mca_coll_base_module_t *module, struct ompi_communicator_t *comm);

int mca_coll_nicbar_bcast(void *buffer, int count, struct ompi_datatype_t *dtype, int root,
                          struct ompi_communicator_t *comm, mca_coll_base_module_t *module);
int mca_coll_nicbar_scatter(const void *sbuf, int scount, struct ompi_datatype_t *sdtype,
                            void *rbuf, int rcount, struct ompi_datatype_t *rdtype, int root,
                            struct ompi_communicator_t *comm, mca_coll_base_module_t *module);
int mca_coll_nicbar_gather(const void *sbuf, int scount, struct ompi_datatype_t *sdtype,
                           void *rbuf, int rcount, struct ompi_datatype_t *rdtype, int root,
                           struct ompi_communicator_t *comm, mca_coll_base_module_t *module);
int mca_coll_nicbar_scatterv(const void *sbuf, const int *scounts, const int *displs,
                             struct ompi_datatype_t *sdtype, void *rbuf, int rcount,
                             struct ompi_datatype_t *rdtype, int root,
                             struct ompi_communicator_t *comm, mca_coll_base_module_t *module);
int mca_coll_nicbar_gatherv(const void *sbuf, int scount, struct ompi_datatype_t *sdtype,
                            void *rbuf, const int *rcounts, const int *displs,
                            struct ompi_datatype_t *rdtype, int root,
                            struct ompi_communicator_t *comm, mca_coll_base_module_t *module);
int mca_coll_nicbar_alltoall(const void *sbuf, int scount, struct ompi_datatype_t *sdtype,
                             void *rbuf, int rcount, struct ompi_datatype_t *rdtype,
                             struct ompi_communicator_t *comm, mca_coll_base_module_t *module);
int mca_coll_nicbar_alltoallv(const void *sbuf, const int *scounts, const int *sdispls,
                              struct ompi_datatype_t *sdtype, void *rbuf, const int *rcounts,
                              const int *rdispls, struct ompi_datatype_t *rdtype,
                              struct ompi_communicator_t *comm, mca_coll_base_module_t *module);
void mca_coll_nicbar_finalize_requests(void);

END_C_DECLS

#endif
