/*
 * fastpath.c: the RDMA-write eager fast path and the remote locks from C.
 *
 *     fastpath RANK PROCESSES [MESSAGES [ROUNDS]]
 *
 * PROCESSES processes, rank r on port 3 of NIC unit r (node r). Rank 0 connects to every other
 * rank, each other rank to rank 0; then:
 *
 *  1. Messages: rank 0 and each other rank exchange MESSAGES (default 2000) messages each way,
 *     8 to 1507 bytes long — the short ones fit the receiver's 1024-byte slots and go by one put
 *     into its ring, the long ones fall back to the ordinary path — at most 16 ahead of what came
 *     back; the receiver checks every byte and the order.
 *  2. Passive lock: every other rank takes rank 0's lock 0 ROUNDS (default 200) times
 *     (NICBAR_LOCK_PASSIVE), reads rank 0's counter 0, adds 1 and writes it back, while rank 0
 *     computes without calling the library; then takes the lock shared a few times
 *     (NICBAR_LOCK_PASSIVE_SHARED) to read it.
 *  3. Served lock: the same ROUNDS times on lock 1 and counter 1 (NICBAR_LOCK_SERVED), which
 *     rank 0 grants from its receive calls.
 *
 * Rank 0 then checks both counters hold exactly (PROCESSES - 1) * ROUNDS and both lock words
 * are free. A few refusals are checked on the way. Prints one line per failed check and a
 * summary; exits 0 if every check passed, 1 otherwise.
 *
 * Build: cc -o fastpath fastpath.c $(pkg-config --cflags --libs nicbar)
 * Run:   nicctl emulate --units 3 &   then   ./fastpath 1 3 & ./fastpath 2 3 & ./fastpath 0 3
 */
#define _POSIX_C_SOURCE 200809L

#include <nicbar/gm.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PORT_ID 3
#define MAX_PROCESSES 16
#define WINDOW 16
#define LONGEST 1507
/* How long the program waits with nothing arriving before it gives up. */
#define IDLE_SECONDS 30

static int failures;
static int checks;
static unsigned int rank;
/* Phase ends rank 0 received while it still exchanged messages with other ranks. */
static unsigned int early_ends;

static void check(int ok, const char *what)
{
    checks++;
    if (!ok) {
        printf("rank %u FAILED: %s\n  last error: %s\n", rank, what, nicbar_last_error());
        failures++;
    }
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Message `index` from rank `sender`: its length and bytes. */
static size_t message_length(unsigned int sender, unsigned long index)
{
    return 8 + (size_t)((index * 37 + sender * 11) % (LONGEST - 7));
}

static unsigned char message_byte(unsigned int sender, unsigned long index, size_t at)
{
    return (unsigned char)(sender * 131 + index * 7 + at * 13 + (index >> 3));
}

static void fill(unsigned char *bytes, unsigned int sender, unsigned long index)
{
    size_t length = message_length(sender, index);
    size_t at;
    for (at = 0; at < length; at++) {
        bytes[at] = message_byte(sender, index, at);
    }
}

static int intact(const unsigned char *bytes, size_t length, unsigned int sender,
                  unsigned long index)
{
    size_t at;
    if (length != message_length(sender, index)) {
        return 0;
    }
    for (at = 0; at < length; at++) {
        if (bytes[at] != message_byte(sender, index, at)) {
            return 0;
        }
    }
    return 1;
}

/* Receives the next message, waiting at most IDLE_SECONDS; 0 if none came. */
static int next_message(nicbar_fastpath *fast, unsigned char *buffer, size_t capacity,
                        size_t *length, unsigned int *peer)
{
    double deadline = now() + IDLE_SECONDS;
    while (now() < deadline) {
        gm_status_t status =
            nicbar_fastpath_receive(fast, 100000, buffer, capacity, length, peer, NULL);
        if (status == GM_SUCCESS) {
            return 1;
        }
        if (status != GM_TIMED_OUT) {
            check(0, "nicbar_fastpath_receive");
            return 0;
        }
    }
    check(0, "a message within the idle time");
    return 0;
}

/* Phase 1: MESSAGES each way with every peer; peer p is rank `ranks[p]`. */
static void exchange(nicbar_fastpath *fast, const unsigned int *ranks, unsigned int peers,
                     unsigned long messages)
{
    static unsigned char out[LONGEST];
    static unsigned char in[LONGEST];
    unsigned long sent[MAX_PROCESSES] = {0};
    unsigned long got[MAX_PROCESSES] = {0};
    unsigned long total = 0;
    unsigned long fast_routes = 0;
    int tried_small = 0;
    double idle_since = now();

    while (total < messages * peers) {
        unsigned int p;
        int sent_any = 0;
        size_t length = 0;
        unsigned int from = 0;
        int route = 0;
        gm_status_t status;

        for (p = 0; p < peers; p++) {
            if (sent[p] < messages && sent[p] < got[p] + WINDOW) {
                fill(out, rank, sent[p]);
                status = nicbar_fastpath_send(fast, p, out, message_length(rank, sent[p]),
                                              &route);
                if (status != GM_SUCCESS) {
                    check(0, "nicbar_fastpath_send");
                    return;
                }
                fast_routes += route == NICBAR_FASTPATH_ROUTE_FAST;
                sent[p]++;
                sent_any = 1;
            }
        }
        if (!tried_small) {
            /* A buffer too small keeps the message for the next call. */
            status = nicbar_fastpath_receive(fast, 1000, in, 4, &length, &from, NULL);
            if (status == GM_OUTPUT_BUFFER_TOO_SMALL) {
                check(length >= 8, "a too-small buffer is told the message's length");
                tried_small = 1;
            } else if (status != GM_TIMED_OUT) {
                check(0, "nicbar_fastpath_receive into a buffer of 4 bytes");
                return;
            }
            if (now() - idle_since > IDLE_SECONDS) {
                check(0, "a first message");
                return;
            }
            continue;
        }
        status = nicbar_fastpath_receive(fast, sent_any ? 0 : 1000, in, sizeof in, &length,
                                         &from, &route);
        if (status == GM_TIMED_OUT) {
            if (now() - idle_since > IDLE_SECONDS) {
                check(0, "messages keep coming");
                return;
            }
            continue;
        }
        if (status != GM_SUCCESS || from >= peers) {
            check(0, "nicbar_fastpath_receive");
            return;
        }
        idle_since = now();
        if (got[from] == messages) {
            /* A rank done with the exchange went on to the locks and says it ended a phase. */
            check(length == 1 && (in[0] == 'P' || in[0] == 'S'), "a phase's end");
            early_ends++;
            continue;
        }
        if (!intact(in, length, ranks[from], got[from])) {
            printf("rank %u: message %lu from rank %u (%zu bytes) is not the one sent\n", rank,
                   got[from], ranks[from], length);
            check(0, "every message byte for byte and in order");
            return;
        }
        got[from]++;
        total++;
    }
    check(fast_routes > 0, "short messages took the fast path");
    check(fast_routes < messages * peers, "long messages fell back to the ordinary path");
    printf("rank %u: %lu messages in and %lu out, all intact; %lu by the fast path\n", rank,
           total, messages * peers, fast_routes);
}

/* The refusals: each a status, nothing sent. */
static void refusals(nicbar_fastpath *fast)
{
    static unsigned char big[NICBAR_FASTPATH_MAX_MESSAGE + 1];
    nicbar_lock lock;
    gm_u64_t value = 0;

    check(nicbar_fastpath_send(NULL, 0, big, 8, NULL) == GM_INVALID_PARAMETER,
          "a NULL fast path is refused");
    check(nicbar_fastpath_send(fast, 99, big, 8, NULL) == GM_INVALID_PARAMETER,
          "an unknown peer is refused");
    check(nicbar_fastpath_send(fast, 0, big, sizeof big, NULL) == GM_INVALID_PARAMETER,
          "a message over NICBAR_FASTPATH_MAX_MESSAGE is refused");
    check(nicbar_fastpath_send(fast, 0, NULL, 8, NULL) == GM_INVALID_PARAMETER,
          "NULL bytes are refused");
    check(nicbar_lock_attach(fast, 0, 7, NICBAR_LOCK_PASSIVE, &lock) == GM_INVALID_PARAMETER,
          "a lock the peer does not host is refused");
    check(nicbar_lock_attach(fast, 0, 0, 42, &lock) == GM_INVALID_PARAMETER,
          "an unknown lock mode is refused");
    check(nicbar_lock_attach(fast, 0, 0, NICBAR_LOCK_PASSIVE, &lock) == GM_SUCCESS,
          "nicbar_lock_attach");
    check(nicbar_lock_release(fast, &lock) == GM_INVALID_PARAMETER,
          "releasing a lock not held is refused");
    check(nicbar_fastpath_read_u64(fast, 0, 4096, &value) == GM_INVALID_PARAMETER,
          "a word outside the peer's shared bytes is refused");
}

/* Phases 2 and 3 on a rank other than 0: the peer is rank 0. */
static void contend(nicbar_fastpath *fast, unsigned long rounds)
{
    nicbar_lock passive;
    nicbar_lock shared;
    nicbar_lock served;
    unsigned long i;
    gm_u64_t value = 0;
    unsigned char done = 'P';

    check(nicbar_lock_attach(fast, 0, 0, NICBAR_LOCK_PASSIVE, &passive) == GM_SUCCESS,
          "attach the passive lock");
    check(nicbar_lock_attach(fast, 0, 0, NICBAR_LOCK_PASSIVE_SHARED, &shared) == GM_SUCCESS,
          "attach the passive lock, shared");
    check(nicbar_lock_attach(fast, 0, 1, NICBAR_LOCK_SERVED, &served) == GM_SUCCESS,
          "attach the served lock");
    if (failures) {
        return;
    }
    for (i = 0; i < rounds && !failures; i++) {
        check(nicbar_lock_acquire(fast, &passive) == GM_SUCCESS, "acquire the passive lock");
        if (i == 0) {
            check(nicbar_lock_acquire(fast, &passive) == GM_BUSY,
                  "acquiring a lock held already is refused");
        }
        check(nicbar_fastpath_read_u64(fast, 0, 0, &value) == GM_SUCCESS, "read counter 0");
        check(nicbar_fastpath_write_u64(fast, 0, 0, value + 1) == GM_SUCCESS,
              "write counter 0");
        check(nicbar_lock_release(fast, &passive) == GM_SUCCESS, "release the passive lock");
    }
    for (i = 0; i < 5 && !failures; i++) {
        check(nicbar_lock_acquire(fast, &shared) == GM_SUCCESS, "acquire the lock shared");
        check(nicbar_fastpath_read_u64(fast, 0, 0, &value) == GM_SUCCESS,
              "read counter 0, shared");
        check(value >= rounds, "counter 0 holds this rank's increments at least");
        check(nicbar_lock_release(fast, &shared) == GM_SUCCESS, "release the shared lock");
    }
    check(nicbar_fastpath_send(fast, 0, &done, 1, NULL) == GM_SUCCESS, "say passive done");
    for (i = 0; i < rounds && !failures; i++) {
        check(nicbar_lock_acquire(fast, &served) == GM_SUCCESS, "acquire the served lock");
        check(nicbar_fastpath_read_u64(fast, 0, 8, &value) == GM_SUCCESS, "read counter 1");
        check(nicbar_fastpath_write_u64(fast, 0, 8, value + 1) == GM_SUCCESS,
              "write counter 1");
        check(nicbar_lock_release(fast, &served) == GM_SUCCESS, "release the served lock");
    }
    done = 'S';
    check(nicbar_fastpath_send(fast, 0, &done, 1, NULL) == GM_SUCCESS, "say served done");
}

/* Phases 2 and 3 on rank 0: compute, then serve until every other rank is done. */
static void host(nicbar_fastpath *fast, unsigned int peers, unsigned long rounds)
{
    volatile uint64_t work = 1;
    unsigned long i;
    unsigned int done = early_ends;
    unsigned char byte[LONGEST];
    size_t length = 0;
    unsigned int from = 0;
    gm_u64_t counter0 = 0;
    gm_u64_t counter1 = 0;
    gm_u64_t word0 = 1;
    gm_u64_t word1 = 1;

    /* The passive lock needs nothing of this process: it computes without calling the library. */
    for (i = 0; i < 20000000UL; i++) {
        work = work * 6364136223846793005ULL + i;
    }
    /* The served lock is granted from inside these calls. */
    while (done < 2 * peers && next_message(fast, byte, sizeof byte, &length, &from)) {
        check(length == 1 && (byte[0] == 'P' || byte[0] == 'S'), "a phase's end");
        done++;
    }
    check(nicbar_fastpath_local_read_u64(fast, 0, &counter0) == GM_SUCCESS, "local counter 0");
    check(nicbar_fastpath_local_read_u64(fast, 8, &counter1) == GM_SUCCESS, "local counter 1");
    check(nicbar_lock_word(fast, 0, &word0) == GM_SUCCESS, "lock word 0");
    check(nicbar_lock_word(fast, 1, &word1) == GM_SUCCESS, "lock word 1");
    check(counter0 == peers * rounds, "passive lock: every increment counted once");
    check(counter1 == peers * rounds, "served lock: every increment counted once");
    check(word0 == 0 && word1 == 0, "both lock words free at the end");
    printf("rank 0: counters %llu (passive) and %llu (served) of %lu, lock words %llu %llu\n",
           (unsigned long long)counter0, (unsigned long long)counter1, peers * rounds,
           (unsigned long long)word0, (unsigned long long)word1);
}

int main(int argc, char **argv)
{
    unsigned int processes;
    unsigned long messages;
    unsigned long rounds;
    nicbar_fastpath_config config;
    nicbar_fastpath_stats stats;
    nicbar_fastpath *fast = NULL;
    unsigned int ranks[MAX_PROCESSES];
    unsigned int peers = 0;
    unsigned int p;
    unsigned char word = 'B';
    unsigned char in[LONGEST];
    size_t length = 0;
    unsigned int from = 0;

    if (argc < 3) {
        fprintf(stderr, "usage: fastpath RANK PROCESSES [MESSAGES [ROUNDS]]\n");
        return 2;
    }
    rank = (unsigned int)atoi(argv[1]);
    processes = (unsigned int)atoi(argv[2]);
    messages = argc > 3 ? strtoul(argv[3], NULL, 10) : 2000;
    rounds = argc > 4 ? strtoul(argv[4], NULL, 10) : 200;
    if (processes < 2 || processes > MAX_PROCESSES || rank >= processes) {
        fprintf(stderr, "fastpath: 2 to %d processes, and a rank below their count\n",
                MAX_PROCESSES);
        return 2;
    }

    nicbar_fastpath_config_default(&config);
    config.locks = 2;
    config.shared_bytes = 16;
    config.slots = 1u << 9;
    check(nicbar_fastpath_open(&fast, rank, PORT_ID, &config) == GM_INVALID_PARAMETER &&
              fast == NULL,
          "a ring over NICBAR_FASTPATH_MAX_SLOTS is refused");
    config.slots = 32;
    if (nicbar_fastpath_open(&fast, rank, PORT_ID, &config) != GM_SUCCESS) {
        check(0, "nicbar_fastpath_open");
        return 1;
    }
    if (rank == 0) {
        for (p = 1; p < processes; p++) {
            ranks[peers++] = p;
        }
    } else {
        ranks[peers++] = 0;
    }
    for (p = 0; p < peers; p++) {
        unsigned int id = 99;
        check(nicbar_fastpath_connect(fast, ranks[p], PORT_ID, &id) == GM_SUCCESS && id == p,
              "nicbar_fastpath_connect");
    }
    check(nicbar_fastpath_wait_connected(fast) == GM_SUCCESS, "nicbar_fastpath_wait_connected");
    if (failures) {
        return 1;
    }
    refusals(fast);
    exchange(fast, ranks, peers, messages);
    if (rank == 0) {
        host(fast, peers, rounds);
        /* Goodbye by the ordinary path (it consumes no ring slot, so it owes no credit back),
         * then wait for every rank's answer before closing. */
        check(nicbar_fastpath_flush(fast) == GM_SUCCESS, "nicbar_fastpath_flush");
        for (p = 0; p < peers; p++) {
            check(nicbar_fastpath_send_ordinary(fast, p, &word, 1) == GM_SUCCESS, "say goodbye");
        }
        for (p = 0; p < peers && !failures; p++) {
            check(next_message(fast, in, sizeof in, &length, &from) && length == 1 &&
                      in[0] == 'A',
                  "every rank answers the goodbye");
        }
    } else {
        contend(fast, rounds);
        check(next_message(fast, in, sizeof in, &length, &from) && length == 1 && in[0] == 'B',
              "the goodbye");
        check(nicbar_fastpath_flush(fast) == GM_SUCCESS, "nicbar_fastpath_flush");
        word = 'A';
        check(nicbar_fastpath_send_ordinary(fast, 0, &word, 1) == GM_SUCCESS, "answer");
    }
    check(nicbar_fastpath_get_stats(fast, &stats) == GM_SUCCESS, "nicbar_fastpath_get_stats");
    printf("rank %u: sent %llu fast, %llu too long, %llu without credit, %llu ordinary; "
           "received %llu fast, %llu ordinary; %llu credit puts, %llu rejected\n",
           rank, (unsigned long long)stats.sent_fast,
           (unsigned long long)stats.fallback_too_long,
           (unsigned long long)stats.fallback_no_credit,
           (unsigned long long)stats.fallback_no_ring, (unsigned long long)stats.received_fast,
           (unsigned long long)stats.received_ordinary, (unsigned long long)stats.credit_puts,
           (unsigned long long)stats.rejected);
    check(nicbar_fastpath_close(fast) == GM_SUCCESS, "nicbar_fastpath_close");
    check(nicbar_fastpath_close(fast) == GM_SUCCESS, "closing twice is ignored");
    printf("fastpath: rank %u of %u: %d check(s), %d failed\n", rank, processes, checks,
           failures);
    return failures ? 1 : 0;
}
