/* smallfiles: PROCS processes create and write FILES small files each, spread round-robin
 * over NDIRS existing directories d0..d{NDIRS-1} under DIR (open O_CREAT|O_EXCL, one
 * write, close; no fsync; SIZE 0: no write, empty files). Prints the files per second of the whole run (first start to
 * last finish). Used by scripts/bench-smallfiles and scripts/bench-meta.
 *
 * With FSYNC_LOG, the file numbered 1000k-1 in creation order (file n of process id is
 * number n * PROCS + id) is fsync'ed before its close, and a line
 * "FILES_CREATED FSYNC_SECONDS ELAPSED_SECONDS" appended to FSYNC_LOG for each.
 * With -o stat|readdir|unlink, the same processes stat or unlink the files a create run
 * made, or read the directories (process id those with d % PROCS == id), and it prints
 * operations (directory entries, for readdir) per second.
 *
 * usage: smallfiles DIR PROCS NDIRS FILES SIZE [FSYNC_LOG]
 *        smallfiles -o stat|readdir|unlink DIR PROCS NDIRS FILES SIZE */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

enum op { CREATE, STAT, READDIR, UNLINK };

static double t0;

static int fsync_logged(int fd, long number, int log, const char *path) {
    double t = now();
    if (fsync(fd) < 0) {
        fprintf(stderr, "smallfiles: fsync %s: %s\n", path, strerror(errno));
        return -1;
    }
    char line[128];
    int len = snprintf(line, sizeof line, "%ld %.6f %.6f\n", number + 1, now() - t, now() - t0);
    /* One write per line on an O_APPEND descriptor: lines of processes do not mix. */
    if (write(log, line, len) != len) {
        fprintf(stderr, "smallfiles: fsync log: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

static int create_one(const char *path, const char *buf, size_t size, long number, int log) {
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0) {
        fprintf(stderr, "smallfiles: create %s: %s\n", path, strerror(errno));
        return -1;
    }
    ssize_t w = size ? write(fd, buf, size) : 0;
    if (w != (ssize_t)size) {
        fprintf(stderr, "smallfiles: write %s: %s\n", path,
                w < 0 ? strerror(errno) : "short write");
        return -1;
    }
    if (log >= 0 && number % 1000 == 999 && fsync_logged(fd, number, log, path) < 0) return -1;
    if (close(fd) < 0) {
        fprintf(stderr, "smallfiles: close %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Entries of directory d, or -1. */
static long read_dir(const char *dir, long d) {
    char path[4096];
    snprintf(path, sizeof path, "%s/d%ld", dir, d);
    DIR *h = opendir(path);
    if (!h) {
        fprintf(stderr, "smallfiles: opendir %s: %s\n", path, strerror(errno));
        return -1;
    }
    long n = 0;
    struct dirent *e;
    while ((e = readdir(h)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(h);
    return n;
}

static int child(enum op op, const char *dir, int id, int procs, long ndirs, long files,
                 size_t size, int go, int log) {
    char *buf = malloc(size ? size : 1);
    char path[4096];
    char c;
    struct stat st;
    if (!buf) return 1;
    memset(buf, 'a' + id, size);
    /* Wait until the parent closes the pipe: every process starts together. */
    if (read(go, &c, 1) < 0) return 1;
    if (op == READDIR) {
        for (long d = id; d < ndirs; d += procs)
            if (read_dir(dir, d) < 0) return 1;
        return 0;
    }
    for (long n = 0; n < files; n++) {
        long d = (n * procs + id) % ndirs;
        snprintf(path, sizeof path, "%s/d%ld/p%d-f%ld", dir, d, id, n);
        if (op == CREATE && create_one(path, buf, size, n * procs + id, log) < 0) return 1;
        if (op == STAT && stat(path, &st) < 0) {
            fprintf(stderr, "smallfiles: stat %s: %s\n", path, strerror(errno));
            return 1;
        }
        if (op == UNLINK && unlink(path) < 0) {
            fprintf(stderr, "smallfiles: unlink %s: %s\n", path, strerror(errno));
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    enum op op = CREATE;
    if (argc > 2 && !strcmp(argv[1], "-o")) {
        if (!strcmp(argv[2], "stat")) op = STAT;
        else if (!strcmp(argv[2], "readdir")) op = READDIR;
        else if (!strcmp(argv[2], "unlink")) op = UNLINK;
        else {
            fprintf(stderr, "smallfiles: -o takes stat, readdir or unlink\n");
            return 2;
        }
        argc -= 2;
        argv += 2;
    }
    if (argc != 6 && !(argc == 7 && op == CREATE)) {
        fprintf(stderr, "usage: smallfiles DIR PROCS NDIRS FILES SIZE [FSYNC_LOG]\n"
                        "       smallfiles -o stat|readdir|unlink DIR PROCS NDIRS FILES SIZE\n");
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
    int log = -1;
    if (argc == 7 && (log = open(argv[6], O_WRONLY | O_APPEND | O_CREAT | O_TRUNC, 0644)) < 0) {
        fprintf(stderr, "smallfiles: %s: %s\n", argv[6], strerror(errno));
        return 1;
    }
    int p[2];
    if (pipe(p) < 0) return 1;
    t0 = now();
    for (int i = 0; i < procs; i++) {
        pid_t pid = fork();
        if (pid < 0) return 1;
        if (pid == 0) {
            close(p[1]);
            _exit(child(op, dir, i, procs, ndirs, files, size, p[0], log));
        }
    }
    close(p[0]);
    t0 = now();
    close(p[1]);
    int failed = 0, st;
    while (wait(&st) > 0)
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed = 1;
    double t = now() - t0;
    if (failed) return 1;
    long ops = (long)procs * files;
    if (op == READDIR) {
        /* Count afterwards, untimed: the children only read. */
        ops = 0;
        for (long d = 0; d < ndirs; d++) {
            long n = read_dir(dir, d);
            if (n < 0) return 1;
            ops += n;
        }
    }
    printf("%.0f\n", (double)ops / t);
    return 0;
}
