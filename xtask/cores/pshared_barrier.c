/*
 * The plainest host barrier there is, as a reference for the NIC's: P processes on one
 * process-shared pthread barrier (a futex), mean µs per barrier over back-to-back barriers, the
 * largest over the processes.
 *
 * Usage: pshared_barrier PROCESSES ITERATIONS. Prints one line:
 *   result processes=<P> barrier_us=<mean>
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct shared {
    pthread_barrier_t barrier;
    double us[256];
};

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int processes = argc > 1 ? atoi(argv[1]) : 2, iterations = argc > 2 ? atoi(argv[2]) : 10000;
    if (processes < 1 || processes > 256 || iterations < 1) {
        fprintf(stderr, "usage: pshared_barrier PROCESSES(1-256) ITERATIONS\n");
        return 2;
    }
    struct shared *shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE,
                                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    pthread_barrierattr_t attributes;
    pthread_barrierattr_init(&attributes);
    pthread_barrierattr_setpshared(&attributes, PTHREAD_PROCESS_SHARED);
    if (pthread_barrier_init(&shared->barrier, &attributes, processes) != 0) {
        fprintf(stderr, "pthread_barrier_init failed\n");
        return 1;
    }
    for (int p = 0; p < processes; p++) {
        pid_t child = fork();
        if (child < 0) {
            perror("fork");
            return 1;
        }
        if (child == 0) {
            for (int i = 0; i < iterations / 10 + 10; i++) pthread_barrier_wait(&shared->barrier);
            double start = now();
            for (int i = 0; i < iterations; i++) pthread_barrier_wait(&shared->barrier);
            shared->us[p] = (now() - start) / iterations * 1e6;
            _exit(0);
        }
    }
    int failed = 0, status;
    while (wait(&status) > 0) failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    double largest = 0;
    for (int p = 0; p < processes; p++) largest = shared->us[p] > largest ? shared->us[p] : largest;
    printf("result processes=%d barrier_us=%.2f\n", processes, largest);
    return failed;
}
