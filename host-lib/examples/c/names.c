/*
 * names.c: host names, node ids and unique ids as GM documents them, then a message sent to a
 * node found by its name.
 *
 *     names UNIT OWN_NAME PEER_NAME PEER_NODE OTHER_NAME OTHER_NODE MAX_NODE
 *
 * Opens port 2 of NIC UNIT, whose host name on the fabric must be OWN_NAME; PEER_NAME must be
 * node PEER_NODE (a process of this program runs there too, on port 2) and OTHER_NAME node
 * OTHER_NODE; MAX_NODE is the largest node id of the fabric. Checks every lookup each way and
 * what an unknown name, node or unique id gives, prints "unique own XX:..." and "unique peer
 * XX:..." (the 6 bytes of this node's unique id and of the peer's as this daemon names them, for
 * the caller to compare across daemons), then sends "from OWN_NAME" to the node looked up by
 * PEER_NAME and waits for "from PEER_NAME" from it.
 *
 * Prints one line per check and exits 0 if all of them passed, 1 otherwise.
 */
#define _POSIX_C_SOURCE 200809L

#include <nicbar/gm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PORT_ID 2
/* How long a message keeps being sent to a peer whose port is not open yet. */
#define STARTUP_SECONDS 20

static int failures;

static void check(int ok, const char *what)
{
    printf("%s: %s\n", ok ? "ok" : "FAILED", what);
    if (!ok) {
        printf("  last error: %s\n", nicbar_last_error());
        failures++;
    }
}

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void print_unique(const char *which, const char unique[6])
{
    int i;
    printf("unique %s ", which);
    for (i = 0; i < 6; i++)
        printf("%02x%s", (unsigned char)unique[i], i < 5 ? ":" : "\n");
}

static int sends_in_flight;
static gm_status_t last_send_status = GM_SUCCESS;

static void send_done(struct gm_port *p, void *context, gm_status_t status)
{
    (void)p;
    (void)context;
    sends_in_flight--;
    last_send_status = status;
}

/* The message that arrived, once one has. */
static char arrived[64];
static unsigned int arrived_from = GM_NO_SUCH_NODE_ID;
static int arrived_present;

static void handle_next_event(struct gm_port *port)
{
    gm_recv_event_t *event = gm_blocking_receive(port);
    switch (GM_RECV_EVENT_TYPE(event)) {
    case GM_RECV_EVENT:
    case GM_PEER_RECV_EVENT:
    case GM_FAST_RECV_EVENT:
    case GM_FAST_PEER_RECV_EVENT: {
        unsigned int length = gm_ntoh_u32(event->recv.length);
        void *data = gm_memorize_message(gm_ntohp(event->recv.message),
                                         gm_ntohp(event->recv.buffer), length);
        if (length >= sizeof arrived)
            length = sizeof arrived - 1;
        memcpy(arrived, data, length);
        arrived[length] = '\0';
        arrived_from = gm_ntoh_u16(event->recv.sender_node_id);
        arrived_present = 1;
        break;
    }
    default:
        gm_unknown(port, event);
    }
}

/* Sends `length` bytes of `buffer` to `node` and waits until the send has ended, sending again
 * while the peer's port is not open yet. */
static gm_status_t send_and_wait(struct gm_port *port, void *buffer, unsigned int size,
                                 unsigned int length, unsigned int node)
{
    double give_up = now_seconds() + STARTUP_SECONDS;
    for (;;) {
        sends_in_flight++;
        gm_send_with_callback(port, buffer, size, length, GM_LOW_PRIORITY, node, PORT_ID,
                              send_done, NULL);
        while (sends_in_flight > 0)
            handle_next_event(port);
        if (last_send_status != GM_SEND_TARGET_PORT_CLOSED || now_seconds() > give_up)
            return last_send_status;
        /* As in GM, a failed send stalls the connection until the program resumes it. */
        gm_resume_sending(port, GM_LOW_PRIORITY, node, PORT_ID, NULL, NULL);
        {
            struct timespec pause = {0, 10 * 1000 * 1000};
            nanosleep(&pause, NULL);
        }
    }
}

int main(int argc, char **argv)
{
    struct gm_port *port = NULL;
    unsigned int unit, peer_node, other_node, max_node, own = 0, found = 0, n = 0;
    const char *own_name, *peer_name, *other_name;
    char name[GM_MAX_HOST_NAME_LEN];
    char name_ex[GM_MAX_HOST_NAME_LEN + 1];
    char mine[6], board[6], theirs[6], stranger[6] = {0, 0, 0, 0, 0, 0};
    char unknown_name[] = "no-such-host.invalid";
    char text[64];
    const char *peer_text;
    unsigned int size;
    void *out, *in;
    gm_status_t status;

    if (argc != 8) {
        fprintf(stderr, "usage: names UNIT OWN_NAME PEER_NAME PEER_NODE OTHER_NAME OTHER_NODE "
                        "MAX_NODE\n");
        return 2;
    }
    unit = (unsigned int)strtoul(argv[1], NULL, 10);
    own_name = argv[2];
    peer_name = argv[3];
    peer_node = (unsigned int)strtoul(argv[4], NULL, 10);
    other_name = argv[5];
    other_node = (unsigned int)strtoul(argv[6], NULL, 10);
    max_node = (unsigned int)strtoul(argv[7], NULL, 10);

    if (gm_init() != GM_SUCCESS ||
        (status = gm_open(&port, unit, PORT_ID, "names", GM_API_VERSION)) != GM_SUCCESS) {
        fprintf(stderr, "names: gm_open: %s\n", nicbar_last_error());
        return 1;
    }
    check(gm_get_node_id(port, &own) == GM_SUCCESS, "gm_get_node_id");
    /* The peer's message may come while the lookups run: a buffer waits for it from the start. */
    size = gm_min_size_for_length(sizeof text);
    out = gm_dma_malloc(port, gm_max_length_for_size(size));
    in = gm_dma_malloc(port, gm_max_length_for_size(size));
    if (out == NULL || in == NULL) {
        fprintf(stderr, "names: gm_dma_malloc: %s\n", nicbar_last_error());
        return 1;
    }
    gm_provide_receive_buffer(port, in, size, GM_LOW_PRIORITY);

    /* This node's own name. */
    memset(name, 'x', sizeof name);
    check(gm_get_host_name(port, name) == GM_SUCCESS && strcmp(name, own_name) == 0,
          "gm_get_host_name gives this node's name on the fabric");
    check(gm_get_host_name(port, NULL) == GM_INVALID_PARAMETER,
          "gm_get_host_name refuses a NULL buffer");
    check(gm_get_host_name(NULL, name) == GM_INVALID_PARAMETER,
          "gm_get_host_name refuses a NULL port");

    /* Names to node ids. */
    check(gm_host_name_to_node_id_ex(port, 1000, own_name, &found) == GM_SUCCESS && found == own,
          "gm_host_name_to_node_id_ex finds this node by its name");
    check(gm_host_name_to_node_id_ex(port, 1000, peer_name, &found) == GM_SUCCESS &&
              found == peer_node,
          "gm_host_name_to_node_id_ex finds the peer by its name");
    check(gm_host_name_to_node_id_ex(port, 0, other_name, &found) == GM_SUCCESS &&
              found == other_node,
          "gm_host_name_to_node_id_ex finds a third node by its name");
    if (peer_node != GM_NO_SUCH_NODE_ID)
        check(gm_host_name_to_node_id(port, (char *)peer_name) == peer_node,
              "gm_host_name_to_node_id finds the peer by its name");
    if (own != GM_NO_SUCH_NODE_ID)
        check(gm_host_name_to_node_id(port, (char *)own_name) == own,
              "gm_host_name_to_node_id finds this node by its name");
    check(gm_host_name_to_node_id(port, unknown_name) == GM_NO_SUCH_NODE_ID,
          "gm_host_name_to_node_id gives GM_NO_SUCH_NODE_ID for an unknown name");
    check(gm_host_name_to_node_id(port, NULL) == GM_NO_SUCH_NODE_ID,
          "gm_host_name_to_node_id gives GM_NO_SUCH_NODE_ID for a NULL name");
    found = 12345;
    check(gm_host_name_to_node_id_ex(port, 0, unknown_name, &found) == GM_NO_MATCH &&
              found == 12345,
          "gm_host_name_to_node_id_ex: GM_NO_MATCH for an unknown name, node id untouched");
    {
        /* A name is compared whole: a prefix of the peer's name is another name. */
        char prefix[GM_MAX_HOST_NAME_LEN];
        size_t len = strlen(peer_name);
        memcpy(prefix, peer_name, len - 1);
        prefix[len - 1] = '\0';
        check(gm_host_name_to_node_id_ex(port, 0, prefix, &found) == GM_NO_MATCH,
              "gm_host_name_to_node_id_ex: a prefix of a name is not the name");
    }
    check(gm_host_name_to_node_id_ex(port, 0, NULL, &found) == GM_INVALID_PARAMETER &&
              gm_host_name_to_node_id_ex(port, 0, peer_name, NULL) == GM_INVALID_PARAMETER,
          "gm_host_name_to_node_id_ex refuses NULL pointers");

    /* Node ids to names. */
    peer_text = gm_node_id_to_host_name(port, peer_node);
    check(peer_text != NULL && strcmp(peer_text, peer_name) == 0,
          "gm_node_id_to_host_name names the peer");
    check(gm_node_id_to_host_name(port, peer_node) == peer_text,
          "gm_node_id_to_host_name's string stays the port's");
    check(gm_node_id_to_host_name(port, max_node + 1) == NULL,
          "gm_node_id_to_host_name gives NULL for a node the fabric does not have");
    check(gm_node_id_to_host_name(NULL, peer_node) == NULL,
          "gm_node_id_to_host_name gives NULL for a NULL port");
    check(gm_node_id_to_host_name_ex(port, 1000, other_node, &name_ex) == GM_SUCCESS &&
              strcmp(name_ex, other_name) == 0,
          "gm_node_id_to_host_name_ex names a third node");
    check(gm_node_id_to_host_name_ex(port, 1000, max_node + 1, &name_ex) == GM_NO_MATCH,
          "gm_node_id_to_host_name_ex: GM_NO_MATCH for a node the fabric does not have");
    check(gm_node_id_to_host_name_ex(port, 1000, own, NULL) == GM_INVALID_PARAMETER,
          "gm_node_id_to_host_name_ex refuses a NULL buffer");

    /* Unique ids. */
    check(gm_unique_id(port, mine) == GM_SUCCESS, "gm_unique_id");
    check(gm_get_unique_board_id(port, board) == GM_SUCCESS && memcmp(board, mine, 6) == 0,
          "gm_get_unique_board_id is gm_unique_id");
    check(gm_unique_id_to_node_id(port, mine, &found) == GM_SUCCESS && found == own,
          "gm_unique_id_to_node_id finds this node by its unique id");
    check(gm_node_id_to_unique_id(port, peer_node, theirs) == GM_SUCCESS,
          "gm_node_id_to_unique_id gives the peer's unique id");
    check(memcmp(theirs, mine, 6) != 0 || peer_node == own,
          "the peer's unique id is not this node's");
    check(gm_unique_id_to_node_id(port, theirs, &found) == GM_SUCCESS && found == peer_node,
          "gm_unique_id_to_node_id finds the peer by its unique id");
    found = 12345;
    check(gm_unique_id_to_node_id(port, stranger, &found) == GM_NO_MATCH && found == 12345,
          "gm_unique_id_to_node_id: GM_NO_MATCH for a unique id nobody has");
    check(gm_node_id_to_unique_id(port, max_node + 1, theirs) == GM_NO_MATCH,
          "gm_node_id_to_unique_id: GM_NO_MATCH for a node the fabric does not have");
    check(gm_unique_id(port, NULL) == GM_INVALID_PARAMETER &&
              gm_unique_id_to_node_id(port, NULL, &found) == GM_INVALID_PARAMETER,
          "the unique id calls refuse NULL pointers");
    gm_node_id_to_unique_id(port, peer_node, theirs);
    print_unique("own", mine);
    print_unique("peer", theirs);

    /* The fabric's extent, and global ids (the node ids themselves on this fabric). */
    check(gm_max_node_id_in_use(port, &n) == GM_SUCCESS && n == max_node,
          "gm_max_node_id_in_use is the largest node id of the fabric");
    n = 0;
    check(gm_max_node_id_inuse(port, &n) == GM_SUCCESS && n == max_node,
          "gm_max_node_id_inuse is gm_max_node_id_in_use");
    check(gm_max_node_id_in_use(port, NULL) == GM_INVALID_PARAMETER,
          "gm_max_node_id_in_use refuses NULL");
    check(gm_node_id_to_global_id(port, peer_node, &n) == GM_SUCCESS && n == peer_node &&
              gm_global_id_to_node_id(port, n, &found) == GM_SUCCESS && found == peer_node,
          "global ids and node ids map to each other");
    check(gm_global_id_to_node_id(port, max_node + 1, &found) == GM_NO_MATCH,
          "gm_global_id_to_node_id: GM_NO_MATCH for a node the fabric does not have");

    /* A message to the node found by its name, and one from it. */
    found = GM_NO_SUCH_NODE_ID;
    gm_host_name_to_node_id_ex(port, 0, peer_name, &found);
    memset(text, 0, sizeof text);
    snprintf(text, sizeof text, "from %s", own_name);
    memcpy(out, text, sizeof text);
    status = send_and_wait(port, out, size, (unsigned int)strlen(text) + 1, found);
    check(status == GM_SUCCESS, "a message to the node found by its name is delivered");
    {
        double give_up = now_seconds() + STARTUP_SECONDS;
        while (!arrived_present && now_seconds() < give_up)
            handle_next_event(port);
    }
    snprintf(text, sizeof text, "from %s", peer_name);
    check(arrived_present && strcmp(arrived, text) == 0 && arrived_from == found,
          "the message from the node found by its name came from it");

    /* This side's send has ended (the peer's NIC took it) and the peer's message is here: closing
     * now takes nothing from the peer. */
    gm_dma_free(port, out);
    gm_close(port);
    gm_finalize();
    printf("names: %d check(s) failed\n", failures);
    return failures == 0 ? 0 : 1;
}
