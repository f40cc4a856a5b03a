/*
 * armci.h: ARMCI, the one-sided communication library, over nicbar's NIC RDMA and atomics.
 *
 * Link with -larmci (libarmci.so or libarmci.a of the nicbar-armci crate). Start the ranks with
 * nicbar-armci-run (or mpirun) against a running NIC daemon (nicctl emulate):
 *
 *     nicctl emulate --units 4 &
 *     nicbar-armci-run -n 4 --units 4 ./my_program
 *
 * Every call is made from one thread of the process. Remote addresses are those ARMCI_Malloc
 * returns (rank r's memory is ptr_arr[r] and what follows it); a put, get, accumulate or
 * read-modify-write is carried out by the target's NIC, with no help from the target process.
 *
 * The synchronisation runs as the environment chooses, the same on every rank:
 *   NICBAR_ARMCI_FENCE    sequential | outstanding:K (default outstanding:8) | completions
 *   NICBAR_ARMCI_BARRIER  fence | fused (default)
 *   NICBAR_ARMCI_LOCK     ticket | mcs (default)
 *
 * Calls returning int return 0, or a negative code on failure (nicbar_armci_last_error() says
 * why). Calls returning void end the process with status 1 and a message on stderr if they fail,
 * as ARMCI does.
 */
#ifndef NICBAR_ARMCI_H
#define NICBAR_ARMCI_H

#ifdef __cplusplus
extern "C" {
#endif

/* ARMCI_Malloc's length type. */
typedef long armci_size_t;

/* ARMCI_Rmw operations. */
#define ARMCI_FETCH_AND_ADD 88      /* int:  *ploc = *prem; *prem += extra */
#define ARMCI_FETCH_AND_ADD_LONG 89 /* long: *ploc = *prem; *prem += extra */
#define ARMCI_SWAP 90               /* int:  exchange *ploc and *prem */
#define ARMCI_SWAP_LONG 91          /* long: exchange *ploc and *prem */

/* ARMCI_Acc element types: dst[i] += scale * src[i]. */
#define ARMCI_ACC_INT 101
#define ARMCI_ACC_DBL 102
#define ARMCI_ACC_FLT 103
#define ARMCI_ACC_LNG 106

/* Starts ARMCI in this process (collective): the rank and size from nicbar-armci-run
 * (NICBAR_ARMCI_RANK, NICBAR_ARMCI_SIZE) or mpirun (OMPI_COMM_WORLD_RANK, _SIZE), a port of its
 * own on the NIC, and every rank's port from the rendezvous directory (NICBAR_ARMCI_DIR). */
int ARMCI_Init(void);

/* ARMCI_Init for programs that pass main's arguments (not needed here); whether ARMCI runs. */
int ARMCI_Init_args(int *argc, char ***argv);
int ARMCI_Initialized(void);

/* Ends ARMCI (collective): every put completes, a last barrier, the port closes. */
void ARMCI_Finalize(void);

/* This rank, and the number of ranks. */
int armci_msg_me(void);
int armci_msg_nproc(void);

/* Allocates bytes of memory here that every rank may reach (collective over the default group,
 * by default every rank; each rank may ask for a
 * different length, 0 for none); ptr_arr[r] receives rank r's address (NULL for none). A port
 * registers at most 16 regions: about 13 allocations may be live at once. */
int ARMCI_Malloc(void *ptr_arr[], armci_size_t bytes);

/* Frees the allocation whose address here is ptr (collective; puts to it complete first). */
int ARMCI_Free(void *ptr);

/* ARMCI's armci_die: prints "rank:msg: code" on stdout and stderr and aborts the process. */
void ARMCI_Error(const char *msg, int code);

/* Local memory for transfer buffers (the C heap's; NULL if none is left), and its release
 * (NULL is accepted). */
void *ARMCI_Malloc_local(armci_size_t bytes);
int ARMCI_Free_local(void *ptr);

/* Copies bytes from src here to dst in rank proc's memory. Returns once src may be reused; the
 * bytes are in proc's memory after ARMCI_Fence, ARMCI_AllFence or ARMCI_Barrier. */
int ARMCI_Put(void *src, void *dst, int bytes, int proc);

/* ARMCI_Put, then *flag = value in proc's memory (flag in ARMCI_Malloc'ed memory), landing after
 * the bytes: a process that sees the flag set sees the bytes. Returns once src may be reused. */
int ARMCI_Put_flag(void *src, void *dst, int bytes, int *flag, int value, int proc);

/* Copies bytes from src in rank proc's memory to dst here; returns once they are here. */
int ARMCI_Get(void *src, void *dst, int bytes, int proc);

/* dst[i] += *scale * src[i] over bytes bytes of elements of optype (ARMCI_ACC_*), atomic with
 * respect to every other accumulate into proc's memory; complete at proc on return. */
int ARMCI_Acc(int optype, void *scale, void *src, void *dst, int bytes, int proc);

/* One value put to dst at proc (as ARMCI_Put), or read from src at proc (as ARMCI_Get; a failure
 * ends the process). */
int ARMCI_PutValueInt(int src, void *dst, int proc);
int ARMCI_PutValueLong(long src, void *dst, int proc);
int ARMCI_PutValueFloat(float src, void *dst, int proc);
int ARMCI_PutValueDouble(double src, void *dst, int proc);
int ARMCI_GetValueInt(void *src, int proc);
long ARMCI_GetValueLong(void *src, int proc);
float ARMCI_GetValueFloat(void *src, int proc);
double ARMCI_GetValueDouble(void *src, int proc);

/* Atomic read-modify-write (ARMCI_FETCH_AND_ADD, _LONG, ARMCI_SWAP, _LONG) of the int or long
 * at prem in proc's memory (aligned to its size); its previous value goes to *ploc. */
int ARMCI_Rmw(int op, void *ploc, void *prem, int extra, int proc);

/* ---- strided and vector transfers ----
 * A strided transfer moves count[0] bytes at each point of the count[1] x ... x
 * count[stride_levels] grid; src_stride_arr[l] and dst_stride_arr[l] are the byte distances
 * between neighbours at level l+1 (0 to ARMCI_MAX_STRIDE_LEVEL levels). Levels whose stride is
 * the run below them on both sides merge, and each contiguous run is one NIC put or get (never
 * one per element). A vector transfer moves each descriptor's ptr_array_len segments of bytes
 * bytes, one NIC operation per segment. Completion as for ARMCI_Put, ARMCI_Get and ARMCI_Acc;
 * an accumulate holds proc's accumulate lock once for all its runs. */
#define ARMCI_MAX_STRIDE_LEVEL 8

typedef struct {
    void **src_ptr_array;
    void **dst_ptr_array;
    int ptr_array_len;
    int bytes;
} armci_giov_t;

int ARMCI_PutS(void *src_ptr, int src_stride_arr[], void *dst_ptr, int dst_stride_arr[],
               int count[], int stride_levels, int proc);
int ARMCI_GetS(void *src_ptr, int src_stride_arr[], void *dst_ptr, int dst_stride_arr[],
               int count[], int stride_levels, int proc);
int ARMCI_AccS(int optype, void *scale, void *src_ptr, int src_stride_arr[], void *dst_ptr,
               int dst_stride_arr[], int count[], int stride_levels, int proc);
int ARMCI_PutV(armci_giov_t darr[], int len, int proc);
int ARMCI_GetV(armci_giov_t darr[], int len, int proc);
int ARMCI_AccV(int op, void *scale, armci_giov_t darr[], int len, int proc);

/* ---- non-blocking transfers ----
 * A handle gathers the operations made under it until ARMCI_Wait (or an ARMCI_Test that
 * reports them done): a put is done when the NIC reports its bytes in the target's memory
 * (remote completion, stronger than ARMCI asks), a get when its bytes are here. The source of a
 * put may be reused as soon as the call returns; the destination of a get must stay until the
 * wait. An accumulate is done before its call returns. A NULL handle puts the operation under
 * the target's implicit handle, waited for by ARMCI_WaitProc and ARMCI_WaitAll. */
typedef struct {
    int data[4];
    double dummy[8];
} armci_hdl_t;

#define ARMCI_INIT_HANDLE(hdl)                                                        \
    do {                                                                              \
        (hdl)->data[0] = 0;                                                           \
        (hdl)->data[1] = 0;                                                           \
        (hdl)->data[2] = 0;                                                           \
        (hdl)->data[3] = 0;                                                           \
    } while (0)

/* Aggregation hints: every handle here already gathers its operations. */
void ARMCI_SET_AGGREGATE_HANDLE(armci_hdl_t *nb_handle);
void ARMCI_UNSET_AGGREGATE_HANDLE(armci_hdl_t *nb_handle);

int ARMCI_NbPut(void *src, void *dst, int bytes, int proc, armci_hdl_t *nb_handle);
int ARMCI_NbGet(void *src, void *dst, int bytes, int proc, armci_hdl_t *nb_handle);
int ARMCI_NbAcc(int optype, void *scale, void *src, void *dst, int bytes, int proc,
                armci_hdl_t *nb_handle);
int ARMCI_NbPutS(void *src_ptr, int src_stride_arr[], void *dst_ptr, int dst_stride_arr[],
                 int count[], int stride_levels, int proc, armci_hdl_t *nb_handle);
int ARMCI_NbGetS(void *src_ptr, int src_stride_arr[], void *dst_ptr, int dst_stride_arr[],
                 int count[], int stride_levels, int proc, armci_hdl_t *nb_handle);
int ARMCI_NbAccS(int optype, void *scale, void *src_ptr, int src_stride_arr[], void *dst_ptr,
                 int dst_stride_arr[], int count[], int stride_levels, int proc,
                 armci_hdl_t *nb_handle);
int ARMCI_NbPutV(armci_giov_t darr[], int len, int proc, armci_hdl_t *nb_handle);
int ARMCI_NbGetV(armci_giov_t darr[], int len, int proc, armci_hdl_t *nb_handle);
int ARMCI_NbAccV(int op, void *scale, armci_giov_t darr[], int len, int proc,
                 armci_hdl_t *nb_handle);

/* Waits for the handle's operations (0, or a negative code if one failed); the handle is then
 * free for new ones. */
int ARMCI_Wait(armci_hdl_t *nb_handle);
/* 0 if the handle's operations are done (as after ARMCI_Wait), 1 if not yet; never blocks. */
int ARMCI_Test(armci_hdl_t *nb_handle);
/* Waits for the operations made with a NULL handle: all of them, or those to proc. */
int ARMCI_WaitAll(void);
int ARMCI_WaitProc(int proc);

/* Returns once every put from here to proc (ARMCI_Fence) or to anyone (ARMCI_AllFence) is in
 * its target's memory. */
void ARMCI_Fence(int proc);
void ARMCI_AllFence(void);

/* Returns once every rank called it, and every put any rank issued before it is in its
 * target's memory (collective). */
void ARMCI_Barrier(void);

/* Creates num mutexes on this rank (collective; ranks may create different numbers), and
 * destroys every rank's (collective). */
int ARMCI_Create_mutexes(int num);
int ARMCI_Destroy_mutexes(void);

/* Waits until this rank holds mutex `mutex` of rank proc, in FIFO order; gives it up. Fence
 * the puts made under the mutex before unlocking it, as ARMCI requires. A rank that died holding
 * the mutex, or queued ahead of this one, makes ARMCI_Lock print which and exit (no wait for
 * ever); ticket-lock waits give up after the collective timeout. */
void ARMCI_Lock(int mutex, int proc);
void ARMCI_Unlock(int mutex, int proc);

/* ---- process groups ----
 * A group is a list of ranks, named by an ARMCI_Group; the world group holds every rank.
 * ARMCI_Group_create is collective over the default group (every member calls it, in the same
 * order, members of the new group or not); pid_list names ranks of the default group. The
 * transfers always take absolute ranks (ARMCI_Absolute_id translates). ARMCI_Malloc and
 * ARMCI_Free run over the default group. */
typedef int ARMCI_Group;

void ARMCI_Group_create(int n, int *pid_list, ARMCI_Group *group_out);
void ARMCI_Group_free(ARMCI_Group *group);
/* This rank's place in the group (-1 if not a member); the group's size. */
int ARMCI_Group_rank(ARMCI_Group *group, int *rank);
void ARMCI_Group_size(ARMCI_Group *group, int *size);
void ARMCI_Group_set_default(ARMCI_Group *group);
void ARMCI_Group_get_default(ARMCI_Group *group_out);
void ARMCI_Group_get_world(ARMCI_Group *group_out);
int ARMCI_Absolute_id(ARMCI_Group *group, int group_rank);
/* ARMCI_Malloc and ARMCI_Free over the group's members; ptr_arr[i] is group rank i's. */
int ARMCI_Malloc_group(void *ptr_arr[], armci_size_t bytes, ARMCI_Group *group);
int ARMCI_Free_group(void *ptr, ARMCI_Group *group);

/* ---- armci_msg collectives ----
 * Over every rank, or a group's members (root a group rank there), each member passing the same
 * length. The barrier is the NIC's (no fence: ARMCI_Barrier is the one that completes puts); a
 * broadcast is the NIC's broadcast of where the root staged its bytes, which every member then
 * gets by RDMA; a reduction ("+", "*", "max", "min", "absmax", "absmin", and for integers "or")
 * combines every member's vector in rank order at the first member, so every member gets the
 * same bits. A failure prints why and ends the process. */
void armci_msg_barrier(void);
void armci_msg_group_barrier(ARMCI_Group *group);
void armci_msg_brdcst(void *buffer, int len, int root);
void armci_msg_bcast(void *buffer, int len, int root);
void armci_msg_group_bcast(void *buffer, int len, int root, ARMCI_Group *group);
void armci_msg_igop(int *x, int n, char *op);
void armci_msg_lgop(long *x, int n, char *op);
void armci_msg_llgop(long long *x, int n, char *op);
void armci_msg_fgop(float *x, int n, char *op);
void armci_msg_dgop(double *x, int n, char *op);
void armci_msg_group_igop(int *x, int n, char *op, ARMCI_Group *group);
void armci_msg_group_lgop(long *x, int n, char *op, ARMCI_Group *group);
void armci_msg_group_llgop(long long *x, int n, char *op, ARMCI_Group *group);
void armci_msg_group_fgop(float *x, int n, char *op, ARMCI_Group *group);
void armci_msg_group_dgop(double *x, int n, char *op, ARMCI_Group *group);

/* What the last failed call of this thread said (never NULL). */
const char *nicbar_armci_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* NICBAR_ARMCI_H */
