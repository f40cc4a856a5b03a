/*
 * coll/nicbar: an Open MPI collective component that runs MPI_Barrier and MPI_Ibarrier in the
 * NIC through the nicbar library. The component is thin: it maps communicators to nicbar groups
 * and nicbar's barrier ends to MPI requests and errors; the barriers themselves, their queueing
 * and their failure reports are the library's (nicbar/gm.h, the nicbar_coll_* calls).
 */
#ifndef MCA_COLL_NICBAR_H
#define MCA_COLL_NICBAR_H

#include "ompi_config.h"

#include <pthread.h>
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
    int spin;           /* polls before a blocking barrier sleeps on the port */
    /* State */
    nicbar_coll_endpoint *endpoint;
    pthread_mutex_t lock; /* serialises calls on the endpoint (MPI_THREAD_MULTIPLE) */
    int error_class;      /* MPI error class of failed barriers, once added */
} mca_coll_nicbar_component_t;

OMPI_MODULE_DECLSPEC extern mca_coll_nicbar_component_t mca_coll_nicbar_component;

typedef struct {
    mca_coll_base_module_t super;
    nicbar_coll_group *group;
} mca_coll_nicbar_module_t;
OBJ_CLASS_DECLARATION(mca_coll_nicbar_module_t);

/* A non-blocking barrier: an Open MPI request completed by the progress function. */
typedef struct {
    ompi_request_t super;
    uint64_t ticket;
} mca_coll_nicbar_request_t;
OBJ_CLASS_DECLARATION(mca_coll_nicbar_request_t);

int mca_coll_nicbar_init_query(bool enable_progress_threads, bool enable_mpi_threads);
mca_coll_base_module_t *mca_coll_nicbar_comm_query(struct ompi_communicator_t *comm,
                                                   int *priority);
int mca_coll_nicbar_barrier(struct ompi_communicator_t *comm, mca_coll_base_module_t *module);
int mca_coll_nicbar_ibarrier(struct ompi_communicator_t *comm, ompi_request_t **request,
                             mca_coll_base_module_t *module);
int mca_coll_nicbar_progress(void);
void mca_coll_nicbar_finalize_requests(void);

END_C_DECLS

#endif
