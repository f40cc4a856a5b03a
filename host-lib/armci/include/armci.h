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

/* Ends ARMCI (collective): every put completes, a last barrier, the port closes. */
void ARMCI_Finalize(void);

/* This rank, and the number of ranks. */
int armci_msg_me(void);
int armci_msg_nproc(void);

/* Allocates bytes of memory here that every rank may reach (collective; each rank may ask for a
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

/* Atomic read-modify-write (ARMCI_FETCH_AND_ADD, _LONG, ARMCI_SWAP, _LONG) of the int or long
 * at prem in proc's memory (aligned to its size); its previous value goes to *ploc. */
int ARMCI_Rmw(int op, void *ploc, void *prem, int extra, int proc);

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

/* What the last failed call of this thread said (never NULL). */
const char *nicbar_armci_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* NICBAR_ARMCI_H */
