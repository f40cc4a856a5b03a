/*
 * Raw UDP ping-pong between two processes on loopback, as a reference for the NIC's one-way
 * latency across daemons: 64-byte datagrams, each side either sleeping in recv (`block`) or
 * polling a non-blocking socket (`busy`, as a busy-polling NIC driver does).
 *
 * Usage: udp_pingpong block|busy ROUND_TRIPS [BYTES]. Prints one line:
 *   result mode=<mode> bytes=<n> one_way_us=<half the mean round trip>
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* A loopback socket bound to a port the kernel picks; its address in `address`. */
static int bound(struct sockaddr_in *address)
{
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    socklen_t length = sizeof *address;
    memset(address, 0, sizeof *address);
    address->sin_family = AF_INET;
    address->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *) address, sizeof *address) != 0 ||
        getsockname(fd, (struct sockaddr *) address, &length) != 0) {
        perror("socket");
        exit(1);
    }
    return fd;
}

/* Takes one datagram, sleeping or polling as `busy` says. */
static void take(int fd, char *buffer, size_t bytes, int busy)
{
    for (;;) {
        ssize_t got = recv(fd, buffer, bytes, busy ? MSG_DONTWAIT : 0);
        if (got >= 0) return;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            perror("recv");
            exit(1);
        }
    }
}

int main(int argc, char **argv)
{
    if (argc < 3 || (strcmp(argv[1], "busy") != 0 && strcmp(argv[1], "block") != 0)) {
        fprintf(stderr, "usage: udp_pingpong block|busy ROUND_TRIPS [BYTES]\n");
        return 2;
    }
    int busy = strcmp(argv[1], "busy") == 0, round_trips = atoi(argv[2]);
    size_t bytes = argc > 3 ? (size_t) atoi(argv[3]) : 64;
    if (round_trips < 1 || bytes < 1 || bytes > 65507) {
        fprintf(stderr, "udp_pingpong: ROUND_TRIPS at least 1, BYTES 1 to 65507\n");
        return 2;
    }
    struct sockaddr_in a, b;
    int fa = bound(&a), fb = bound(&b);
    char *buffer = calloc(1, bytes);
    int warmup = round_trips / 10 + 10;
    pid_t child = fork();
    if (child == 0) {
        connect(fb, (struct sockaddr *) &a, sizeof a);
        for (int i = 0; i < warmup + round_trips; i++) {
            take(fb, buffer, bytes, busy);
            send(fb, buffer, bytes, 0);
        }
        _exit(0);
    }
    connect(fa, (struct sockaddr *) &b, sizeof b);
    double start = 0;
    for (int i = 0; i < warmup + round_trips; i++) {
        if (i == warmup) start = now();
        send(fa, buffer, bytes, 0);
        take(fa, buffer, bytes, busy);
    }
    double one_way = (now() - start) / round_trips / 2 * 1e6;
    int status;
    waitpid(child, &status, 0);
    printf("result mode=%s bytes=%zu one_way_us=%.2f\n", argv[1], bytes, one_way);
    return !WIFEXITED(status) || WEXITSTATUS(status) != 0;
}
