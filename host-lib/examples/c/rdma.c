/*
 * rdma.c: one-sided operations from C — registered memory of any kind (malloc, the stack),
 * gm_put with remote completion, gm_get, gm_directed_send_with_callback, the NIC atomics
 * (nicbar_atomic_fetch_add, _swap, _compare_swap), nicbar_fence, and refusals that name their
 * rule while the target's memory stays untouched.
 *
 *     rdma UNIT          with a daemon running NICs UNIT and UNIT+1 (port 3 of each is used)
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

#define PORT_ID 3
#define BIG (1u << 20)

static int failures;

static void check(int ok, const char *what)
{
    printf("%s: %s\n", ok ? "ok" : "FAILED", what);
    if (!ok) {
        printf("  last error: %s\n", nicbar_last_error());
        failures++;
    }
}

static int done;
static gm_status_t done_status;

static void on_done(struct gm_port *port, void *context, gm_status_t status)
{
    (void)port;
    (void)context;
    done = 1;
    done_status = status;
}

/* Runs both ports' events until the last operation's callback has run; its status. */
static gm_status_t wait_done(struct gm_port *a, struct gm_port *b)
{
    for (double until = seconds_now() + WAIT_SECONDS; (!done) && seconds_now() < until;) {
        gm_unknown(a, gm_receive(a));
        gm_unknown(b, gm_receive(b));
    }
    if (!done) {
        return GM_TIMED_OUT;
    }
    done = 0;
    return done_status;
}

static int all(const unsigned char *bytes, size_t len, unsigned char value)
{
    size_t i;
    for (i = 0; i < len; i++) {
        if (bytes[i] != value) {
            return 0;
        }
    }
    return 1;
}

int main(int argc, char **argv)
{
    struct gm_port *a = NULL;
    struct gm_port *b = NULL;
    unsigned int unit = argc > 1 ? (unsigned int)atoi(argv[1]) : 0;
    unsigned int b_node = 0;
    unsigned char *source = malloc(BIG);
    unsigned char *target = calloc(1, BIG);
    unsigned char *back = calloc(1, BIG);
    uint64_t words[4] = {0, 0, 0, 0}; /* on the stack: b's atomic words */
    gm_u64_t result = 0;
    gm_remote_ptr_t remote;
    gm_remote_ptr_t word;
    size_t i;

    if (source == NULL || target == NULL || back == NULL) {
        return 2;
    }
    for (i = 0; i < BIG; i++) {
        source[i] = (unsigned char)(i * 7 + (i >> 12));
    }
    check(gm_init() == GM_SUCCESS, "gm_init");
    check(gm_open(&a, unit, PORT_ID, "rdma", GM_API_VERSION) == GM_SUCCESS, "gm_open a");
    check(gm_open(&b, unit + 1, PORT_ID, "rdma", GM_API_VERSION) == GM_SUCCESS, "gm_open b");
    if (failures) {
        return 1;
    }
    check(gm_get_node_id(b, &b_node) == GM_SUCCESS, "gm_get_node_id");

    check(gm_register_memory(a, source, BIG) == GM_SUCCESS, "gm_register_memory (malloc)");
    check(gm_register_memory(a, back, BIG) == GM_SUCCESS, "gm_register_memory (a second)");
    check(gm_register_memory(b, target, BIG) == GM_SUCCESS, "gm_register_memory (target)");
    check(gm_register_memory(b, words, sizeof words) == GM_SUCCESS,
          "gm_register_memory (the stack)");
    remote = nicbar_remote_ptr(b, target);
    word = nicbar_remote_ptr(b, &words[1]);
    check(remote != 0 && word != 0, "nicbar_remote_ptr names registered bytes");
    check(nicbar_remote_ptr(b, source) == 0, "nicbar_remote_ptr refuses unregistered bytes");

    /* Refusals: each names its rule, and the target stays zero. */
    gm_put(a, source, remote, 100, GM_LOW_PRIORITY, b_node, PORT_ID, on_done, NULL);
    check(wait_done(a, b) == GM_PERMISSION_DENIED, "a put before gm_allow_remote_memory_access");
    check(strstr(nicbar_last_error(), "not allowed remote memory access") != NULL,
          "  ... and nicbar_last_error says so");
    check(gm_allow_remote_memory_access(b) == GM_SUCCESS, "gm_allow_remote_memory_access");
    gm_put(a, source, remote + BIG - 10, 100, GM_LOW_PRIORITY, b_node, PORT_ID, on_done, NULL);
    check(wait_done(a, b) == GM_INVALID_PARAMETER, "a put past the region's end");
    check(strstr(nicbar_last_error(), "outside the target's region") != NULL,
          "  ... and nicbar_last_error says so");
    gm_put(a, &result, remote, 8, GM_LOW_PRIORITY, b_node, PORT_ID, on_done, NULL);
    check(wait_done(a, b) == GM_PERMISSION_DENIED, "a put from unregistered memory");
    check(all(target, BIG, 0), "refused operations left the target untouched");

    /* A 1 MiB put: its callback means the bytes are in the target's memory. */
    gm_put(a, source, remote, BIG, GM_LOW_PRIORITY, b_node, PORT_ID, on_done, NULL);
    check(wait_done(a, b) == GM_SUCCESS, "gm_put of 1 MiB");
    check(memcmp(source, target, BIG) == 0, "  ... every byte is in the target");
    gm_get(a, remote, back, BIG, GM_LOW_PRIORITY, b_node, PORT_ID, on_done, NULL);
    check(wait_done(a, b) == GM_SUCCESS, "gm_get of 1 MiB");
    check(memcmp(source, back, BIG) == 0, "  ... every byte came back");
    gm_directed_send_with_callback(a, source + 5, remote + 3, 1000, GM_LOW_PRIORITY, b_node,
                                   PORT_ID, on_done, NULL);
    check(wait_done(a, b) == GM_SUCCESS && memcmp(target + 3, source + 5, 1000) == 0,
          "gm_directed_send_with_callback");
    check(nicbar_fence(a, b_node) == GM_SUCCESS, "nicbar_fence");

    /* NIC atomics on a word of b's stack. */
    for (i = 0; i < 5; i++) {
        nicbar_atomic_fetch_add(a, word, 10, &result, b_node, PORT_ID, on_done, NULL);
        check(wait_done(a, b) == GM_SUCCESS && result == 10 * i, "nicbar_atomic_fetch_add");
    }
    check(words[1] == 50, "  ... the word is 50");
    nicbar_atomic_compare_swap(a, word, 49, 7, &result, b_node, PORT_ID, on_done, NULL);
    check(wait_done(a, b) == GM_SUCCESS && result == 50 && words[1] == 50,
          "nicbar_atomic_compare_swap that does not match");
    nicbar_atomic_compare_swap(a, word, 50, 7, &result, b_node, PORT_ID, on_done, NULL);
    check(wait_done(a, b) == GM_SUCCESS && result == 50 && words[1] == 7,
          "nicbar_atomic_compare_swap that matches");
    nicbar_atomic_swap(a, word, 99, &result, b_node, PORT_ID, on_done, NULL);
    check(wait_done(a, b) == GM_SUCCESS && result == 7 && words[1] == 99, "nicbar_atomic_swap");
    nicbar_atomic_swap(a, word + 4, 1, NULL, b_node, PORT_ID, on_done, NULL);
    check(wait_done(a, b) == GM_INVALID_PARAMETER && words[1] == 99,
          "an atomic on a misaligned word is refused");

    check(gm_deregister_memory(b, target, BIG) == GM_SUCCESS, "gm_deregister_memory");
    gm_put(a, source, remote, 100, GM_LOW_PRIORITY, b_node, PORT_ID, on_done, NULL);
    check(wait_done(a, b) == GM_PERMISSION_DENIED, "a put to a deregistered region");

    gm_close(a);
    gm_close(b);
    gm_finalize();
    free(source);
    free(target);
    free(back);
    printf("rdma: %d check(s) failed\n", failures);
    return failures == 0 ? 0 : 1;
}
