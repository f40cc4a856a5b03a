/*
 * nicbar-fabric: forms a nicbar fabric from an MPI job's own process information and starts one
 * emulated NIC daemon per host, so that no one writes a fabric map by hand.
 *
 * Run it with one process per host, before the MPI job:
 *
 *   mpirun --map-by ppr:1:node --hostfile HOSTS nicbar-fabric [--interface IF] [--udp-port P]
 *   mpirun --hostfile HOSTS ./program                       # coll/nicbar serves its barriers
 *   mpirun --map-by ppr:1:node --hostfile HOSTS nicbar-fabric --stop
 *
 * Process r of the fabric job takes node id r. Each finds its host's IPv4 address (on --interface,
 * else the first up, non-loopback one), the processes exchange them with MPI_Allgather, and each
 * writes the same map (`node r ADDRESS:P`) next to its daemon's socket and starts
 * `nicctl emulate --node r --fabric MAP --fabric-key KEY` there (the job's key: rank 0 draws it,
 * MPI carries it to every host, each keeps it mode 0600), detached, waiting until it listens. The socket is
 * $NICBAR_SOCKET, else $XDG_RUNTIME_DIR/nicbar/control.sock, else /tmp/nicbar-<uid>/control.sock,
 * as for every nicbar process; nicctl is found on PATH unless --nicctl names it. --stop ends the
 * daemon started there (its pid is in daemon.pid beside the socket).
 */
#include <mpi.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int rank;

static void fail(const char *what)
{
    fprintf(stderr, "nicbar-fabric: node %d: %s\n", rank, what);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

static void socket_path(char *path, size_t size)
{
    const char *socket = getenv("NICBAR_SOCKET"), *runtime = getenv("XDG_RUNTIME_DIR");
    if (socket && *socket) snprintf(path, size, "%s", socket);
    else if (runtime && *runtime) snprintf(path, size, "%s/nicbar/control.sock", runtime);
    else snprintf(path, size, "/tmp/nicbar-%u/control.sock", (unsigned) getuid());
}

/* The directory of `path`, in `dir`. */
static void directory_of(const char *path, char *dir, size_t size)
{
    snprintf(dir, size, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, size, ".");
}

static int listening(const char *path)
{
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM, 0), ok;
    snprintf(address.sun_path, sizeof address.sun_path, "%s", path);
    ok = fd >= 0 && 0 == connect(fd, (struct sockaddr *) &address, sizeof address);
    if (fd >= 0) close(fd);
    return ok;
}

static uint32_t host_address(const char *interface)
{
    struct ifaddrs *all, *entry;
    uint32_t found = 0;
    if (getifaddrs(&all) != 0) fail("getifaddrs failed");
    for (entry = all; entry && !found; entry = entry->ifa_next) {
        if (!entry->ifa_addr || entry->ifa_addr->sa_family != AF_INET) continue;
        if (!(entry->ifa_flags & IFF_UP)) continue;
        if (interface ? strcmp(entry->ifa_name, interface) != 0
                      : (entry->ifa_flags & IFF_LOOPBACK) != 0) continue;
        found = ((struct sockaddr_in *) entry->ifa_addr)->sin_addr.s_addr;
    }
    freeifaddrs(all);
    if (!found) fail(interface ? "no IPv4 address on the interface given" : "no IPv4 address");
    return found;
}

int main(int argc, char **argv)
{
    const char *interface = NULL, *nicctl = "nicctl";
    int udp_port = 7400, stop = 0, size;
    char socket[PATH_MAX], dir[PATH_MAX], map[PATH_MAX + 16], pidfile[PATH_MAX + 16];
    char keyfile[PATH_MAX + 16];
    char log[PATH_MAX + 16], node[16];

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--interface") && i + 1 < argc) interface = argv[++i];
        else if (!strcmp(argv[i], "--udp-port") && i + 1 < argc) udp_port = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--nicctl") && i + 1 < argc) nicctl = argv[++i];
        else if (!strcmp(argv[i], "--stop")) stop = 1;
        else fail("usage: nicbar-fabric [--interface IF] [--udp-port P] [--nicctl PATH] [--stop]");
    }
    socket_path(socket, sizeof socket);
    directory_of(socket, dir, sizeof dir);
    snprintf(pidfile, sizeof pidfile, "%s/daemon.pid", dir);

    if (stop) {
        FILE *file = fopen(pidfile, "r");
        int pid = 0;
        if (file && fscanf(file, "%d", &pid) == 1 && pid > 0 && kill(pid, SIGTERM) == 0) {
            printf("nicbar-fabric: node %d: stopped the daemon (pid %d)\n", rank, pid);
            unlink(pidfile);
        }
        if (file) fclose(file);
        MPI_Finalize();
        return 0;
    }

    uint32_t mine = host_address(interface), *all = calloc(size, sizeof *all);
    if (!all) fail("out of memory");
    MPI_Allgather(&mine, 1, MPI_UINT32_T, all, 1, MPI_UINT32_T, MPI_COMM_WORLD);

    for (char *slash = strchr(dir + 1, '/');; slash = strchr(slash + 1, '/')) {
        if (slash) *slash = '\0';
        if (mkdir(dir, 0700) != 0 && errno != EEXIST) fail("cannot create the socket's directory");
        if (!slash) break;
        *slash = '/';
    }
    snprintf(map, sizeof map, "%s/fabric.map", dir);
    FILE *file = fopen(map, "w");
    if (!file) fail("cannot write the fabric map");
    fprintf(file, "# nicbar fabric map, formed by nicbar-fabric from the job's hosts\n");
    for (int i = 0; i < size; i++) {
        char text[INET_ADDRSTRLEN];
        struct in_addr address = {.s_addr = all[i]};
        inet_ntop(AF_INET, &address, text, sizeof text);
        fprintf(file, "node %d %s:%d\n", i, text, udp_port);
    }
    fclose(file);
    /* The job's fabric key: rank 0 draws 32 random bytes, every host gets them over MPI (the
     * job's own channel) and keeps them in a file only its user can read. */
    unsigned char key[32];
    if (rank == 0) {
        FILE *random = fopen("/dev/urandom", "r");
        if (!random || fread(key, 1, sizeof key, random) != sizeof key)
            fail("cannot read /dev/urandom for the fabric key");
        fclose(random);
    }
    MPI_Bcast(key, sizeof key, MPI_UNSIGNED_CHAR, 0, MPI_COMM_WORLD);
    snprintf(keyfile, sizeof keyfile, "%s/fabric.key", dir);
    unlink(keyfile);
    int key_fd = open(keyfile, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (key_fd < 0) fail("cannot write the fabric key");
    char hex[2 * sizeof key + 2];
    for (size_t i = 0; i < sizeof key; i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
    hex[2 * sizeof key] = '\n';
    if (write(key_fd, hex, 2 * sizeof key + 1) != (ssize_t) (2 * sizeof key + 1))
        fail("cannot write the fabric key");
    close(key_fd);
    memset(key, 0, sizeof key);

    if (listening(socket)) fail("a daemon already listens on this host's socket (--stop it)");
    unlink(socket);

    snprintf(node, sizeof node, "%d", rank);
    snprintf(log, sizeof log, "%s/daemon.log", dir);
    pid_t pid = fork();
    if (pid < 0) fail("fork failed");
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        setsid();
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        close(0);
        execlp(nicctl, nicctl, "emulate", "--socket", socket, "--node", node, "--fabric", map,
               "--fabric-key", keyfile, (char *) NULL);
        _exit(127);
    }
    file = fopen(pidfile, "w");
    if (file) {
        fprintf(file, "%d\n", (int) pid);
        fclose(file);
    }
    for (int tries = 0; !listening(socket); tries++) {
        struct timespec pause = {0, 10 * 1000 * 1000};
        if (tries > 1000) fail("the daemon did not listen within 10 s (see daemon.log)");
        nanosleep(&pause, NULL);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        printf("nicbar-fabric: %d nodes, one daemon each; map in %s on every host\n", size, map);
    }
    free(all);
    MPI_Finalize();
    return 0;
}
