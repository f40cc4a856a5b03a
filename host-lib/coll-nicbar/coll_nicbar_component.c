/*
 * coll/nicbar: the component: MCA parameters, the process's port (opened once, published through
 * the modex), and the choice for each communicator.
 */
#include "coll_nicbar.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "opal/mca/base/mca_base_var.h"
#include "opal/mca/pmix/pmix.h"
#include "opal/runtime/opal_progress.h"
#include "opal/util/output.h"
#include "ompi/mca/coll/base/base.h"
#include "ompi/proc/proc.h"
#include "orte/util/proc_info.h"

static int nicbar_register(void);
static int nicbar_open(void);
static int nicbar_close(void);

mca_coll_nicbar_component_t mca_coll_nicbar_component = {
    .super = {
        .collm_version = {
            MCA_COLL_BASE_VERSION_2_0_0,
            .mca_component_name = "nicbar",
            MCA_BASE_MAKE_VERSION(component, OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION,
                                  OMPI_RELEASE_VERSION),
            .mca_open_component = nicbar_open,
            .mca_close_component = nicbar_close,
            .mca_register_component_params = nicbar_register,
        },
        .collm_data = {
            MCA_BASE_METADATA_PARAM_CHECKPOINT
        },
        .collm_init_query = mca_coll_nicbar_init_query,
        .collm_comm_query = mca_coll_nicbar_comm_query,
    },
    .priority = 40,
    .algorithm = NICBAR_COLL_ALGORITHM_DEFAULT,
    .dissemination_n = 1,
    .gb_dimension = 2,
    .timeout_ms = 0,
    .verbose = 0,
    .unit = -1,
    .spin = -1,
    .bcast_algorithm = 0,
    .scatter_algorithm = 0,
    .gather_algorithm = 0,
    .alltoall_algorithm = 0,
    /* Off by default: over the emulated NIC's messages a long allreduce at 8 processes on two
     * cores measured 1.0 to 2.0 times slower than Open MPI's own over TCP (docs/mpi.md). */
    .allreduce_algorithm = -1,
    .reproducible_sum = 0,
    .segment = 0,
    .map = NULL,
    .endpoint = NULL,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .error_class = MPI_UNDEFINED,
};

#define C mca_coll_nicbar_component

/* One line under verbose >= level, prefixed with the component and this process's rank. */
#define NICBAR_VERBOSE(level, ...)                                                  \
    do {                                                                            \
        if (C.verbose >= (level)) {                                                 \
            char _line[512];                                                        \
            snprintf(_line, sizeof _line, __VA_ARGS__);                             \
            opal_output(0, "coll:nicbar: rank %u: %s", OMPI_PROC_MY_NAME->vpid, _line); \
        }                                                                           \
    } while (0)

static void register_int(const char *name, const char *help, int *storage)
{
    (void) mca_base_component_var_register(&C.super.collm_version, name, help,
                                           MCA_BASE_VAR_TYPE_INT, NULL, 0, 0,
                                           OPAL_INFO_LVL_5, MCA_BASE_VAR_SCOPE_READONLY, storage);
}

static int nicbar_register(void)
{
    register_int("priority",
                 "Priority of the NIC barrier (-1 switches it off; Open MPI's tuned is 30)",
                 &C.priority);
    register_int("algorithm",
                 "Barrier algorithm in the NIC: 0 the library's default for the size, 1 pairwise "
                 "exchange, 2 gather-broadcast, 3 n-way dissemination",
                 &C.algorithm);
    register_int("dissemination_n", "Peers per round of the n-way dissemination barrier",
                 &C.dissemination_n);
    register_int("gb_dimension", "Children per node of the gather-broadcast tree",
                 &C.gb_dimension);
    register_int("timeout", "A barrier fails after this many milliseconds (0: the NIC's default)",
                 &C.timeout_ms);
    register_int("verbose",
                 "1: say why the component is off and how many barriers went through the NIC; "
                 "2: one line per communicator",
                 &C.verbose);
    register_int("unit",
                 "NIC unit of the local daemon (-1: the first free port, filling unit 0 first; "
                 "-2: spread the host's processes over the units by local rank)",
                 &C.unit);
    register_int("spin",
                 "Polls of a blocking barrier or data collective before it sleeps on the port "
                 "between polls (-1: 2000 where the host has a core for the NIC beside one for "
                 "each of its processes, else 200, and there every poll that finds nothing gives "
                 "the core away)",
                 &C.spin);
    register_int("bcast_algorithm",
                 "MPI_Bcast over the NIC: -1 off (the component below serves), 0 chosen by the "
                 "selection map (coll_nicbar_map) or size, 1 linear, 2 binomial, 3 binary, "
                 "4 split-binary, 5 pipeline, 6 nic (up to 32 bytes carried by the NIC's "
                 "barrier engine; longer messages take the choice by size)",
                 &C.bcast_algorithm);
    register_int("scatter_algorithm",
                 "MPI_Scatter[v] over the NIC: -1 off, 0 chosen by the map or size, 1 flat, "
                 "2 binomial (MPI_Scatterv is always flat)",
                 &C.scatter_algorithm);
    register_int("gather_algorithm",
                 "MPI_Gather[v] over the NIC: -1 off, 0 chosen by the map or size, 1 flat, "
                 "2 binomial (MPI_Gatherv is always flat)",
                 &C.gather_algorithm);
    register_int("alltoall_algorithm",
                 "MPI_Alltoall[v] over the NIC: -1 off, 0 chosen by the map or size, 1 linear, "
                 "2 pairwise, 3 Bruck (MPI_Alltoallv: linear or pairwise)",
                 &C.alltoall_algorithm);
    register_int("allreduce_algorithm",
                 "MPI_Allreduce and MPI_Reduce over the NIC's messages, for what the NIC does "
                 "not combine (more than 32 bytes, user operations) on predefined types: -1 off "
                 "(the default: the component below serves), 0 chosen by the map or size, 1 recursive "
                 "doubling, 2 Rabenseifner's, 3 ring (operations that do not commute always "
                 "take recursive doubling)",
                 &C.allreduce_algorithm);
    register_int("reproducible_sum",
                 "1: MPI_SUM of one MPI_FLOAT or MPI_DOUBLE in MPI_Allreduce, MPI_Reduce and "
                 "their non-blocking and persistent forms is the NIC's reproducible sum (the "
                 "same bits whatever the number of processes or the order of the additions: the "
                 "exact sum, each value cut at least 64 bits under the largest magnitude's "
                 "leading bit, rounded once); 0: IEEE additions in the NIC's fixed order",
                 &C.reproducible_sum);
    register_int("segment",
                 "Bytes per segment of the binary, split-binary and pipeline broadcasts (0: "
                 "32768)",
                 &C.segment);
    (void) mca_base_component_var_register(
        &C.super.collm_version, "map",
        "Selection map for the data collectives' algorithm 0, as `cargo xtask tune` writes it (empty: $NICBAR_COLL_MAP, else $XDG_CONFIG_HOME/nicbar/coll-map, else "
        "~/.config/nicbar/coll-map; \"off\": none, the library's defaults)",
        MCA_BASE_VAR_TYPE_STRING, NULL, 0, 0, OPAL_INFO_LVL_5, MCA_BASE_VAR_SCOPE_READONLY,
        &C.map);
    return OMPI_SUCCESS;
}

static int nicbar_open(void)
{
    return OMPI_SUCCESS;
}

static int nicbar_close(void)
{
    if (NULL != C.endpoint) {
        (void) opal_progress_unregister(mca_coll_nicbar_progress);
        mca_coll_nicbar_finalize_requests();
        uint64_t resent = 0, dropped = 0, put = 0, landed = 0, forwarded = 0;
        nicbar_coll_transfer_counters(C.endpoint, &resent, &dropped);
        nicbar_coll_protocol_counters(C.endpoint, &put, &landed, &forwarded);
        NICBAR_VERBOSE(1, "%llu barriers went through the NIC (node %u port %u); %llu data "
                          "collectives went over it (%llu segments sent again, %llu arrivals "
                          "dropped; %llu messages sent and %llu received by rendezvous, %llu "
                          "segments forwarded)",
                       (unsigned long long) nicbar_coll_completed(C.endpoint),
                       (unsigned) nicbar_coll_node_id(C.endpoint),
                       (unsigned) nicbar_coll_port_id(C.endpoint),
                       (unsigned long long) nicbar_coll_collectives(C.endpoint),
                       (unsigned long long) resent, (unsigned long long) dropped,
                       (unsigned long long) put, (unsigned long long) landed,
                       (unsigned long long) forwarded);
        NICBAR_VERBOSE(1, "%llu reductions were combined in the NIC",
                       (unsigned long long) mca_coll_nicbar_reductions());
        nicbar_coll_close(C.endpoint);
        C.endpoint = NULL;
    }
    return OMPI_SUCCESS;
}

/*
 * Opens this process's port and publishes it. Every process publishes an address, reachable or
 * not, so that every member of a communicator decides the same way in comm_query.
 */
int mca_coll_nicbar_init_query(bool enable_progress_threads, bool enable_mpi_threads)
{
    mca_coll_nicbar_address_t address = {0, 0, 0};
    char error[256] = "";
    int rc;
    (void) enable_progress_threads;
    (void) enable_mpi_threads;

    if (C.priority < 0) {
        return OMPI_ERR_NOT_AVAILABLE;
    }
    {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        long processes = (long) orte_process_info.num_local_peers + 1;
        C.no_core_for_nic = cores <= processes;
    }
    if (C.spin < 0) {
        /* With a core to spare, a process spins through a whole NIC collective as Open MPI's
         * own progress does: on 16 cores, 200 polls ran out inside an 8-process allreduce of
         * 30 µs, and the wake-up after it cost a fifth of its time. Without one, the spin
         * yields the core, and a short one leaves it to the NIC's thread sooner. */
        C.spin = C.no_core_for_nic ? 200 : 2000;
    }
    if (-2 == C.unit) {
        /* Spread this host's processes over the daemon's units, from unit local-rank on. */
        int local_rank = ORTE_LOCAL_RANK_INVALID == orte_process_info.my_local_rank
                             ? 0
                             : (int) orte_process_info.my_local_rank;
        C.endpoint = nicbar_coll_open(-1 - local_rank, error, sizeof error);
    } else {
        C.endpoint = nicbar_coll_open(C.unit < 0 ? -1 : C.unit, error, sizeof error);
    }
    if (NULL != C.endpoint) {
        address.node = nicbar_coll_node_id(C.endpoint);
        address.port = nicbar_coll_port_id(C.endpoint);
        address.reachable = 1;
    }
    OPAL_MODEX_SEND(rc, OPAL_PMIX_GLOBAL, &C.super.collm_version, &address, sizeof address);
    /* Components are queried after MPI_Init's exchange: commit, so that peers fetch it. */
    if (OPAL_SUCCESS == rc && NULL != opal_pmix.commit) {
        rc = opal_pmix.commit();
    }
    if (NULL == C.endpoint) {
        NICBAR_VERBOSE(1, "no NIC reachable, Open MPI's own barriers serve: %s", error);
        return OMPI_ERR_NOT_AVAILABLE;
    }
    if (OPAL_SUCCESS != rc) {
        NICBAR_VERBOSE(1, "could not publish the port through the modex (%d), Open MPI's own "
                          "barriers serve", rc);
        nicbar_coll_close(C.endpoint);
        C.endpoint = NULL;
        return OMPI_ERR_NOT_AVAILABLE;
    }
    NICBAR_VERBOSE(2, "port %u of node %u", (unsigned) address.port, (unsigned) address.node);
    {
        /* The selection map for the data collectives' algorithm 0: the same file on every rank,
         * or ranks would choose different algorithms. A refused map is said at any verbosity. */
        char said[512] = "";
        int loaded = nicbar_coll_map_load(C.map, said, sizeof said);
        if (NICBAR_COLL_MAP_REFUSED == loaded) {
            opal_output(0, "coll:nicbar: rank %u: %s", OMPI_PROC_MY_NAME->vpid, said);
        } else {
            NICBAR_VERBOSE(2, "%s", said);
        }
    }
    opal_progress_register(mca_coll_nicbar_progress);
    return OMPI_SUCCESS;
}

/* The address `peer` published, or reachable = 0 if none. */
static mca_coll_nicbar_address_t lookup(ompi_communicator_t *comm, int peer)
{
    mca_coll_nicbar_address_t none = {0, 0, 0}, result = none;
    mca_coll_nicbar_address_t *address = NULL;
    size_t size = 0;
    int rc;
    ompi_proc_t *proc = ompi_comm_peer_lookup(comm, peer);
    if (NULL == proc) {
        return none;
    }
    OPAL_MODEX_RECV(rc, &C.super.collm_version, &proc->super.proc_name, (void **) &address,
                    &size);
    if (OPAL_SUCCESS == rc && NULL != address && size == sizeof *address) {
        result = *address;
    } else {
        NICBAR_VERBOSE(2, "%s: no address of rank %d in the modex (%d)", comm->c_name, peer, rc);
    }
    free(address);
    return result;
}

mca_coll_base_module_t *mca_coll_nicbar_comm_query(struct ompi_communicator_t *comm,
                                                   int *priority)
{
    int size = ompi_comm_size(comm);
    uint16_t *nodes;
    uint8_t *ports;
    uint32_t parameter = 0;
    char error[256] = "";
    nicbar_coll_group *group;
    mca_coll_nicbar_module_t *module;

    if (NULL == C.endpoint || C.priority < 0 || OMPI_COMM_IS_INTER(comm) || size < 2) {
        return NULL;
    }
    nodes = malloc(size * sizeof *nodes);
    ports = malloc(size * sizeof *ports);
    if (NULL == nodes || NULL == ports) {
        free(nodes);
        free(ports);
        return NULL;
    }
    for (int rank = 0; rank < size; rank++) {
        mca_coll_nicbar_address_t address = lookup(comm, rank);
        if (!address.reachable) {
            NICBAR_VERBOSE(2, "%s: rank %d has no NIC port, Open MPI's own barriers serve",
                           comm->c_name, rank);
            free(nodes);
            free(ports);
            return NULL;
        }
        nodes[rank] = address.node;
        ports[rank] = address.port;
    }
    if (NICBAR_COLL_ALGORITHM_DISSEMINATION == C.algorithm) {
        parameter = (uint32_t) (C.dissemination_n > 0 ? C.dissemination_n : 1);
    } else if (NICBAR_COLL_ALGORITHM_GATHER_BROADCAST == C.algorithm) {
        parameter = (uint32_t) (C.gb_dimension > 0 ? C.gb_dimension : 2);
    }
    group = nicbar_coll_group_new(nodes, ports, (size_t) size, C.algorithm, parameter,
                                  (uint32_t) (C.timeout_ms > 0 ? C.timeout_ms : 0), error,
                                  sizeof error);
    free(nodes);
    free(ports);
    if (NULL == group) {
        NICBAR_VERBOSE(1, "%s: no NIC barrier group, Open MPI's own barriers serve: %s",
                       comm->c_name, error);
        return NULL;
    }
    module = OBJ_NEW(mca_coll_nicbar_module_t);
    if (NULL == module) {
        nicbar_coll_group_free(group);
        return NULL;
    }
    /* The communicator's own barrier identity: the job and the context id, numbered afresh (a
     * freed communicator's context id comes back for another group of ranks). */
    nicbar_coll_group_set_id(C.endpoint, group, (uint32_t) OMPI_PROC_MY_NAME->jobid,
                             (uint32_t) comm->c_contextid);
    module->group = group;
    module->super.coll_module_enable = mca_coll_nicbar_enable;
    module->super.coll_barrier = mca_coll_nicbar_barrier;
    module->super.coll_ibarrier = mca_coll_nicbar_ibarrier;
    module->super.coll_bcast = mca_coll_nicbar_bcast;
    module->super.coll_scatter = mca_coll_nicbar_scatter;
    module->super.coll_scatterv = mca_coll_nicbar_scatterv;
    module->super.coll_gather = mca_coll_nicbar_gather;
    module->super.coll_gatherv = mca_coll_nicbar_gatherv;
    module->super.coll_alltoall = mca_coll_nicbar_alltoall;
    module->super.coll_alltoallv = mca_coll_nicbar_alltoallv;
    module->super.coll_allreduce = mca_coll_nicbar_allreduce;
    module->super.coll_reduce = mca_coll_nicbar_reduce;
    module->super.coll_iallreduce = mca_coll_nicbar_iallreduce;
    module->super.coll_ireduce = mca_coll_nicbar_ireduce;
    module->super.coll_barrier_init = mca_coll_nicbar_barrier_init;
    module->super.coll_allreduce_init = mca_coll_nicbar_allreduce_init;
    module->super.coll_reduce_init = mca_coll_nicbar_reduce_init;
    *priority = C.priority;
    NICBAR_VERBOSE(2, "%s (context %u, %d ranks): barriers and short reductions in the NIC, data collectives over it",
                   comm->c_name,
                   (unsigned) comm->c_contextid, size);
    return &module->super;
}
