/*
 * dma.c: GM's DMA memory as GM programs use it. Two ports of this process (units UNIT and
 * UNIT+1, port 2 each) exchange messages into receive buffers offered the way GM programs offer
 * them: short ones (a 64-byte allocation at size class 7, which holds 120 bytes), exact ones (8
 * bytes at class 4), whole size classes up to 22 (messages of 1 MiB and more), and buffers freed
 * while the NIC holds them. Memory that is not the port's DMA memory comes back unused.
 *
 *     dma UNIT          with a daemon running NICs UNIT and UNIT+1
 *
 * One line per check; exits 0 if all passed, 1 otherwise.
 */
#define _POSIX_C_SOURCE 200809L

#include <nicbar/gm.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PORT_ID 2
#define WAIT_SECONDS 30.0

static int failures;

static void check(int ok, const char *what)
{
    printf("%s: %s\n", ok ? "ok" : "FAILED", what);
    if (!ok) {
        printf("  last error: %s\n", nicbar_last_error());
        failures++;
    }
    fflush(stdout);
}

static double seconds_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

static int sends_done;
static gm_status_t send_status;

static void sent(struct gm_port *port, void *context, gm_status_t status)
{
    (void)port;
    (void)context;
    sends_done++;
    send_status = status;
}

static int is_receive(unsigned int type)
{
    return type >= GM_RECV_EVENT && type <= GM_FAST_HIGH_PEER_RECV_EVENT;
}

/* Sends `length` bytes of `out` (size class `size`) from `from` to `to` and waits, by the
 * clock, for the receive event; the receiver's other events go to gm_unknown. Copies the event
 * to `event`; returns 0 if none came in time. */
static int exchange(struct gm_port *from, struct gm_port *to, unsigned int to_node, void *out,
                    unsigned int size, unsigned long length, gm_recv_event_t *event)
{
    double deadline = seconds_now() + WAIT_SECONDS;
    int before = sends_done, received = 0;
    gm_send_with_callback(from, out, size, length, GM_LOW_PRIORITY, to_node, PORT_ID, sent, NULL);
    while ((!received || sends_done == before) && seconds_now() < deadline) {
        gm_recv_event_t *e = gm_receive(to);
        unsigned int type = GM_RECV_EVENT_TYPE(e);
        if (!received && (is_receive(type) || type == GM_BAD_RECV_TOKEN_EVENT)) {
            memcpy(event, e, sizeof *event);
            received = 1;
        } else if (type != GM_NO_RECV_EVENT) {
            gm_unknown(to, e);
        }
        gm_unknown(from, gm_receive(from));
    }
    return received && sends_done != before;
}

/* Takes the next event of `port` within a short time, expecting a refused buffer at `buffer`. */
static int refused(struct gm_port *port, void *buffer)
{
    double deadline = seconds_now() + WAIT_SECONDS;
    while (seconds_now() < deadline) {
        gm_recv_event_t *e = gm_receive(port);
        unsigned int type = GM_RECV_EVENT_TYPE(e);
        if (type == GM_BAD_RECV_TOKEN_EVENT)
            return gm_ntohp(e->recv.buffer) == buffer;
        if (type != GM_NO_RECV_EVENT)
            gm_unknown(port, e);
    }
    return 0;
}

static void fill(unsigned char *bytes, unsigned long length, unsigned int seed)
{
    for (unsigned long i = 0; i < length; i++)
        bytes[i] = (unsigned char)(i * 31u + seed);
}

static int same(const unsigned char *bytes, unsigned long length, unsigned int seed)
{
    for (unsigned long i = 0; i < length; i++)
        if (bytes[i] != (unsigned char)(i * 31u + seed))
            return 0;
    return 1;
}

int main(int argc, char **argv)
{
    struct gm_port *a = NULL, *b = NULL;
    unsigned int unit, node_b = 0;
    gm_recv_event_t event;
    char what[160];

    if (argc < 2) {
        fprintf(stderr, "usage: dma UNIT\n");
        return 2;
    }
    unit = (unsigned int)strtoul(argv[1], NULL, 0);
    if (gm_open(&a, unit, PORT_ID, "dma", GM_API_VERSION) != GM_SUCCESS ||
        gm_open(&b, unit + 1, PORT_ID, "dma", GM_API_VERSION) != GM_SUCCESS) {
        printf("FAILED: gm_open: %s\n", nicbar_last_error());
        return 1;
    }
    gm_get_node_id(b, &node_b);

    /* A short buffer: 64 bytes allocated, offered at class 7 (120 bytes); a 20-byte message. */
    {
        unsigned char *in = gm_dma_calloc(b, 1, 64);
        unsigned char *out = gm_dma_malloc(a, 20);
        fill(out, 20, 1);
        gm_provide_receive_buffer(b, in, 7, GM_LOW_PRIORITY);
        check(exchange(a, b, node_b, out, 7, 20, &event) &&
                  is_receive(GM_RECV_EVENT_TYPE(&event)) &&
                  gm_ntohp(event.recv.buffer) == in && gm_ntoh_u32(event.recv.length) == 20 &&
                  same(in, 20, 1),
              "a 64-byte allocation offered at size class 7 takes a 20-byte message");
    }

    /* An exact buffer: 8 bytes at class 4 (2^4 - 8 = 8), offered again after each message. */
    {
        unsigned char *in = gm_dma_malloc(b, 8);
        unsigned char *out = gm_dma_malloc(a, 8);
        int ok = 1;
        for (unsigned int round = 0; round < 3; round++) {
            fill(out, 8, round);
            gm_provide_receive_buffer(b, in, 4, GM_LOW_PRIORITY);
            ok = ok && exchange(a, b, node_b, out, 4, 8, &event) &&
                 is_receive(GM_RECV_EVENT_TYPE(&event)) && gm_ntohp(event.recv.buffer) == in &&
                 gm_ntoh_u32(event.recv.length) == 8 && same(in, 8, round);
        }
        check(ok, "an exact 8-byte allocation at size class 4 takes 8-byte messages, 3 times");
    }

    /* Whole size classes to 22: each power of two to 2 MiB and 3 bytes either side. */
    for (unsigned int size = 3; size <= 22; size++) {
        unsigned long most = gm_max_length_for_size(size);
        unsigned char *in = gm_dma_malloc(b, most);
        unsigned char *out = gm_dma_malloc(a, most);
        unsigned long lengths[3];
        int ok = in != NULL && out != NULL;
        lengths[0] = most;
        lengths[1] = most > 3 ? most - 3 : 0;
        lengths[2] = (most + 8) / 2 + 3 <= most ? (most + 8) / 2 + 3 : most;
        for (int i = 0; ok && i < 3; i++) {
            fill(out, lengths[i], size + (unsigned)i);
            gm_provide_receive_buffer(b, in, size, GM_LOW_PRIORITY);
            ok = exchange(a, b, node_b, out, size, lengths[i], &event) &&
                 is_receive(GM_RECV_EVENT_TYPE(&event)) &&
                 gm_ntoh_u32(event.recv.length) == lengths[i] &&
                 same(in, lengths[i], size + (unsigned)i);
        }
        snprintf(what, sizeof what, "size class %u: messages of %lu, %lu and %lu bytes", size,
                 lengths[0], lengths[1], lengths[2]);
        check(ok, what);
        gm_dma_free(b, in);
        gm_dma_free(a, out);
    }

    /* Freed while the NIC holds it: the memory stays the NIC's until the message came, and no
     * allocation meanwhile is given any of its bytes. */
    {
        unsigned char *in = gm_dma_malloc(b, 1016);
        unsigned char *out = gm_dma_malloc(a, 1016);
        unsigned char *next;
        fill(out, 1016, 9);
        gm_provide_receive_buffer(b, in, 10, GM_LOW_PRIORITY);
        gm_dma_free(b, in);
        next = gm_dma_malloc(b, 1016);
        check(next != NULL && (next + 1016 <= in || next >= in + 1016),
              "memory freed while the NIC holds it is not handed out again");
        check(exchange(a, b, node_b, out, 10, 1016, &event) &&
                  gm_ntohp(event.recv.buffer) == in,
              "the freed buffer still takes its message, and the event names it");
        gm_dma_free(b, next);
    }

    /* Not the port's DMA memory: ordinary memory, another port's, and a range running past the
     * end of the program's DMA memory come back unused, to the program (not to gm_unknown). */
    {
        static unsigned char ordinary[64];
        unsigned char *others = gm_dma_malloc(a, 64);
        unsigned char *last = gm_dma_malloc(b, 4096);
        gm_provide_receive_buffer(b, ordinary, 5, GM_LOW_PRIORITY);
        check(refused(b, ordinary), "a buffer in ordinary memory comes back unused");
        gm_provide_receive_buffer(b, others, 5, GM_LOW_PRIORITY);
        check(refused(b, others), "a buffer in another port's DMA memory comes back unused");
        gm_provide_receive_buffer(b, last + 4096 - 64, 13, GM_LOW_PRIORITY);
        check(refused(b, last + 4096 - 64),
              "a buffer whose size class runs past the program's DMA memory comes back unused");
    }

    gm_close(a);
    gm_close(b);
    printf("dma: %d check(s) failed\n", failures);
    return failures == 0 ? 0 : 1;
}
