/*
 * cut_short.c: a receiver outlives a sender that dies part way through a long message, as GM
 * programs expect. The receiver handles GM_RECV_EVENT alone and passes every other event to
 * gm_unknown, which must give a buffer whose message was cut short back to the NIC instead of
 * ending the program.
 *
 *     cut_short receive UNIT PORT READY
 *                                      offers one 16 MiB buffer, then creates the file READY;
 *                                      exits 0 once the 8-byte message
 *                                      "survived" arrives in it (after the long one, or after
 *                                      the long one was cut short); prints "cut short" if it was
 *     cut_short die UNIT PORT NODE     sends 16 MiB - 8 bytes to port PORT of NODE and exits at
 *                                      once, without waiting (the message is cut short)
 *     cut_short last UNIT PORT NODE    sends the 8-byte message "survived" and waits for it
 */
#define _POSIX_C_SOURCE 200809L

#include <nicbar/gm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SIZE 24 /* 2^24 - 8 bytes */
#define WAIT_SECONDS 60.0

static double seconds_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

static int done;
static void sent(struct gm_port *port, void *context, gm_status_t status)
{
    (void)port;
    (void)context;
    done = status == GM_SUCCESS ? 1 : -1;
}

int main(int argc, char **argv)
{
    struct gm_port *port;
    unsigned int unit, port_id;
    unsigned long length = gm_max_length_for_size(SIZE);
    unsigned char *buffer;
    if (argc < 4) {
        fprintf(stderr, "usage: cut_short receive|die|last UNIT PORT [NODE]\n");
        return 2;
    }
    unit = (unsigned int)strtoul(argv[2], NULL, 0);
    port_id = (unsigned int)strtoul(argv[3], NULL, 0);
    if (gm_open(&port, unit, port_id, "cut_short", GM_API_VERSION) != GM_SUCCESS) {
        fprintf(stderr, "gm_open: %s\n", nicbar_last_error());
        return 1;
    }
    buffer = gm_dma_malloc(port, length);
    if (buffer == NULL) {
        fprintf(stderr, "gm_dma_malloc: %s\n", nicbar_last_error());
        return 1;
    }
    if (strcmp(argv[1], "receive") == 0) {
        double deadline = seconds_now() + WAIT_SECONDS;
        int cut = 0;
        gm_provide_receive_buffer(port, buffer, SIZE, GM_LOW_PRIORITY);
        if (argc > 4) {
            FILE *ready = fopen(argv[4], "w");
            if (ready != NULL)
                fclose(ready);
        }
        while (seconds_now() < deadline) {
            gm_recv_event_t *event = gm_receive(port);
            switch (GM_RECV_EVENT_TYPE(event)) {
            case GM_RECV_EVENT:
                if (gm_ntoh_u32(event->recv.length) == 8 && memcmp(buffer, "survived", 8) == 0) {
                    printf("%s\nthe last message arrived\n", cut ? "cut short" : "whole");
                    return 0;
                }
                /* The long message arrived whole: offer the buffer again. */
                gm_provide_receive_buffer(port, buffer, SIZE, GM_LOW_PRIORITY);
                break;
            case GM_NO_RECV_EVENT:
                break;
            default:
                /* GM's idiom passes every other event on, a refused buffer included. */
                if (GM_RECV_EVENT_TYPE(event) == GM_BAD_RECV_TOKEN_EVENT)
                    cut = 1;
                gm_unknown(port, event);
            }
        }
        printf("FAILED: no last message within %.0f s\n", WAIT_SECONDS);
        return 1;
    }
    if (argc < 5)
        return 2;
    {
        unsigned int node = (unsigned int)strtoul(argv[4], NULL, 0);
        double deadline = seconds_now() + WAIT_SECONDS;
        if (strcmp(argv[1], "die") == 0) {
            memset(buffer, 0x5a, length);
            gm_send_with_callback(port, buffer, SIZE, length, GM_LOW_PRIORITY, node, 2, sent,
                                  NULL);
            /* Die at once, without closing: the NIC has started on the message or not. */
            (void)deadline;
            _exit(0);
        }
        memcpy(buffer, "survived", 8);
        gm_send_with_callback(port, buffer, SIZE, 8, GM_LOW_PRIORITY, node, 2, sent, NULL);
        while (done == 0 && seconds_now() < deadline)
            gm_unknown(port, gm_receive(port));
        return done == 1 ? 0 : 1;
    }
}
