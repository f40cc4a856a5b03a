/*
 * gm2.c: GM 2's calls as GM documents them, one check per line: the header's names and types,
 * sizes as GM computes them, zero-length messages, peer and fast receive events, the port's send
 * tokens, peeking at events, GM's older send forms and datagrams, and alarms firing in the order
 * they are due.
 *
 *     gm2 UNIT          with a daemon running NICs UNIT and UNIT+1 (both ports 2 are used)
 *     gm2 --exit        calls gm_exit(GM_SEND_TIMED_OUT) and must exit with status 15
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

#define PORT_ID 2

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

static void count_callback(struct gm_port *port, void *context, gm_status_t status)
{
    (void)port;
    (void)context;
    callbacks++;
    last_status = status;
}

/* The order alarms fired in. */
static int fired[8];
static int fired_count;

static void on_exit_callback(gm_status_t status, void *arg)
{
    printf("on_exit %d %d\n", (int)(intptr_t)arg, (int)status);
    fflush(stdout);
}

static void alarm_callback(void *context)
{
    if (fired_count < 8)
        fired[fired_count++] = (int)(intptr_t)context;
}

/* Takes events until one of type `type` comes (passing the others to gm_unknown); NULL if none
 * came within a bounded number of waits. */
/* Seconds on a monotonic clock. */
static double seconds_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

/* How long a wait for something that must come may take (a loaded machine is slow). */
#define WAIT_SECONDS 20.0

static gm_recv_event_t *await_type(struct gm_port *port, unsigned int type)
{
    double deadline = seconds_now() + WAIT_SECONDS;
    while (seconds_now() < deadline) {
        gm_recv_event_t *event = gm_receive(port);
        if (GM_RECV_EVENT_TYPE(event) == type)
            return event;
        if (GM_RECV_EVENT_TYPE(event) != GM_NO_RECV_EVENT)
            gm_unknown(port, event);
    }
    return NULL;
}

/* Sends and waits for the send's callback, running other events through gm_unknown. */
static gm_status_t send_and_wait(struct gm_port *port, void *message, unsigned int size,
                                 gm_size_t length, unsigned int node, unsigned int target_port)
{
    int before = callbacks;
    double deadline = seconds_now() + WAIT_SECONDS;
    gm_send_with_callback(port, message, size, length, GM_LOW_PRIORITY, node, target_port,
                          count_callback, NULL);
    while (callbacks == before && seconds_now() < deadline)
        gm_unknown(port, gm_receive(port));
    return callbacks == before ? -1 : last_status;
}

int main(int argc, char **argv)
{
    struct gm_port *a = NULL, *b = NULL;
    unsigned int unit, node_a = 0, node_b = 0, tokens, taken = 0;
    unsigned char *out, *in, *big;
    gm_recv_event_t *event;
    gm_status_t status;

    if (argc > 1 && strcmp(argv[1], "--exit") == 0) {
        gm_on_exit(on_exit_callback, (void *)(intptr_t)1);
        gm_on_exit(on_exit_callback, (void *)(intptr_t)2);
        gm_exit(GM_SEND_TIMED_OUT);
        return 0; /* not reached */
    }
    if (argc < 2) {
        fprintf(stderr, "usage: gm2 UNIT | gm2 --exit\n");
        return 2;
    }
    unit = (unsigned int)strtoul(argv[1], NULL, 0);

    /* The header: GM 2's names and types. */
    {
        enum gm_api_version version = _GM_API_VERSION_2_0_16;
        enum gm_priority priority = GM_HIGH_PRIORITY;
        gm_remote_ptr_t remote = 0;
        struct gm_alarm alarm;
        check(GM_API_VERSION == GM_API_VERSION_2_0_16 && (unsigned)version == 0x20010 &&
                  GM_API_VERSION_2_0_6 == 0x20006 && GM_API_VERSION_2_0_12 == 0x2000c,
              "GM_API_VERSION is 2.0.16");
        check(priority == 1 && GM_LOW_PRIORITY == 0 && GM_NUM_PRIORITIES == 2,
              "enum gm_priority");
        check(sizeof remote == 8 && GM_MAX_HOST_NAME_LEN == 128 && GM_MAX_PORT_NAME_LEN == 32,
              "gm_remote_ptr_t and the name lengths");
        check(GM_ALARM_EVENT == 2 && GM_PEER_RECV_EVENT == 13 && GM_FAST_RECV_EVENT == 15 &&
                  GM_FAST_PEER_RECV_EVENT == 17 && GM_FAST_HIGH_PEER_RECV_EVENT == 18,
              "GM's event type numbers");
        gm_initialize_alarm(&alarm);
        check(alarm.state == GM_ALARM_FREE, "gm_initialize_alarm leaves the alarm free");
    }

    /* GM's utilities. */
    {
        char *copy = gm_strdup("nicbar");
        unsigned char *memory = gm_calloc(16, 4);
        void *page = gm_page_alloc();
        void *pages = gm_alloc_pages(5000);
        int first, again;
        check(copy != NULL && gm_strlen(copy) == 6 && gm_strcmp(copy, "nicbar") == 0 &&
                  gm_strncmp(copy, "nicXXX", 3) == 0 && gm_strncasecmp(copy, "NICBAR", 6) == 0,
              "gm_strdup, gm_strlen, gm_strcmp, gm_strncmp, gm_strncasecmp");
        check(memory != NULL && memory[63] == 0, "gm_calloc zeroes");
        gm_memset(memory, 7, 8);
        gm_bcopy(memory, memory + 8, 8);
        check(memory[15] == 7 && gm_memcmp(memory, memory + 8, 8) == 0, "gm_memset, gm_bcopy");
        gm_bzero(memory, 16);
        check(memory[15] == 0, "gm_bzero");
        check(page != NULL && ((uintptr_t)page % GM_PAGE_LEN) == 0 && pages != NULL &&
                  ((uintptr_t)pages % GM_PAGE_LEN) == 0,
              "gm_page_alloc and gm_alloc_pages are page-aligned");
        check(gm_log2_roundup(1) == 0 && gm_log2_roundup(2) == 1 && gm_log2_roundup(5) == 3 &&
                  gm_log2_roundup(4096) == 12,
              "gm_log2_roundup");
        gm_srand(42);
        first = gm_rand();
        gm_srand(42);
        again = gm_rand();
        check(first == again && first >= 0 && gm_rand_mod(10) < 10, "gm_srand, gm_rand");
        check(gm_isprint('a') && !gm_isprint('\n') && gm_getpid() > 0, "gm_isprint, gm_getpid");
        {
            struct gm_mutex *mutex = gm_create_mutex();
            check(mutex != NULL, "gm_create_mutex");
            gm_mutex_enter(mutex);
            gm_mutex_exit(mutex);
            gm_mutex_enter(mutex);
            gm_mutex_exit(mutex);
            gm_destroy_mutex(mutex);
        }
        gm_free(copy);
        gm_free(memory);
        gm_page_free(page);
        gm_free_pages(pages, 5000);
    }

    /* Sizes as GM computes them. */
    check(gm_min_size_for_length(0) == 3 && gm_max_length_for_size(3) == 0,
          "an empty message is size class 3");
    check(gm_max_length_for_size(13) == 8184 && gm_min_size_for_length(8184) == 13,
          "size class 13 holds 8184 bytes");

    status = gm_open(&a, unit, PORT_ID, "gm2", GM_API_VERSION);
    check(status == GM_SUCCESS, "gm_open unit UNIT");
    status = gm_open(&b, unit + 1, PORT_ID, "gm2", GM_API_VERSION);
    check(status == GM_SUCCESS, "gm_open unit UNIT+1");
    if (a == NULL || b == NULL) {
        printf("gm2: %d check(s) failed\n", failures + 1);
        return 1;
    }
    gm_get_node_id(a, &node_a);
    gm_get_node_id(b, &node_b);
    {
        unsigned int max = 0;
        int node_type = -1;
        check(gm_max_node_id(a, &max) == GM_SUCCESS && max == 65535 && node_b <= max,
              "gm_max_node_id is the NIC's 16-bit limit");
        check(gm_set_enable_nack_down(a, 1) == GM_NOT_SUPPORTED_ON_ARCH &&
                  gm_get_node_type(a, &node_type) == GM_NOT_SUPPORTED_ON_ARCH && node_type == -1,
              "calls without meaning here link and say so");
    }
    check(gm_set_acceptable_sizes(a, GM_LOW_PRIORITY, 0x3ff8) == GM_SUCCESS &&
              gm_set_acceptable_sizes(a, 7, 0x3ff8) == GM_INVALID_PARAMETER,
          "gm_set_acceptable_sizes checks the priority");

    out = gm_dma_malloc(a, 8192);
    in = gm_dma_malloc(b, 8192);
    big = gm_dma_malloc(b, 8192);
    check(out != NULL && in != NULL && big != NULL, "gm_dma_malloc");

    /* Send tokens: the port's total, however many are in use. */
    tokens = gm_num_send_tokens(a);
    check(tokens > 0, "gm_num_send_tokens");
    while (taken < 10000 && gm_alloc_send_token(a, GM_LOW_PRIORITY))
        taken++;
    check(taken == tokens, "gm_alloc_send_token takes every token, and no more");
    check(gm_num_send_tokens(a) == tokens, "gm_num_send_tokens is the total, not the free ones");
    check(gm_send_token_available(a, GM_LOW_PRIORITY) == 1, "a taken token is there to send");
    gm_free_send_tokens(a, GM_LOW_PRIORITY, taken - 1);
    gm_free_send_token(a, GM_LOW_PRIORITY);
    check(gm_alloc_send_token(a, GM_HIGH_PRIORITY) == 1, "tokens given back can be taken again");
    gm_free_send_token(a, GM_HIGH_PRIORITY);

    /* A zero-length message. */
    gm_provide_receive_buffer_with_tag(b, in, 3, GM_LOW_PRIORITY, 30);
    status = send_and_wait(a, out, 3, 0, node_b, PORT_ID);
    check(status == GM_SUCCESS, "a zero-length message of size class 3 is sent");
    event = await_type(b, GM_FAST_PEER_RECV_EVENT);
    check(event != NULL && gm_ntoh_u32(event->recv.length) == 0 &&
              gm_ntoh_u8(event->recv.size) == 3 && gm_ntohp(event->recv.buffer) == in &&
              gm_ntoh_u16(event->recv.sender_node_id) == node_a,
          "it arrives as a GM_FAST_PEER_RECV_EVENT of length 0");

    /* A long message from the peer: a peer event, not a fast one, in the buffer. */
    memset(out, 0x5a, 1000);
    gm_provide_receive_buffer_with_tag(b, big, 10, GM_LOW_PRIORITY, 31);
    callbacks = 0;
    gm_send_to_peer_with_callback(a, out, 10, 1000, GM_LOW_PRIORITY, node_b, count_callback,
                                  NULL);
    /* gm_receive_pending and gm_next_event_peek see it without taking it. */
    {
        gm_u16_t sender = 0;
        int type = 0;
        for (double until = seconds_now() + WAIT_SECONDS; (!gm_receive_pending(b)) && seconds_now() < until;)
            ;
        check(gm_receive_pending(b), "gm_receive_pending sees the message");
        type = gm_next_event_peek(b, &sender);
        check(type == GM_PEER_RECV_EVENT && sender == node_a,
              "gm_next_event_peek names its type and sender");
        event = gm_receive(b);
        check(GM_RECV_EVENT_TYPE(event) == GM_PEER_RECV_EVENT &&
                  gm_ntoh_u32(event->recv.length) == 1000 && big[999] == 0x5a &&
                  gm_ntohp(event->recv.message) == big,
              "gm_receive returns the event peeked at");
        for (double until = seconds_now() + WAIT_SECONDS; (callbacks == 0) && seconds_now() < until;)
            gm_unknown(a, gm_receive(a));
        check(callbacks == 1 && last_status == GM_SUCCESS, "the peer send's callback ran");
    }
    check(gm_memorize_message(out, in, 16) == in && memcmp(in, out, 16) == 0,
          "gm_memorize_message copies a message that is elsewhere");

    /* GM's older send forms and the datagram. */
    gm_provide_receive_buffer(b, big, 10, GM_HIGH_PRIORITY);
    gm_send_to_peer(a, out, 10, 200, GM_HIGH_PRIORITY, node_b);
    check(await_type(a, GM_SENT_EVENT) != NULL, "gm_send_to_peer ends with a GM_SENT_EVENT");
    check(await_type(b, GM_HIGH_PEER_RECV_EVENT) != NULL,
          "and arrives as a GM_HIGH_PEER_RECV_EVENT");
    gm_provide_receive_buffer(b, in, 5, GM_LOW_PRIORITY);
    callbacks = 0;
    gm_datagram_send(a, out, 5, 20, GM_LOW_PRIORITY, node_b, PORT_ID, count_callback, NULL);
    check(await_type(b, GM_FAST_PEER_RECV_EVENT) != NULL, "a datagram arrives");
    {
        for (double until = seconds_now() + WAIT_SECONDS; (callbacks == 0) && seconds_now() < until;)
            gm_unknown(a, gm_receive(a));
        check(callbacks == 1 && last_status == GM_SUCCESS, "and its callback says GM_SUCCESS");
    }

    /* A message longer than its size class holds is refused (one longer than gm_mtu() is not:
     * the NIC cuts it into packets). */
    status = send_and_wait(a, out, 5, gm_max_length_for_size(5) + 1, node_b, PORT_ID);
    check(status == GM_INVALID_PARAMETER && contains(nicbar_last_error(), "does not fit"),
          "a message longer than its size class is refused, saying why");

    /* A message longer than gm_mtu(): the NIC cuts it into packets, and it arrives whole in one
     * buffer of its size class. */
    {
        gm_recv_event_t *whole = NULL;
        int intact = 1;
        long i;
        for (i = 0; i < 8000; i++)
            out[i] = (unsigned char)(i * 7 + 3);
        gm_provide_receive_buffer_with_tag(b, big, 13, GM_LOW_PRIORITY, 32);
        status = send_and_wait(a, out, 13, 8000, node_b, PORT_ID);
        check(status == GM_SUCCESS, "a message of 8000 bytes (two packets) is sent");
        double deadline = seconds_now() + WAIT_SECONDS;
        while (whole == NULL && seconds_now() < deadline) {
            gm_recv_event_t *next = gm_receive(b);
            unsigned int type = GM_RECV_EVENT_TYPE(next);
            if (type == GM_PEER_RECV_EVENT || type == GM_RECV_EVENT)
                whole = next;
            else if (type != GM_NO_RECV_EVENT)
                gm_unknown(b, next);
        }
        for (i = 0; whole != NULL && i < 8000; i++)
            intact &= big[i] == (unsigned char)(i * 7 + 3);
        check(whole != NULL && gm_ntoh_u32(whole->recv.length) == 8000 &&
                  gm_ntoh_u8(whole->recv.size) == 13 && gm_ntohp(whole->recv.buffer) == big &&
                  intact,
              "it arrives whole, byte for byte, in the buffer of its size class");
    }

    /* A failed send stalls its connection: later sends wait for gm_resume_sending or end with
     * GM_SEND_DROPPED by gm_drop_sends. Port 3 of the other node is not open yet. */
    {
        struct gm_port *late = NULL;
        unsigned char *late_buffer;
        int before;
        status = send_and_wait(a, out, 5, 10, node_b, 3);
        check(status == GM_SEND_TARGET_PORT_CLOSED, "a send to a port not open fails");
        if (status != GM_SEND_TARGET_PORT_CLOSED)
            printf("  status %d\n", status);
        callbacks = 0;
        gm_send_with_callback(a, out, 5, 10, GM_LOW_PRIORITY, node_b, 3, count_callback, NULL);
        for (double until = seconds_now() + 0.2; seconds_now() < until;)
            gm_unknown(a, gm_receive(a));
        check(callbacks == 0, "the next send to that connection is held (for 0.2 s)");
        gm_drop_sends(a, GM_LOW_PRIORITY, node_b, 3, count_callback, NULL);
        for (double until = seconds_now() + WAIT_SECONDS; (callbacks < 2) && seconds_now() < until;)
            gm_unknown(a, gm_receive(a));
        check(callbacks == 2 && last_status == GM_SUCCESS,
              "gm_drop_sends ends the held send and calls its own callback");
        /* The dropped send's callback ran first, with GM_SEND_DROPPED: check through a fresh
         * stall. */
        check(send_and_wait(a, out, 5, 10, node_b, 3) == GM_SEND_TARGET_PORT_CLOSED,
              "after the drop, sends go again (and fail again here)");
        callbacks = 0;
        gm_send_with_callback(a, out, 5, 10, GM_LOW_PRIORITY, node_b, 3, count_callback, NULL);
        gm_drop_sends(a, GM_LOW_PRIORITY, node_b, 3, NULL, NULL);
        for (double until = seconds_now() + WAIT_SECONDS; (callbacks < 1) && seconds_now() < until;)
            gm_unknown(a, gm_receive(a));
        check(callbacks == 1 && last_status == GM_SEND_DROPPED,
              "a dropped send's callback gets GM_SEND_DROPPED");
        /* Stall it again, open the port, and resume: the held send goes. */
        check(send_and_wait(a, out, 5, 10, node_b, 3) == GM_SEND_TARGET_PORT_CLOSED,
              "the connection stalls again");
        callbacks = 0;
        gm_send_with_callback(a, out, 5, 10, GM_LOW_PRIORITY, node_b, 3, count_callback, NULL);
        status = gm_open(&late, unit + 1, 3, "gm2", GM_API_VERSION);
        check(status == GM_SUCCESS, "the target port opens");
        if (late != NULL) {
            late_buffer = gm_dma_malloc(late, 64);
            gm_provide_receive_buffer(late, late_buffer, 5, GM_LOW_PRIORITY);
            before = callbacks;
            gm_resume_sending(a, GM_LOW_PRIORITY, node_b, 3, NULL, NULL);
            for (double until = seconds_now() + WAIT_SECONDS; (callbacks == before) && seconds_now() < until;)
                gm_unknown(a, gm_receive(a));
            check(callbacks == before + 1 && last_status == GM_SUCCESS,
                  "gm_resume_sending sends the held message");
            check(await_type(late, GM_FAST_RECV_EVENT) != NULL, "and it arrives");
            gm_close(late);
        }
    }

    /* Alarms fire in the order they are due, from gm_unknown; a cancelled one never does. */
    {
        struct gm_alarm first, second, third, cancelled;
        gm_u64_t before = gm_ticks(a);
        gm_initialize_alarm(&first);
        gm_initialize_alarm(&second);
        gm_initialize_alarm(&third);
        gm_initialize_alarm(&cancelled);
        gm_set_alarm(a, &third, 30000, alarm_callback, (void *)(intptr_t)3);
        gm_set_alarm(a, &first, 10000, alarm_callback, (void *)(intptr_t)1);
        gm_set_alarm(a, &cancelled, 15000, alarm_callback, (void *)(intptr_t)9);
        gm_set_alarm(a, &second, 20000, alarm_callback, (void *)(intptr_t)2);
        check(first.state == GM_ALARM_SET, "gm_set_alarm sets the alarm");
        gm_cancel_alarm(&cancelled);
        check(cancelled.state == GM_ALARM_FREE, "gm_cancel_alarm frees it");
        for (double until = seconds_now() + WAIT_SECONDS; (fired_count < 3) && seconds_now() < until;) {
            event = gm_blocking_receive(a);
            gm_unknown(a, event);
        }
        check(fired_count == 3 && fired[0] == 1 && fired[1] == 2 && fired[2] == 3,
              "three alarms fire in the order they are due");
        check(first.state == GM_ALARM_FREE && third.state == GM_ALARM_FREE,
              "a fired alarm is free again");
        check(gm_ticks(a) - before >= 2 * 30000, "gm_ticks counts half microseconds");
        for (double until = seconds_now() + 0.1; seconds_now() < until;)
            gm_unknown(a, gm_receive(a));
        check(fired_count == 3, "the cancelled alarm never fires");
    }

    gm_close(a);
    gm_close(b);
    printf("gm2: %d check(s) failed\n", failures);
    return failures == 0 ? 0 : 1;
}
