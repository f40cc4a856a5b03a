/*
 * utilities.c: GM 2's calls besides talking to the NIC, as GM documents them: gm_printf and
 * gm_eprintf, the CRCs, the containers (hash tables, lookaside lists, zones, mark sets),
 * gm_min_message_size, gm_flush_alarm and GM 1's gm_handle_sent_tokens.
 *
 *     utilities UNIT    with a daemon running NIC UNIT
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

static int failures;

static void check(int ok, const char *what)
{
    printf("%s: %s\n", ok ? "ok" : "FAILED", what);
    fflush(stdout);
    if (!ok)
        failures++;
}

static double seconds_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

static int alarm_fired;
static void on_alarm(void *context) { alarm_fired = (int)(intptr_t)context; }

static int sent_count;
static void on_sent(struct gm_port *port, void *context, gm_status_t status)
{
    (void)port;
    (void)context;
    if (status == GM_SUCCESS)
        sent_count++;
}

int main(int argc, char **argv)
{
    struct gm_port *port;
    unsigned int unit = argc > 1 ? (unsigned int)strtoul(argv[1], NULL, 0) : 0;

    check(gm_printf("printed by gm_printf %d %s\n", 42, "ok") == 27, "gm_printf formats");
    fflush(stdout);
    check(gm_eprintf("printed by gm_eprintf %d\n", 7) == 24, "gm_eprintf formats");
    check(gm_crc_str("123456789") == 0xcbf43926ul && gm_crc("123456789", 9) == 0xcbf43926ul,
          "gm_crc and gm_crc_str are CRC-32");

    /* Hash tables: pointer keys and data, then copied keys and data. */
    {
        struct gm_hash *names = gm_create_hash(gm_hash_compare_strings, gm_hash_hash_string, 0,
                                               0, 4, 0);
        char key[16];
        int i, found = 1;
        static char *words[64];
        for (i = 0; i < 64; i++) {
            snprintf(key, sizeof key, "w%d", i);
            words[i] = gm_strdup(key);
            gm_hash_insert(names, words[i], words[i]);
        }
        for (i = 0; i < 64; i++) {
            snprintf(key, sizeof key, "w%d", i);
            found = found && gm_hash_find(names, key) == words[i];
        }
        check(found && gm_hash_find(names, "nope") == NULL,
              "a string-keyed hash finds all 64 entries (growing past its start)");
        check(gm_hash_insert(names, words[3], words[3]) != GM_SUCCESS,
              "a key goes into a table once");
        check(gm_hash_remove(names, "w5") == words[5] && gm_hash_find(names, "w5") == NULL,
              "gm_hash_remove returns the datum and forgets the key");
        gm_hash_rekey(names, "w6", words[5]);
        check(gm_hash_find(names, "w5") == words[6] && gm_hash_find(names, "w6") == NULL,
              "gm_hash_rekey moves the datum to the new key");
        gm_destroy_hash(names);
    }
    {
        struct gm_hash *copies = gm_create_hash(NULL, NULL, sizeof(long), sizeof(double), 0, 0);
        long k = 99;
        double v = 2.5, *got;
        gm_hash_insert(copies, &k, &v);
        k = 1;
        v = 0;
        k = 99;
        got = gm_hash_find(copies, &k);
        check(got != NULL && *got == 2.5 && got != &v,
              "a table with key and data lengths keeps copies");
        check(gm_hash_compare_ints(&(int){3}, &(int){3}) == 0 &&
                  gm_hash_compare_longs(&(long){3}, &(long){4}) != 0 &&
                  gm_hash_compare_ptrs(&k, &k) == 0 && gm_hash_hash_ptr(&k) == gm_hash_hash_ptr(&k),
              "GM's compare and hash helpers");
        gm_destroy_hash(copies);
    }

    /* Lookaside lists. */
    {
        struct gm_lookaside *list = gm_create_lookaside(48, 2);
        unsigned char *a = gm_lookaside_alloc(list), *b = gm_lookaside_zalloc(list), *c;
        int zero = 1;
        for (int i = 0; i < 48; i++)
            zero = zero && b[i] == 0;
        memset(a, 0xff, 48);
        check(a != NULL && b != NULL && a != b && zero, "gm_lookaside_alloc and _zalloc");
        gm_lookaside_free(a);
        c = gm_lookaside_alloc(list);
        check(c == a, "a freed entry is recycled");
        gm_lookaside_free(b);
        gm_lookaside_free(c);
        gm_destroy_lookaside(list);
    }

    /* Zones over memory the program owns. */
    {
        static unsigned char memory[4096];
        struct gm_zone *zone = gm_zone_create_zone(memory, sizeof memory);
        unsigned char *a = gm_zone_malloc(zone, 100), *b = gm_zone_calloc(zone, 10, 10), *c;
        check(a != NULL && b != NULL && gm_zone_addr_in_zone(zone, a) &&
                  gm_zone_addr_in_zone(zone, b + 99) && !gm_zone_addr_in_zone(zone, &zone) &&
                  (b >= a + 100 || b + 100 <= a),
              "gm_zone_malloc and _calloc give disjoint memory inside the zone");
        check(gm_zone_malloc(zone, 8192) == NULL, "a zone cannot give more than it has");
        check(gm_zone_free(zone, a) == 1 && gm_zone_free(zone, a) == 0,
              "gm_zone_free frees once");
        c = gm_zone_malloc(zone, 100);
        check(c == a, "freed zone memory is used again");
        gm_zone_destroy_zone(zone);
    }

    /* Mark sets. */
    {
        struct gm_mark_set *set = NULL;
        gm_mark_t marks[40];
        int valid = 1;
        check(gm_create_mark_set(&set, 8) == GM_SUCCESS && set != NULL, "gm_create_mark_set");
        for (int i = 0; i < 40; i++)
            valid = valid && gm_mark(set, &marks[i]) == GM_SUCCESS;
        for (int i = 0; i < 40; i++)
            valid = valid && gm_mark_is_valid(set, &marks[i]);
        check(valid, "40 marks are valid");
        gm_unmark(set, &marks[7]);
        check(!gm_mark_is_valid(set, &marks[7]) && gm_mark_is_valid(set, &marks[8]),
              "gm_unmark invalidates one mark");
        gm_unmark_all(set);
        valid = 0;
        for (int i = 0; i < 40; i++)
            valid = valid || gm_mark_is_valid(set, &marks[i]);
        check(!valid, "gm_unmark_all invalidates every mark");
        gm_destroy_mark_set(set);
    }

    if (gm_open(&port, unit, 2, "utilities", GM_API_VERSION) != GM_SUCCESS) {
        printf("FAILED: gm_open: %s\n", nicbar_last_error());
        return 1;
    }
    check(gm_min_message_size(port) == 3, "gm_min_message_size is size class 3");

    /* gm_flush_alarm: an alarm set for an hour fires now. */
    {
        struct gm_alarm alarm;
        double deadline = seconds_now() + 20.0;
        gm_initialize_alarm(&alarm);
        gm_set_alarm(port, &alarm, 3600ull * 1000000ull, on_alarm, (void *)(intptr_t)5);
        gm_flush_alarm(&alarm);
        while (alarm_fired == 0 && seconds_now() < deadline)
            gm_unknown(port, gm_receive(port));
        check(alarm_fired == 5, "gm_flush_alarm makes a set alarm fire now");
    }

    /* GM 1's gm_handle_sent_tokens runs the callbacks of ended sends. */
    {
        unsigned int node;
        unsigned char *out = gm_dma_malloc(port, 16), *in = gm_dma_malloc(port, 16);
        double deadline = seconds_now() + 20.0;
        int received = 0;
        gm_get_node_id(port, &node);
        gm_provide_receive_buffer(port, in, 5, GM_LOW_PRIORITY);
        gm_send_with_callback(port, out, 5, 16, GM_LOW_PRIORITY, node, 2, on_sent, NULL);
        while ((sent_count == 0 || !received) && seconds_now() < deadline) {
            gm_recv_event_t *event = gm_receive(port);
            switch (GM_RECV_EVENT_TYPE(event)) {
            case GM_SENT_EVENT:
                gm_handle_sent_tokens(port, event);
                break;
            case GM_RECV_EVENT:
                received = 1;
                break;
            case GM_NO_RECV_EVENT:
                break;
            default:
                gm_unknown(port, event);
            }
        }
        check(sent_count == 1 && received, "gm_handle_sent_tokens runs the send's callback");
    }
    gm_close(port);
    printf("utilities: %d check(s) failed\n", failures);
    return failures == 0 ? 0 : 1;
}
