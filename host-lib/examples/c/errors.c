/*
 * errors.c: what the library does with mistakes. Every call below is wrong in some way (a NULL,
 * a closed port, memory that is not DMA memory, a size class out of range, a port nobody opened)
 * and must come back as a status, an event or a callback, never as a crash.
 *
 *     errors UNIT          with a daemon running at least UNIT+1 NICs
 *     errors --no-daemon   with NICBAR_SOCKET naming a socket nobody listens on
 *
 * Prints one line per check and exits 0 if all of them passed, 1 otherwise.
 */
#define _POSIX_C_SOURCE 200809L

#include <nicbar/gm.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Seconds on a monotonic clock: every wait below is bounded by it, never by a count of polls. */
static double seconds_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

/* How long a wait for something that must come may take (a loaded machine is slow). */
#define WAIT_SECONDS 20.0

static int failures;

static void check(int ok, const char *what)
{
    printf("%s: %s\n", ok ? "ok" : "FAILED", what);
    if (!ok) {
        printf("  last error: %s\n", nicbar_last_error());
        failures++;
    }
}

static int contains(const char *text, const char *part)
{
    return text != NULL && strstr(text, part) != NULL;
}

/* What the send callbacks saw. */
static int callbacks;
static gm_status_t last_status = -1;
static void *last_context;

static void count_callback(struct gm_port *port, void *context, gm_status_t status)
{
    (void)port;
    callbacks++;
    last_status = status;
    last_context = context;
}

static void close_from_callback(struct gm_port *port, void *context, gm_status_t status)
{
    (void)context;
    (void)status;
    callbacks++;
    gm_close(port);
}

/* Takes events until one of type `type` comes (running callbacks for the others); 0 if none
 * came within WAIT_SECONDS. */
static gm_recv_event_t *await_type(struct gm_port *port, unsigned int type)
{
    double until = seconds_now() + WAIT_SECONDS;
    while (seconds_now() < until) {
        gm_recv_event_t *event = gm_receive(port);
        if (GM_RECV_EVENT_TYPE(event) == type)
            return event;
        if (GM_RECV_EVENT_TYPE(event) != GM_NO_RECV_EVENT)
            gm_unknown(port, event);
    }
    return NULL;
}

/* Sends and waits for the callback; returns its status. */
static gm_status_t send_and_wait(struct gm_port *port, void *message, unsigned int size,
                                 unsigned long length, unsigned int node, unsigned int port_id)
{
    int before = callbacks;
    gm_send_with_callback(port, message, size, length, GM_LOW_PRIORITY, node, port_id,
                          count_callback, (void *)(uintptr_t)0x5eed);
    for (double until = seconds_now() + WAIT_SECONDS; (callbacks == before) && seconds_now() < until;)
        gm_unknown(port, gm_blocking_receive(port));
    return callbacks == before ? -1 : last_status;
}

static int no_daemon(void)
{
    struct gm_port *port = (struct gm_port *)(uintptr_t)1;
    gm_status_t status = gm_open(&port, 0, 2, "errors", GM_API_VERSION);
    check(status == GM_DEV_NOT_FOUND, "gm_open without a daemon is GM_DEV_NOT_FOUND");
    check(port == NULL, "gm_open stores NULL on failure");
    check(contains(nicbar_last_error(), "nicctl emulate"),
          "the last error says how to start a daemon");
    printf("%s\n", nicbar_last_error());
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    struct gm_port *port = NULL, *other = NULL, *busy = NULL, *closing = NULL;
    unsigned int unit, node = 0, size;
    gm_status_t status;
    char on_stack[64];
    unsigned char *buffer, *zeroed;
    gm_recv_event_t *event;

    if (argc > 1 && strcmp(argv[1], "--no-daemon") == 0)
        return no_daemon();
    unit = argc > 1 ? (unsigned int)strtoul(argv[1], NULL, 0) : 0;

    /* Arguments checked before anything is opened. */
    check(gm_open(NULL, unit, 2, NULL, GM_API_VERSION) == GM_INVALID_PARAMETER,
          "gm_open(NULL, ...) is GM_INVALID_PARAMETER");
    check(gm_open(&port, unit, 2, NULL, 0x999999) == GM_INCOMPATIBLE_LIB_AND_DRIVER,
          "an unknown API version is GM_INCOMPATIBLE_LIB_AND_DRIVER");
    check(gm_open(&port, 200, 2, NULL, GM_API_VERSION) == GM_NO_SUCH_DEVICE,
          "a unit the daemon does not run is GM_NO_SUCH_DEVICE");
    check(gm_open(&port, unit, 300, NULL, GM_API_VERSION) == GM_INVALID_PORT_NUMBER,
          "port 300 is GM_INVALID_PORT_NUMBER");
    check(gm_open(&port, unit, 9, NULL, GM_API_VERSION) == GM_INVALID_PORT_NUMBER,
          "port 9 is GM_INVALID_PORT_NUMBER");
    check(port == NULL, "a failed gm_open leaves the port NULL");

    /* NULL everywhere GM took it. */
    gm_close(NULL);
    gm_dma_free(NULL, NULL);
    gm_unknown(NULL, NULL);
    gm_provide_receive_buffer_with_tag(NULL, NULL, 5, GM_LOW_PRIORITY, 0);
    gm_send_with_callback(NULL, NULL, 5, 0, GM_LOW_PRIORITY, 0, 2, count_callback, NULL);
    check(GM_RECV_EVENT_TYPE(gm_receive(NULL)) == GM_NO_RECV_EVENT,
          "gm_receive(NULL) is an empty event");
    check(gm_num_send_tokens(NULL) == 0 && gm_num_receive_tokens(NULL) == 0,
          "a NULL port has no tokens");
    check(gm_dma_malloc(NULL, 64) == NULL, "gm_dma_malloc(NULL, ...) is NULL");
    check(gm_provide_barrier_buffer(NULL) == GM_INVALID_PARAMETER,
          "gm_provide_barrier_buffer(NULL) is GM_INVALID_PARAMETER");
    check(nicbar_barrier(NULL, NULL, 0, NICBAR_BARRIER_DEFAULT, 0) == GM_INVALID_PARAMETER,
          "nicbar_barrier(NULL, ...) is GM_INVALID_PARAMETER");
    check(callbacks == 0, "no callback ran for a NULL port");

    /* Texts and sizes. */
    check(strcmp(gm_strerror(GM_SEND_TARGET_PORT_CLOSED), "send target port closed") == 0,
          "gm_strerror names GM_SEND_TARGET_PORT_CLOSED");
    check(gm_strerror(-7) != NULL && gm_strerror(1000) != NULL, "gm_strerror of nonsense");
    check(gm_max_length_for_size(4) == 8 && gm_max_length_for_size(10) == 1016 &&
              gm_max_length_for_size(13) == 8184 && gm_max_length_for_size(3) == 0,
          "gm_max_length_for_size is 2^size - 8, as in GM");
    check(gm_max_length_for_size(0) == 0 && gm_max_length_for_size(99) == 0,
          "gm_max_length_for_size of a size class out of range is 0");
    check(gm_min_size_for_length(0) == 3 && gm_min_size_for_length(1) == 4 &&
              gm_min_size_for_length(1016) == 10 && gm_min_size_for_length(1017) == 11,
          "gm_min_size_for_length");
    check(gm_min_size_for_length(4097) == 13 && gm_min_size_for_length(8185) == 14,
          "gm_min_size_for_length past the MTU is GM's class");
    {
        gm_u32_n_t n = gm_hton_u32(0x01020304u);
        unsigned char bytes[4];
        memcpy(bytes, &n, 4);
        check(bytes[0] == 1 && bytes[3] == 4 && gm_ntoh_u32(n) == 0x01020304u,
              "network order is big-endian");
    }

    /* A port, and mistakes with it. */
    status = gm_open(&port, unit, 2, "errors", GM_API_VERSION);
    check(status == GM_SUCCESS, "gm_open");
    if (status != GM_SUCCESS)
        return 1;
    status = gm_open(&busy, unit, 2, "errors", GM_API_VERSION);
    check(status == GM_BUSY && busy == NULL, "opening an open port is GM_BUSY");
    check(contains(nicbar_last_error(), "owned by process"), "the last error names the owner");
    check(gm_get_node_id(port, NULL) == GM_INVALID_PARAMETER,
          "gm_get_node_id(port, NULL) is GM_INVALID_PARAMETER");
    check(gm_get_node_id(port, &node) == GM_SUCCESS, "gm_get_node_id");
    check(gm_get_port_id(port) == 2, "gm_get_port_id");
    check(gm_num_send_tokens(port) > 0 && gm_num_receive_tokens(port) > 0, "tokens");

    buffer = gm_dma_malloc(port, 1024);
    check(buffer != NULL && ((uintptr_t)buffer % GM_RDMA_GRANULARITY) == 0,
          "gm_dma_malloc is aligned");
    zeroed = gm_dma_calloc(port, 16, 8);
    check(zeroed != NULL && zeroed[0] == 0 && zeroed[127] == 0, "gm_dma_calloc zeroes");
    check(gm_dma_malloc(port, (gm_size_t)1 << 40) == NULL, "an impossible allocation is NULL");
    check(contains(nicbar_last_error(), "arena"), "the last error says the arena is short");
    gm_dma_free(port, on_stack);
    check(contains(nicbar_last_error(), "not DMA memory"), "freeing foreign memory is refused");
    gm_dma_free(port, NULL);

    /* Refused sends end through their callbacks, from gm_unknown only. */
    size = gm_min_size_for_length(64);
    gm_send_with_callback(port, on_stack, size, 64, GM_LOW_PRIORITY, node, 3, count_callback,
                          (void *)(uintptr_t)42);
    check(callbacks == 0, "a refused send's callback does not run inside the send");
    event = await_type(port, GM_SENT_EVENT);
    check(event != NULL, "a refused send is announced by a GM_SENT_EVENT");
    check(callbacks == 0, "gm_receive runs no callback");
    gm_unknown(port, event);
    check(callbacks == 1 && last_status == GM_INVALID_PARAMETER &&
              last_context == (void *)(uintptr_t)42,
          "sending from memory that is not DMA memory ends with GM_INVALID_PARAMETER");
    check(send_and_wait(port, buffer, 99, 8, node, 3) == GM_INVALID_PARAMETER,
          "size class 99 ends with GM_INVALID_PARAMETER");
    check(send_and_wait(port, buffer, 4, 9, node, 3) == GM_INVALID_PARAMETER,
          "9 bytes in size class 4 ends with GM_INVALID_PARAMETER");
    check(send_and_wait(port, buffer, size, 64, node, 9) == GM_INVALID_PARAMETER,
          "port 9 ends with GM_INVALID_PARAMETER");
    /* DMA memory is whole pages, as in GM: the last allocation's page ends it. */
    check(send_and_wait(port, zeroed + GM_PAGE_LEN - 24, size, 64, node, 3) ==
              GM_INVALID_PARAMETER,
          "a message running past the port's DMA memory ends with GM_INVALID_PARAMETER");
    check(send_and_wait(port, buffer, size, 64, node, 5) == GM_SEND_TARGET_PORT_CLOSED,
          "a send to a port nobody opened ends with GM_SEND_TARGET_PORT_CLOSED");

    /* A message between two ports of this process, at high priority, with a 32-bit tag. */
    status = gm_open(&other, unit, 3, "errors", GM_API_VERSION);
    check(status == GM_SUCCESS, "a second port");
    if (status == GM_SUCCESS) {
        unsigned char *into = gm_dma_malloc(other, gm_max_length_for_size(size));
        gm_provide_receive_buffer_with_tag(other, into, size, GM_HIGH_PRIORITY, 0x12345678u);
        memcpy(buffer, "twelve bytes", 12);
        gm_send_with_callback(port, buffer, size, 12, GM_HIGH_PRIORITY, node, 3, count_callback,
                              NULL);
        event = await_type(other, GM_FAST_HIGH_RECV_EVENT);
        check(event != NULL, "a small high-priority message is a GM_FAST_HIGH_RECV_EVENT");
        if (event != NULL) {
            check(gm_ntohp(event->recv.buffer) == into && gm_ntohp(event->recv.message) == into &&
                      gm_ntoh_u32(event->recv.length) == 12 &&
                      memcmp(into, "twelve bytes", 12) == 0,
                  "the message is in the buffer provided");
            check(gm_ntoh_u16(event->recv.sender_node_id) == node &&
                      gm_ntoh_u8(event->recv.sender_port_id) == 2,
                  "the event names the sender");
            check(gm_ntoh_u8(event->recv.tag) == 0x78 &&
                      gm_ntoh_u32(event->recv.nicbar_tag) == 0x12345678u &&
                      gm_ntoh_u8(event->recv.size) == size,
                  "the event carries the tag and size class");
        }
        /* A buffer that is not DMA memory comes back as GM_BAD_RECV_TOKEN_EVENT. */
        gm_provide_receive_buffer_with_tag(other, on_stack, size, GM_LOW_PRIORITY, 7);
        event = await_type(other, GM_BAD_RECV_TOKEN_EVENT);
        check(event != NULL && gm_ntohp(event->recv.buffer) == (void *)on_stack &&
                  gm_ntoh_u8(event->recv.tag) == 7,
              "a foreign receive buffer comes back as GM_BAD_RECV_TOKEN_EVENT");
        gm_provide_receive_buffer_with_tag(other, into, 99, GM_LOW_PRIORITY, 8);
        event = await_type(other, GM_BAD_RECV_TOKEN_EVENT);
        check(event != NULL, "size class 99 comes back as GM_BAD_RECV_TOKEN_EVENT");
        gm_close(other);
        gm_close(other); /* closed already: ignored */
        check(gm_num_send_tokens(other) == 0 && contains(nicbar_last_error(), "not an open port"),
              "a closed port is refused, not used");
    }

    /* A barrier with a member out of range is refused through its event. */
    {
        gm_barrier_peer_t peer = {node, 99};
        check(gm_provide_barrier_buffer(port) == GM_SUCCESS, "gm_provide_barrier_buffer");
        gm_barrier_send_with_callback(port, &peer, 1, count_callback, (void *)(uintptr_t)7);
        event = await_type(port, GM_BARRIER_FAILED_EVENT);
        check(event != NULL &&
                  gm_ntoh_u32(event->barrier.status) == (gm_u32_t)GM_INVALID_PARAMETER &&
                  gm_ntohp(event->barrier.context) == (void *)(uintptr_t)7,
              "a barrier with port 99 fails with GM_INVALID_PARAMETER");
        check(nicbar_barrier(port, &peer, 1, NICBAR_BARRIER_DEFAULT, 0) == GM_INVALID_PARAMETER,
              "nicbar_barrier with a port out of range is GM_INVALID_PARAMETER");
    }

    /* A callback may close its port: the close waits until gm_unknown returns. */
    status = gm_open(&closing, unit, 4, "errors", GM_API_VERSION);
    check(status == GM_SUCCESS, "a third port");
    if (status == GM_SUCCESS) {
        int before = callbacks;
        gm_send_with_callback(closing, NULL, 99, 0, GM_LOW_PRIORITY, node, 2,
                              close_from_callback, NULL);
        for (double until = seconds_now() + WAIT_SECONDS; (callbacks == before) && seconds_now() < until;)
            gm_unknown(closing, gm_receive(closing));
        check(callbacks == before + 1, "the closing callback ran");
        check(GM_RECV_EVENT_TYPE(gm_receive(closing)) == GM_NO_RECV_EVENT &&
                  contains(nicbar_last_error(), "not an open port"),
              "the port closed from its callback is closed");
    }

    gm_dma_free(port, buffer);
    gm_dma_free(port, buffer); /* freed already: refused, not freed twice */
    check(contains(nicbar_last_error(), "not DMA memory"), "a double free is refused");
    gm_close(port);
    printf("errors: %d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
