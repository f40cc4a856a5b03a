/*
 * barrier.c: NIC-based barriers (paper 5.2) between processes, in each of the forms the C API
 * offers.
 *
 *     barrier UNIT NODES FORM [ITERATIONS [TIMEOUT_US]]
 *
 * NODES processes take part, one per node 0..NODES-1, each on port 2; this one opens NIC UNIT.
 * FORM is how the barrier is started:
 *
 *   pe             gm_barrier_send_with_callback with the recursive-doubling partners
 *                  (NODES a power of two)
 *   gb             gm_gb_barrier_send_with_callback over a binary tree rooted at node 0
 *   dissemination  gm_dissemination_barrier_send_with_callback, one peer per round
 *   group          nicbar_barrier over all NODES, the library's default algorithm
 *
 * Each iteration waits a little (a different time on each node), prints "enter K T", runs the
 * barrier and prints "leave K T", with T the CLOCK_MONOTONIC time in nanoseconds: no process may
 * leave barrier K before every process has entered it. With TIMEOUT_US the NIC fails a barrier
 * that waits longer; a failure prints the member it waited for and exits 3.
 *
 * Build: cc -o barrier barrier.c $(pkg-config --cflags --libs nicbar)
 * Run:   nicctl emulate --units 4 &   then   for u in 0 1 2 3; do ./barrier $u 4 pe & done; wait
 */
#define _POSIX_C_SOURCE 200809L

#include <nicbar/gm.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PORT_ID 2
#define MAX_NODES 64

static struct gm_port *port;
static unsigned int me, nodes;
static int callbacks;
static gm_status_t callback_status;

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void fail(const char *what, gm_status_t status)
{
    fprintf(stderr, "barrier: node %u: %s: %s (%s)\n", me, what, gm_strerror(status),
            nicbar_last_error());
    exit(1);
}

static void barrier_done(struct gm_port *p, void *context, gm_status_t status)
{
    (void)p;
    (void)context;
    callbacks++;
    callback_status = status;
}

static gm_barrier_peer_t peer(unsigned int node)
{
    gm_barrier_peer_t p;
    p.node_id = node;
    p.port_id = PORT_ID;
    return p;
}

/* Starts this node's part of a barrier in the NIC, in the form `form`. */
static void start(const char *form, unsigned int iteration)
{
    void *context = (void *)(uintptr_t)(iteration + 1);
    gm_status_t status = gm_provide_barrier_buffer(port);
    if (status != GM_SUCCESS)
        fail("gm_provide_barrier_buffer", status);
    if (strcmp(form, "pe") == 0) {
        gm_barrier_peer_t partners[16];
        unsigned int rounds = 0;
        while ((1u << rounds) < nodes)
            rounds++;
        if ((1u << rounds) != nodes) {
            fprintf(stderr, "barrier: pe needs a power-of-two NODES\n");
            exit(2);
        }
        for (unsigned int r = 0; r < rounds; r++)
            partners[r] = peer(me ^ (1u << r));
        gm_barrier_send_with_callback(port, partners, rounds, barrier_done, context);
    } else if (strcmp(form, "gb") == 0) {
        gm_barrier_peer_t parent = peer(me == 0 ? 0 : (me - 1) / 2), children[2];
        unsigned int count = 0;
        if (2 * me + 1 < nodes)
            children[count++] = peer(2 * me + 1);
        if (2 * me + 2 < nodes)
            children[count++] = peer(2 * me + 2);
        gm_gb_barrier_send_with_callback(port, me == 0 ? NULL : &parent, children, count,
                                         barrier_done, context);
    } else if (strcmp(form, "dissemination") == 0) {
        gm_barrier_round_t rounds[16];
        gm_barrier_peer_t to[16], from[16];
        unsigned int count = 0;
        for (unsigned int distance = 1; distance < nodes; distance *= 2) {
            to[count] = peer((me + distance) % nodes);
            from[count] = peer((me + nodes - distance) % nodes);
            rounds[count].send_to = &to[count];
            rounds[count].send_count = 1;
            rounds[count].receive_from = &from[count];
            rounds[count].receive_count = 1;
            count++;
        }
        gm_dissemination_barrier_send_with_callback(port, rounds, count, barrier_done, context);
    } else {
        fprintf(stderr, "barrier: unknown form %s\n", form);
        exit(2);
    }
}

/* Waits for the end of the barrier started by start(). */
static void wait_for_end(unsigned int iteration)
{
    for (;;) {
        gm_recv_event_t *event = gm_blocking_receive(port);
        switch (GM_RECV_EVENT_TYPE(event)) {
        case GM_BARRIER_COMPLETED_EVENT:
            if (gm_ntohp(event->barrier.context) != (void *)(uintptr_t)(iteration + 1)) {
                fprintf(stderr, "barrier: node %u: the end of another barrier\n", me);
                exit(1);
            }
            gm_unknown(port, event); /* runs the callback */
            return;
        case GM_BARRIER_FAILED_EVENT:
            printf("barrier %u failed waiting for node %u port %u: %s\n", iteration,
                   gm_ntoh_u16(event->barrier.waiting_for_node_id),
                   gm_ntoh_u8(event->barrier.waiting_for_port_id),
                   gm_strerror((gm_status_t)gm_ntoh_u32(event->barrier.status)));
            exit(3);
        default:
            gm_unknown(port, event);
        }
    }
}

int main(int argc, char **argv)
{
    unsigned int unit, iterations = 20, timeout_us = 0, i;
    const char *form;
    gm_barrier_peer_t members[MAX_NODES];
    gm_status_t status;

    if (argc < 4) {
        fprintf(stderr, "usage: barrier UNIT NODES FORM [ITERATIONS [TIMEOUT_US]]\n");
        return 2;
    }
    unit = (unsigned int)strtoul(argv[1], NULL, 0);
    nodes = (unsigned int)strtoul(argv[2], NULL, 0);
    form = argv[3];
    if (argc > 4)
        iterations = (unsigned int)strtoul(argv[4], NULL, 0);
    if (argc > 5)
        timeout_us = (unsigned int)strtoul(argv[5], NULL, 0);
    if (nodes < 1 || nodes > MAX_NODES) {
        fprintf(stderr, "barrier: NODES must be within 1..%d\n", MAX_NODES);
        return 2;
    }

    status = gm_open(&port, unit, PORT_ID, "barrier", GM_API_VERSION);
    if (status != GM_SUCCESS)
        fail("gm_open", status);
    if ((status = gm_get_node_id(port, &me)) != GM_SUCCESS)
        fail("gm_get_node_id", status);
    if (timeout_us > 0 && (status = nicbar_set_barrier_timeout(port, timeout_us)) != GM_SUCCESS)
        fail("nicbar_set_barrier_timeout", status);
    for (i = 0; i < nodes; i++)
        members[i] = peer(i);

    for (i = 0; i < iterations; i++) {
        /* Arrive at different times: up to 2 ms late, differently on each node. */
        struct timespec late = {0, (long)(((me * 7919u + i * 104729u) % 2000u) * 1000u)};
        nanosleep(&late, NULL);
        printf("enter %u %lld\n", i, now_ns());
        fflush(stdout);
        if (strcmp(form, "group") == 0) {
            status = nicbar_barrier(port, members, nodes, NICBAR_BARRIER_DEFAULT, 0);
            if (status != GM_SUCCESS) {
                printf("barrier %u failed: %s (%s)\n", i, gm_strerror(status),
                       nicbar_last_error());
                return 3;
            }
        } else {
            start(form, i);
            wait_for_end(i);
        }
        printf("leave %u %lld\n", i, now_ns());
        fflush(stdout);
    }
    if (strcmp(form, "group") != 0 && (callbacks != (int)iterations || callback_status != GM_SUCCESS)) {
        fprintf(stderr, "barrier: node %u: %d callbacks for %u barriers\n", me, callbacks,
                iterations);
        return 1;
    }
    printf("barrier: node %u of %u: %u %s barriers\n", me, nodes, iterations, form);
    gm_close(port);
    return 0;
}
