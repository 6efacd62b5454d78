/* smallfiles: PROCS processes create and write FILES small files each, spread round-robin
 * over NDIRS existing directories d0..d{NDIRS-1} under DIR (open O_CREAT|O_EXCL, one
 * write, close; no fsync; SIZE 0: no write, empty files). Prints the files per second of the whole run (first start to
 * last finish). Used by scripts/bench-smallfiles.
 *
 * usage: smallfiles DIR PROCS NDIRS FILES SIZE */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int child(const char *dir, int id, int procs, long ndirs, long files, size_t size,
                 int go) {
    char *buf = malloc(size ? size : 1);
    char path[4096];
    char c;
    if (!buf) return 1;
    memset(buf, 'a' + id, size);
    /* Wait until the parent closes the pipe: every process starts together. */
    if (read(go, &c, 1) < 0) return 1;
    for (long n = 0; n < files; n++) {
        long d = (n * procs + id) % ndirs;
        snprintf(path, sizeof path, "%s/d%ld/p%d-f%ld", dir, d, id, n);
        int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0644);
        if (fd < 0) {
            fprintf(stderr, "smallfiles: create %s: %s\n", path, strerror(errno));
            return 1;
        }
        ssize_t w = size ? write(fd, buf, size) : 0;
        if (w != (ssize_t)size) {
            fprintf(stderr, "smallfiles: write %s: %s\n", path,
                    w < 0 ? strerror(errno) : "short write");
            return 1;
        }
        if (close(fd) < 0) {
            fprintf(stderr, "smallfiles: close %s: %s\n", path, strerror(errno));
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: smallfiles DIR PROCS NDIRS FILES SIZE\n");
        return 2;
    }
    const char *dir = argv[1];
    int procs = atoi(argv[2]);
    long ndirs = atol(argv[3]), files = atol(argv[4]);
    long size_arg = atol(argv[5]);
    size_t size = (size_t)size_arg;
    if (procs < 1 || ndirs < 1 || files < 1 || size_arg < 0) {
        fprintf(stderr, "smallfiles: PROCS, NDIRS and FILES must be positive, SIZE not negative\n");
        return 2;
    }
    int p[2];
    if (pipe(p) < 0) return 1;
    for (int i = 0; i < procs; i++) {
        pid_t pid = fork();
        if (pid < 0) return 1;
        if (pid == 0) {
            close(p[1]);
            _exit(child(dir, i, procs, ndirs, files, size, p[0]));
        }
    }
    close(p[0]);
    double t0 = now();
    close(p[1]);
    int failed = 0, st;
    while (wait(&st) > 0)
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed = 1;
    double t = now() - t0;
    if (failed) return 1;
    printf("%.0f\n", (double)procs * files / t);
    return 0;
}
