/*
 * A job that maps a file named like the driver the way a hostile one may,
 * for the probing tests (tests/e2e/gpu/probing.rs):
 *
 *   map_job opath PATH MARKER MS  opens PATH with O_PATH, which needs no
 *                                 read permission, and mmaps that
 *                                 descriptor: mmap fails with EBADF;
 *   map_job fd N MARKER MS        mmaps descriptor N, which it was handed;
 *   map_job read PATH MARKER MS   opens PATH for reading and mmaps it.
 *
 * It prints what mmap returned, reads the mapping's first byte (as a
 * loader reads the headers it mapped: the fault is what the late probe
 * sees), creates MARKER, and sleeps MS milliseconds (the probes, if any
 * went on, stay on meanwhile).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: map_job opath|fd|read WHAT MARKER MS\n");
        return 1;
    }
    int fd;
    if (strcmp(argv[1], "opath") == 0)
        fd = open(argv[2], O_PATH | O_CLOEXEC);
    else if (strcmp(argv[1], "read") == 0)
        fd = open(argv[2], O_RDONLY | O_CLOEXEC);
    else
        fd = atoi(argv[2]);
    if (fd < 0) {
        fprintf(stderr, "map_job: open %s: %s\n", argv[2], strerror(errno));
        return 2;
    }
    void *p = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0);
    printf("map_job: mmap of fd %d: %s\n", fd, p == MAP_FAILED ? strerror(errno) : "mapped");
    fflush(stdout);
    if (p != MAP_FAILED)
        (void)*(volatile const char *)p;
    int m = open(argv[3], O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (m < 0) {
        fprintf(stderr, "map_job: %s: %s\n", argv[3], strerror(errno));
        return 3;
    }
    close(m);
    usleep((useconds_t)atol(argv[4]) * 1000);
    return 0;
}
