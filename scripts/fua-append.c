/* fua-append: the device's share of the fsync tail, without stripefs.
 *
 * One thread appends 8 KiB with O_DIRECT and RWF_DSYNC (a journal append: FUA, or a write
 * and a cache flush where the device has none) every 2 ms, cycling over the first 64 MiB
 * of JFILE, and prints the appends' latency: count, p50, p99, max and how many took 50 ms
 * or more. With WINDOW > 0, QD threads at once write a checkpoint-shaped load into WFILE
 * beside it: windows of WINDOW pages of 4 KiB at random 4 KiB offsets in
 * [64 MiB, 1 GiB), the window's pages split over the QD threads, then an fdatasync of
 * WFILE, then the next window (what `Store::write_generation` does, decision 128).
 *
 * JFILE and WFILE may be the same file (the journal and the metadata pages on one target).
 * Both must exist and be at least 1 GiB; a sparse WFILE makes every page write allocate on
 * the host file system.
 *
 * usage: fua-append JFILE WFILE SECONDS WINDOW QD
 * build: cc -O2 -pthread -o fua-append scripts/fua-append.c */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define JOURNAL_BYTES (64L << 20)
#define AREA_PAGES ((1L << 30) / 4096)
#define FIRST_PAGE (JOURNAL_BYTES / 4096)
#define APPEND 8192
#define MAX_QD 256

static int jfd, wfd, window, qd;
static atomic_int stop;
static int quit;
static long windows;
static pthread_barrier_t bar;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *writer(void *arg) {
    long id = (long)arg;
    char *b;
    if (posix_memalign((void **)&b, 4096, 4096)) abort();
    memset(b, 7, 4096);
    unsigned long long seed = id * 7919 + 1;
    for (;;) {
        /* One thread decides for all, before the barrier: a thread that read `stop` on
         * its own could leave the others waiting at the next barrier forever. */
        if (id == 0) quit = stop;
        pthread_barrier_wait(&bar);
        if (quit) break;
        for (int i = id; i < window; i += qd) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            off_t page = FIRST_PAGE + (off_t)((seed >> 33) % (AREA_PAGES - FIRST_PAGE));
            if (pwrite(wfd, b, 4096, page * 4096) != 4096) { perror("pwrite"); exit(1); }
        }
        pthread_barrier_wait(&bar);
        if (id == 0) {
            if (fdatasync(wfd)) { perror("fdatasync"); exit(1); }
            windows++;
        }
    }
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: fua-append JFILE WFILE SECONDS WINDOW QD\n");
        return 2;
    }
    jfd = open(argv[1], O_RDWR | O_DIRECT);
    wfd = open(argv[2], O_RDWR | O_DIRECT);
    if (jfd < 0 || wfd < 0) { perror("open"); return 1; }
    double secs = atof(argv[3]);
    window = atoi(argv[4]);
    qd = atoi(argv[5]);
    if (qd < 1 || qd > MAX_QD) { fprintf(stderr, "QD must be 1..%d\n", MAX_QD); return 2; }
    pthread_t t[MAX_QD];
    if (window > 0) {
        pthread_barrier_init(&bar, NULL, qd);
        for (long i = 0; i < qd; i++) pthread_create(&t[i], NULL, writer, (void *)i);
    }
    char *b;
    if (posix_memalign((void **)&b, 4096, APPEND)) abort();
    memset(b, 1, APPEND);
    struct iovec iov = {b, APPEND};
    size_t cap = 1 << 20, n = 0;
    double *lat = malloc(cap * sizeof *lat);
    off_t off = 0;
    for (double end = now() + secs; now() < end && n < cap;) {
        double s = now();
        if (pwritev2(jfd, &iov, 1, off, RWF_DSYNC) != APPEND) { perror("pwritev2"); return 1; }
        lat[n++] = (now() - s) * 1e3;
        off = (off + APPEND) % JOURNAL_BYTES;
        usleep(2000);
    }
    stop = 1;
    if (window > 0)
        for (int i = 0; i < qd; i++) pthread_join(t[i], NULL);
    if (n == 0) {
        fprintf(stderr, "no append completed in %s seconds\n", argv[3]);
        return 1;
    }
    qsort(lat, n, sizeof *lat, cmp);
    size_t over = 0;
    for (size_t i = 0; i < n; i++) over += lat[i] >= 50;
    printf("appends %zu p50 %.2f p99 %.2f max %.2f ms, %zu of 50 ms or more; windows %ld\n", n,
           lat[n / 2], lat[(size_t)(n * 0.99)], lat[n - 1], over, windows);
    return 0;
}
