/*
 * alltoall.c: every process sends a message to every other process, round after round, through
 * the nicbar NIC, and checks every byte it receives.
 *
 *     alltoall UNIT NODES [ROUNDS]
 *
 * NODES processes take part, one per node 0..NODES-1, each on port 2; this one opens NIC UNIT.
 * In each round (default 20) a process sends one message to each peer and waits for one from
 * each. Lengths vary by sender, receiver and round (16 to 2040 bytes); odd rounds travel at high
 * priority. Every message names its sender, round and length and carries a pattern; a process
 * checks all of it, and that each sender's rounds arrive in order. Exits 0 if all did.
 *
 * Build: cc -o alltoall alltoall.c $(pkg-config --cflags --libs nicbar)
 * Run:   nicctl emulate --units 4 &   then   for u in 0 1 2 3; do ./alltoall $u 4 & done; wait
 */
#define _POSIX_C_SOURCE 200809L

#include <nicbar/gm.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PORT_ID 2
#define MAX_NODES 32
#define HEADER 16
#define MAX_LENGTH 2040
#define MAGIC 0x41324131u /* "A2A1" */
#define STARTUP_SECONDS 20

static struct gm_port *port;
static unsigned int me, nodes, size_class;

/* Per peer: the send buffer, whether its send is in flight, how it ended. */
static unsigned char *send_buffer[MAX_NODES];
static int in_flight[MAX_NODES];
static gm_status_t send_status[MAX_NODES];
static unsigned int send_length[MAX_NODES];

/* Messages counted for the current round and the next, and the last round seen per sender. */
static unsigned int received[2];
static int last_round[MAX_NODES];
static unsigned long messages_in, messages_out;

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void die(const char *what)
{
    fprintf(stderr, "alltoall: node %u: %s\n", me, what);
    exit(1);
}

static void fail(const char *what, gm_status_t status)
{
    fprintf(stderr, "alltoall: node %u: %s: %s (%s)\n", me, what, gm_strerror(status),
            nicbar_last_error());
    exit(1);
}

static unsigned int length_of(unsigned int from, unsigned int to, unsigned int round)
{
    return HEADER + (round * 131u + from * 17u + to * 7u) % (MAX_LENGTH - HEADER + 1);
}

static unsigned char pattern(unsigned int from, unsigned int round, unsigned int i)
{
    return (unsigned char)(from * 31u + round * 5u + i);
}

static void put32(unsigned char *at, uint32_t value)
{
    memcpy(at, &value, sizeof value);
}

static uint32_t get32(const unsigned char *at)
{
    uint32_t value;
    memcpy(&value, at, sizeof value);
    return value;
}

static void send_done(struct gm_port *p, void *context, gm_status_t status)
{
    unsigned int peer = (unsigned int)(uintptr_t)context;
    (void)p;
    in_flight[peer] = 0;
    send_status[peer] = status;
    if (status == GM_SUCCESS)
        messages_out++;
}

static unsigned int priority_of(unsigned int round)
{
    return round % 2 ? GM_HIGH_PRIORITY : GM_LOW_PRIORITY;
}

static void send_to(unsigned int peer, unsigned int round)
{
    unsigned char *message = send_buffer[peer];
    unsigned int length = length_of(me, peer, round), i;
    put32(message, MAGIC);
    put32(message + 4, me);
    put32(message + 8, round);
    put32(message + 12, length);
    for (i = HEADER; i < length; i++)
        message[i] = pattern(me, round, i);
    in_flight[peer] = 1;
    send_length[peer] = length;
    gm_send_with_callback(port, message, size_class, length, priority_of(round), peer, PORT_ID,
                          send_done, (void *)(uintptr_t)peer);
}

static void check_message(const unsigned char *message, unsigned int length, unsigned int sender,
                          unsigned int priority, unsigned int round)
{
    unsigned int claimed_round = get32(message + 8), i;
    char why[160];
    if (length < HEADER || get32(message) != MAGIC || get32(message + 4) != sender) {
        snprintf(why, sizeof why, "a damaged header from node %u (%u bytes)", sender, length);
        die(why);
    }
    if (claimed_round != round && claimed_round != round + 1) {
        snprintf(why, sizeof why, "round %u from node %u during round %u", claimed_round, sender,
                 round);
        die(why);
    }
    if ((int)claimed_round != last_round[sender] + 1) {
        snprintf(why, sizeof why, "round %u from node %u after its round %d", claimed_round,
                 sender, last_round[sender]);
        die(why);
    }
    if (priority != priority_of(claimed_round)) {
        snprintf(why, sizeof why, "round %u from node %u at the wrong priority", claimed_round,
                 sender);
        die(why);
    }
    if (get32(message + 12) != length || length != length_of(sender, me, claimed_round)) {
        snprintf(why, sizeof why, "round %u from node %u is %u bytes, not %u", claimed_round,
                 sender, length, length_of(sender, me, claimed_round));
        die(why);
    }
    for (i = HEADER; i < length; i++) {
        if (message[i] != pattern(sender, claimed_round, i)) {
            snprintf(why, sizeof why, "round %u from node %u differs at byte %u", claimed_round,
                     sender, i);
            die(why);
        }
    }
    last_round[sender] = (int)claimed_round;
    received[claimed_round - round]++;
    messages_in++;
}

static void handle_next_event(unsigned int round)
{
    gm_recv_event_t *event = gm_blocking_receive(port);
    unsigned int type = GM_RECV_EVENT_TYPE(event);
    switch (type) {
    case GM_RECV_EVENT:
    case GM_HIGH_RECV_EVENT:
    case GM_PEER_RECV_EVENT:
    case GM_HIGH_PEER_RECV_EVENT:
    case GM_FAST_RECV_EVENT:
    case GM_FAST_HIGH_RECV_EVENT:
    case GM_FAST_PEER_RECV_EVENT:
    case GM_FAST_HIGH_PEER_RECV_EVENT: {
        unsigned char *message =
            gm_memorize_message(gm_ntohp(event->recv.message), gm_ntohp(event->recv.buffer),
                                gm_ntoh_u32(event->recv.length));
        unsigned int priority = type == GM_HIGH_RECV_EVENT || type == GM_HIGH_PEER_RECV_EVENT ||
                                        type == GM_FAST_HIGH_RECV_EVENT ||
                                        type == GM_FAST_HIGH_PEER_RECV_EVENT
                                    ? GM_HIGH_PRIORITY
                                    : GM_LOW_PRIORITY;
        check_message(message, gm_ntoh_u32(event->recv.length),
                      gm_ntoh_u16(event->recv.sender_node_id), priority, round);
        if (gm_ntoh_u8(event->recv.sender_port_id) != PORT_ID)
            die("a message from another port");
        gm_provide_receive_buffer_with_tag(port, message, size_class, priority,
                                           gm_ntoh_u32(event->recv.nicbar_tag));
        break;
    }
    default:
        gm_unknown(port, event);
    }
}

int main(int argc, char **argv)
{
    unsigned int unit, rounds = 20, round, peer, i;
    gm_status_t status;
    double give_up;

    if (argc < 3) {
        fprintf(stderr, "usage: alltoall UNIT NODES [ROUNDS]\n");
        return 2;
    }
    unit = (unsigned int)strtoul(argv[1], NULL, 0);
    nodes = (unsigned int)strtoul(argv[2], NULL, 0);
    if (argc > 3)
        rounds = (unsigned int)strtoul(argv[3], NULL, 0);
    if (nodes < 2 || nodes > MAX_NODES) {
        fprintf(stderr, "alltoall: NODES must be within 2..%d\n", MAX_NODES);
        return 2;
    }

    status = gm_open(&port, unit, PORT_ID, "alltoall", GM_API_VERSION);
    if (status != GM_SUCCESS)
        fail("gm_open", status);
    if ((status = gm_get_node_id(port, &me)) != GM_SUCCESS)
        fail("gm_get_node_id", status);
    if (me >= nodes)
        die("this node id is not below NODES");
    if (gm_num_send_tokens(port) < nodes - 1)
        die("fewer send tokens than peers");

    size_class = gm_min_size_for_length(MAX_LENGTH);
    /* A peer is at most one round ahead, and rounds alternate priorities: one buffer per peer
     * of each priority, and one spare of each. */
    for (i = 0; i < 2 * nodes; i++) {
        void *buffer = gm_dma_malloc(port, gm_max_length_for_size(size_class));
        if (buffer == NULL)
            fail("gm_dma_malloc", GM_OUT_OF_MEMORY);
        gm_provide_receive_buffer_with_tag(port, buffer, size_class,
                                           i % 2 ? GM_HIGH_PRIORITY : GM_LOW_PRIORITY, 1000 + i);
    }
    for (peer = 0; peer < nodes; peer++) {
        last_round[peer] = -1;
        if (peer != me && (send_buffer[peer] = gm_dma_malloc(port, MAX_LENGTH)) == NULL)
            fail("gm_dma_malloc", GM_OUT_OF_MEMORY);
    }

    give_up = now_seconds() + STARTUP_SECONDS;
    for (round = 0; round < rounds; round++) {
        int all_sent;
        for (peer = 0; peer < nodes; peer++)
            if (peer != me)
                send_to(peer, round);
        do {
            all_sent = 1;
            handle_next_event(round);
            for (peer = 0; peer < nodes; peer++) {
                if (peer == me || in_flight[peer])
                    continue;
                if (send_status[peer] == GM_SEND_TARGET_PORT_CLOSED && round == 0 &&
                    now_seconds() < give_up) {
                    /* The peer has not opened its port yet: resume the stalled connection (as
                     * in GM, a failed send stalls it) and send again. */
                    struct timespec pause = {0, 5 * 1000 * 1000};
                    nanosleep(&pause, NULL);
                    gm_resume_sending(port, GM_LOW_PRIORITY, peer, PORT_ID, NULL, NULL);
                    gm_resume_sending(port, GM_HIGH_PRIORITY, peer, PORT_ID, NULL, NULL);
                    send_status[peer] = GM_SUCCESS;
                    send_to(peer, round);
                } else if (send_status[peer] != GM_SUCCESS) {
                    fail("send", send_status[peer]);
                }
            }
            for (peer = 0; peer < nodes; peer++)
                if (peer != me && in_flight[peer])
                    all_sent = 0;
        } while (!all_sent || received[0] < nodes - 1);
        /* Messages of the next round that came early count for it. */
        received[0] = received[1];
        received[1] = 0;
    }
    printf("alltoall: node %u of %u: %u rounds, %lu messages in and %lu out, all intact\n", me,
           nodes, rounds, messages_in, messages_out);
    for (peer = 0; peer < nodes; peer++)
        gm_dma_free(port, send_buffer[peer]);
    gm_close(port);
    return 0;
}
