/*
 * gm_pingpong.c: a ping-pong written as GM programs were. It handles GM_RECV_EVENT alone and
 * passes every other event to gm_unknown (fast, peer and high receive forms included, which
 * gm_unknown turns into GM_RECV_EVENT); it frees its send tokens at start-up as GM 1 programs
 * did; it sends to its peer as soon as its own port is open, without waiting for the peer's;
 * and it offers receive buffers of exactly the message's length at the message's size class.
 * Every wait is bounded by the clock.
 *
 *     gm_pingpong ROLE UNIT PORT PEER_NODE PEER_PORT ITERATIONS LENGTH...
 *     gm_pingpong ROLE UNIT PORT PEER_NODE PEER_PORT ITERATIONS --sweep MAX
 *
 * ROLE 0 starts each exchange and prints one line per length ("length L: N round trips, mean
 * R us round trip, B MB/s"); ROLE 1 answers. --sweep runs 0, then each power of two to MAX and 3
 * bytes either side. Exits 0 if every byte came back as sent.
 */
#define _POSIX_C_SOURCE 200809L

#include <nicbar/gm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WAIT_SECONDS 60.0
#define MAX_LENGTHS 128

static double seconds_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

static int sends_done;
static gm_status_t send_status = GM_SUCCESS;

static void sent(struct gm_port *port, void *context, gm_status_t status)
{
    (void)port;
    (void)context;
    sends_done++;
    if (status != GM_SUCCESS)
        send_status = status;
}

/* Waits for the next GM_RECV_EVENT, passing everything else to gm_unknown; NULL after
 * WAIT_SECONDS. */
static gm_recv_event_t *next_receive(struct gm_port *port)
{
    double deadline = seconds_now() + WAIT_SECONDS;
    while (seconds_now() < deadline) {
        gm_recv_event_t *event = gm_receive(port);
        switch (GM_RECV_EVENT_TYPE(event)) {
        case GM_RECV_EVENT:
            return event;
        case GM_NO_RECV_EVENT:
            break;
        default:
            gm_unknown(port, event);
        }
    }
    return NULL;
}

/* Waits until `count` sends have ended. */
static int sends_ended(struct gm_port *port, int count)
{
    double deadline = seconds_now() + WAIT_SECONDS;
    while (sends_done < count && seconds_now() < deadline)
        gm_unknown(port, gm_receive(port));
    return sends_done >= count && send_status == GM_SUCCESS;
}

static void fill(unsigned char *bytes, unsigned long length, unsigned int seed)
{
    for (unsigned long i = 0; i < length; i++)
        bytes[i] = (unsigned char)(i * 7u + seed);
}

static int same(const unsigned char *bytes, unsigned long length, unsigned int seed)
{
    for (unsigned long i = 0; i < length; i++)
        if (bytes[i] != (unsigned char)(i * 7u + seed))
            return 0;
    return 1;
}

int main(int argc, char **argv)
{
    struct gm_port *port;
    unsigned int role, unit, port_id, peer_node, peer_port, iterations;
    unsigned long lengths[MAX_LENGTHS];
    int count = 0, sends = 0;
    gm_status_t status;

    if (argc < 8) {
        fprintf(stderr, "usage: gm_pingpong ROLE UNIT PORT PEER_NODE PEER_PORT ITERATIONS "
                        "(LENGTH... | --sweep MAX)\n");
        return 2;
    }
    role = (unsigned int)strtoul(argv[1], NULL, 0);
    unit = (unsigned int)strtoul(argv[2], NULL, 0);
    port_id = (unsigned int)strtoul(argv[3], NULL, 0);
    peer_node = (unsigned int)strtoul(argv[4], NULL, 0);
    peer_port = (unsigned int)strtoul(argv[5], NULL, 0);
    iterations = (unsigned int)strtoul(argv[6], NULL, 0);
    if (strcmp(argv[7], "--sweep") == 0 && argc > 8) {
        unsigned long most = strtoul(argv[8], NULL, 0);
        lengths[count++] = 0;
        for (unsigned long power = 1; power <= most && count + 3 <= MAX_LENGTHS; power *= 2) {
            if (power > 3)
                lengths[count++] = power - 3;
            lengths[count++] = power;
            lengths[count++] = power + 3;
        }
        /* In order, each once (1 + 3 is 4, 2 + 3 is 5). */
        for (int i = 1; i < count; i++)
            for (int j = i; j > 0 && lengths[j - 1] > lengths[j]; j--) {
                unsigned long swap = lengths[j];
                lengths[j] = lengths[j - 1];
                lengths[j - 1] = swap;
            }
        {
            int unique = 1;
            for (int i = 1; i < count; i++)
                if (lengths[i] != lengths[unique - 1])
                    lengths[unique++] = lengths[i];
            count = unique;
        }
    } else {
        for (int i = 7; i < argc && count < MAX_LENGTHS; i++)
            lengths[count++] = strtoul(argv[i], NULL, 0);
    }

    status = gm_open(&port, unit, port_id, "gm_pingpong", GM_API_VERSION);
    if (status != GM_SUCCESS) {
        fprintf(stderr, "gm_open: %s: %s\n", gm_strerror(status), nicbar_last_error());
        return 1;
    }
    /* GM 1's token accounting: a program gives the port's send tokens to its pool at start-up. */
    {
        unsigned int tokens = gm_num_send_tokens(port);
        gm_free_send_tokens(port, GM_LOW_PRIORITY, tokens);
        if (gm_num_send_tokens(port) != tokens) {
            printf("FAILED: gm_free_send_tokens at start-up changed the port's send tokens\n");
            return 1;
        }
    }

    for (int i = 0; i < count; i++) {
        unsigned long length = lengths[i];
        unsigned int size = gm_min_size_for_length(length);
        /* Exactly the message's length: DMA memory is whole pages, as in GM. */
        unsigned char *in = gm_dma_malloc(port, length);
        unsigned char *out = gm_dma_malloc(port, length);
        double started;
        if (in == NULL || out == NULL) {
            printf("FAILED: gm_dma_malloc(%lu): %s\n", length, nicbar_last_error());
            return 1;
        }
        gm_provide_receive_buffer(port, in, size, GM_LOW_PRIORITY);
        started = seconds_now();
        for (unsigned int round = 0; round < iterations; round++) {
            gm_recv_event_t *event;
            unsigned int seed = round * 13u + (unsigned int)i;
            if (role == 0) {
                fill(out, length, seed);
                gm_send_with_callback(port, out, size, length, GM_LOW_PRIORITY, peer_node,
                                      peer_port, sent, NULL);
                sends++;
            }
            event = next_receive(port);
            if (event == NULL || gm_ntohp(event->recv.buffer) != in ||
                gm_ntoh_u32(event->recv.length) != length || !same(in, length, seed)) {
                printf("FAILED: length %lu round %u: %s\n", length, round,
                       event == NULL ? "no GM_RECV_EVENT in time" : "wrong message");
                return 1;
            }
            /* The buffer is the program's again: offer it for the next message, if any. */
            if (round + 1 < iterations)
                gm_provide_receive_buffer(port, in, size, GM_LOW_PRIORITY);
            if (role != 0) {
                /* The previous reply's buffer is free once its send ended. */
                if (!sends_ended(port, sends)) {
                    printf("FAILED: length %lu: a reply's send did not end well\n", length);
                    return 1;
                }
                memcpy(out, in, length);
                gm_send_with_callback(port, out, size, length, GM_LOW_PRIORITY, peer_node,
                                      peer_port, sent, NULL);
                sends++;
            } else if (!sends_ended(port, sends)) {
                printf("FAILED: length %lu: a send did not end well (%s)\n", length,
                       gm_strerror(send_status));
                return 1;
            }
        }
        if (!sends_ended(port, sends)) {
            printf("FAILED: length %lu: the last send did not end well\n", length);
            return 1;
        }
        if (role == 0) {
            double elapsed = seconds_now() - started;
            double round_trip_us = elapsed / iterations * 1e6;
            printf("length %lu: %u round trips, mean %.2f us round trip, %.2f MB/s\n", length,
                   iterations, round_trip_us,
                   elapsed > 0 ? 2.0 * (double)length * iterations / elapsed / 1e6 : 0.0);
            fflush(stdout);
        }
        gm_dma_free(port, in);
        gm_dma_free(port, out);
    }
    gm_close(port);
    printf("gm_pingpong %u: done\n", role);
    return 0;
}
