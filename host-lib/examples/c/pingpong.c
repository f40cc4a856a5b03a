/*
 * pingpong.c: two processes bounce a message back and forth through the nicbar NIC, as a GM
 * program would.
 *
 *     pingpong UNIT PEER_NODE [ROUND_TRIPS [poll|block [times]]]
 *
 * Opens port 2 of NIC UNIT and exchanges ROUND_TRIPS (default 1000) 64-byte messages with port 2
 * of node PEER_NODE: the process on the lower node id sends first and measures, the other
 * answers. Each message carries its round number and a pattern; the answer carries the pattern
 * inverted, and both sides check every byte. Exits 0 when every round trip came back intact.
 * Events are waited for with gm_blocking_receive, or with "poll" by spinning on gm_receive. With
 * "times", the measuring side also prints each round trip after the first, in nanoseconds, one
 * per line (for `cargo xtask bench pingpong`).
 *
 * Build: cc -o pingpong pingpong.c $(pkg-config --cflags --libs nicbar)
 * Run:   nicctl emulate --units 2 &   then   ./pingpong 0 1 & ./pingpong 1 0
 */
#define _POSIX_C_SOURCE 200809L

#include <nicbar/gm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PORT_ID 2
#define LENGTH 64
#define RECEIVE_BUFFERS 4
/* How long a first message keeps being sent to a peer whose port is not open yet. */
#define STARTUP_SECONDS 20

static struct gm_port *port;
static unsigned int size_class;
static int polling;

/* What the send callback reports back to the main loop. */
static int sends_in_flight;
static gm_status_t last_send_status = GM_SUCCESS;

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void fail(const char *what, gm_status_t status)
{
    fprintf(stderr, "pingpong: %s: %s (%s)\n", what, gm_strerror(status), nicbar_last_error());
    exit(1);
}

static void send_done(struct gm_port *p, void *context, gm_status_t status)
{
    (void)p;
    (void)context;
    sends_in_flight--;
    last_send_status = status;
}

static void fill(unsigned char *message, unsigned int round, int inverted)
{
    unsigned int i;
    memcpy(message, &round, sizeof round);
    for (i = sizeof round; i < LENGTH; i++) {
        unsigned char byte = (unsigned char)(round * 7u + i);
        message[i] = inverted ? (unsigned char)~byte : byte;
    }
}

static int intact(const unsigned char *message, unsigned int length, unsigned int round,
                  int inverted)
{
    unsigned char expected[LENGTH];
    if (length != LENGTH)
        return 0;
    fill(expected, round, inverted);
    return memcmp(message, expected, LENGTH) == 0;
}

/* The message that arrived and is not processed yet: the peer sends one at a time, and it can
 * come while this process still waits for its own send to end. */
static struct {
    int present;
    unsigned char *data;
    unsigned int length, sender, sender_port, tag;
} arrived;

/* Takes one event: keeps a message for receive_round, hands anything else to gm_unknown (which
 * runs the send callbacks). */
static void handle_next_event(void)
{
    gm_recv_event_t *event;
    if (polling) {
        while (GM_RECV_EVENT_TYPE(event = gm_receive(port)) == GM_NO_RECV_EVENT)
            ;
    } else {
        event = gm_blocking_receive(port);
    }
    switch (GM_RECV_EVENT_TYPE(event)) {
    case GM_RECV_EVENT:
    case GM_HIGH_RECV_EVENT:
    case GM_PEER_RECV_EVENT:
    case GM_HIGH_PEER_RECV_EVENT:
    case GM_FAST_RECV_EVENT:
    case GM_FAST_HIGH_RECV_EVENT:
    case GM_FAST_PEER_RECV_EVENT:
    case GM_FAST_HIGH_PEER_RECV_EVENT:
        if (arrived.present) {
            fprintf(stderr, "pingpong: a second message arrived before the first was read\n");
            exit(1);
        }
        arrived.present = 1;
        /* A fast event's message is at recv.message; gm_memorize_message puts it in the buffer
         * (a no-op when it is there already), as GM programs do. */
        arrived.data = gm_memorize_message(gm_ntohp(event->recv.message),
                                           gm_ntohp(event->recv.buffer),
                                           gm_ntoh_u32(event->recv.length));
        arrived.length = gm_ntoh_u32(event->recv.length);
        arrived.sender = gm_ntoh_u16(event->recv.sender_node_id);
        arrived.sender_port = gm_ntoh_u8(event->recv.sender_port_id);
        arrived.tag = gm_ntoh_u8(event->recv.tag);
        break;
    default:
        gm_unknown(port, event);
    }
}

/* Sends the message in `buffer` to the peer and waits until the send has ended, sending it again
 * while the peer's port is not open yet (at start-up). */
static void send_and_wait(void *buffer, unsigned int peer)
{
    double give_up = now_seconds() + STARTUP_SECONDS;
    for (;;) {
        sends_in_flight++;
        gm_send_with_callback(port, buffer, size_class, LENGTH, GM_LOW_PRIORITY, peer, PORT_ID,
                              send_done, NULL);
        while (sends_in_flight > 0)
            handle_next_event();
        if (last_send_status == GM_SUCCESS)
            return;
        if (last_send_status != GM_SEND_TARGET_PORT_CLOSED || now_seconds() > give_up)
            fail("send", last_send_status);
        /* As in GM, a failed send stalls the connection until the program resumes it. */
        gm_resume_sending(port, GM_LOW_PRIORITY, peer, PORT_ID, NULL, NULL);
        {
            struct timespec pause = {0, 10 * 1000 * 1000};
            nanosleep(&pause, NULL);
        }
    }
}

/* Waits for the next message from `peer`, checks it is round `round`, and provides its buffer
 * again. */
static void receive_round(unsigned int peer, unsigned int round, int inverted)
{
    while (!arrived.present)
        handle_next_event();
    arrived.present = 0;
    if (arrived.sender != peer || arrived.sender_port != PORT_ID) {
        fprintf(stderr, "pingpong: a message from node %u port %u\n", arrived.sender,
                arrived.sender_port);
        exit(1);
    }
    if (!intact(arrived.data, arrived.length, round, inverted)) {
        fprintf(stderr, "pingpong: round %u came back damaged (%u bytes)\n", round,
                arrived.length);
        exit(1);
    }
    gm_provide_receive_buffer_with_tag(port, arrived.data, size_class, GM_LOW_PRIORITY,
                                       arrived.tag);
}

int main(int argc, char **argv)
{
    unsigned int unit, peer, round_trips = 1000, me, i;
    gm_status_t status;
    unsigned char *send_buffer;
    int print_times;
    double *times = NULL;

    if (argc < 3) {
        fprintf(stderr, "usage: pingpong UNIT PEER_NODE [ROUND_TRIPS [poll|block [times]]]\n");
        return 2;
    }
    unit = (unsigned int)strtoul(argv[1], NULL, 0);
    peer = (unsigned int)strtoul(argv[2], NULL, 0);
    if (argc > 3)
        round_trips = (unsigned int)strtoul(argv[3], NULL, 0);
    polling = argc > 4 && strcmp(argv[4], "poll") == 0;
    print_times = argc > 5 && strcmp(argv[5], "times") == 0;
    if (print_times && (times = calloc(round_trips > 0 ? round_trips : 1, sizeof *times)) == NULL)
        fail("calloc", GM_OUT_OF_MEMORY);

    if ((status = gm_init()) != GM_SUCCESS)
        fail("gm_init", status);
    status = gm_open(&port, unit, PORT_ID, "pingpong", GM_API_VERSION);
    if (status != GM_SUCCESS)
        fail("gm_open", status);
    if ((status = gm_get_node_id(port, &me)) != GM_SUCCESS)
        fail("gm_get_node_id", status);

    size_class = gm_min_size_for_length(LENGTH);
    for (i = 0; i < RECEIVE_BUFFERS; i++) {
        void *buffer = gm_dma_malloc(port, gm_max_length_for_size(size_class));
        if (buffer == NULL)
            fail("gm_dma_malloc", GM_OUT_OF_MEMORY);
        gm_provide_receive_buffer_with_tag(port, buffer, size_class, GM_LOW_PRIORITY, i);
    }
    send_buffer = gm_dma_malloc(port, LENGTH);
    if (send_buffer == NULL)
        fail("gm_dma_malloc", GM_OUT_OF_MEMORY);

    if (me < peer) {
        double started = 0;
        for (i = 0; i < round_trips; i++) {
            double round_started = now_seconds();
            if (i == 1)
                started = round_started; /* the first round trip waits for the peer to open */
            fill(send_buffer, i, 0);
            send_and_wait(send_buffer, peer);
            receive_round(peer, i, 1);
            if (times != NULL)
                times[i] = (now_seconds() - round_started) * 1e9;
        }
        if (times != NULL) {
            for (i = 1; i < round_trips; i++)
                printf("%.0f\n", times[i]);
        }
        if (round_trips > 1) {
            double mean = (now_seconds() - started) / (round_trips - 1) * 1e6;
            printf("pingpong: node %u <-> node %u: %u round trips of %d bytes, mean %.1f us\n",
                   me, peer, round_trips, LENGTH, mean);
        } else {
            printf("pingpong: node %u <-> node %u: %u round trips of %d bytes\n", me, peer,
                   round_trips, LENGTH);
        }
    } else {
        for (i = 0; i < round_trips; i++) {
            receive_round(peer, i, 0);
            fill(send_buffer, i, 1);
            send_and_wait(send_buffer, peer);
        }
        printf("pingpong: node %u answered %u messages from node %u\n", me, round_trips, peer);
    }
    free(times);
    gm_dma_free(port, send_buffer);
    gm_close(port);
    gm_finalize();
    return 0;
}
