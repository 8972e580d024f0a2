/*
 * A job that loads the stand-in libcuda late, as a runtime does at first
 * use: dlopen from a path outside the linker's cache, then at once (within
 * a millisecond) one call of each kind of allocation: device
 * (cuMemAlloc_v2, 16 MiB), pinned (cuMemHostAlloc, 1 MiB), managed
 * (cuMemAllocManaged, 4 MiB) and VMM (cuMemCreate on the device, 32 MiB).
 * It prints how long dlopen took (a hold at the mapping is inside it) and
 * how long after dlopen's return its first call returned.
 *
 * usage: late_job LIBCUDA_PATH [fork | stop | window MS | until FILE]
 *   fork:      the calls are made by a child forked before the dlopen;
 *   stop:      as fork, and once the child is seen stopped (held at its
 *              mapping), the parent stops it too (SIGSTOP), waits 1.5 s,
 *              prints whether it stayed stopped, then continues it;
 *   window MS: after the four calls, sleep MS milliseconds, then one more
 *              cuMemAlloc_v2 of 2 MiB (what a recorder that attached late
 *              sees).
 *   until FILE: after the four calls, wait until FILE exists (30 s at
 *              most), then one more cuMemAlloc_v2 of 2 MiB (a recorder
 *              attached after the library was mapped and its pages touched).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;

#define MIB (1ULL << 20)

static long long now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000LL + t.tv_nsec / 1000;
}

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "late_job: %s missing\n", name);
        exit(2);
    }
    return p;
}

static void check(const char *what, CUresult got) {
    if (got != 0) {
        fprintf(stderr, "late_job: %s returned %d\n", what, got);
        exit(3);
    }
}

/* `until FILE`'s file; NULL otherwise. */
static const char *until_path;

static int run(const char *path, long window_ms) {
    long long opening = now_us();
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    long long loaded = now_us();
    if (!lib) {
        fprintf(stderr, "late_job: %s\n", dlerror());
        return 2;
    }
    CUresult (*alloc)(CUdeviceptr *, size_t) = sym(lib, "cuMemAlloc_v2");
    CUresult (*host)(void **, size_t, unsigned) = sym(lib, "cuMemHostAlloc");
    CUresult (*managed)(CUdeviceptr *, size_t, unsigned) = sym(lib, "cuMemAllocManaged");
    CUresult (*create)(unsigned long long *, size_t, const CUmemAllocationProp *,
                       unsigned long long) = sym(lib, "cuMemCreate");
    CUdeviceptr d, m;
    void *h;
    unsigned long long handle;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;
    prop.location.type = 1; /* CU_MEM_LOCATION_TYPE_DEVICE */
    check("cuMemAlloc_v2", alloc(&d, 16 * MIB));
    long long first = now_us();
    check("cuMemHostAlloc", host(&h, 1 * MIB, 0));
    check("cuMemAllocManaged", managed(&m, 4 * MIB, 1));
    check("cuMemCreate", create(&handle, 32 * MIB, &prop, 0));
    printf("late_job: pid %d: dlopen took %lld us\n", getpid(), loaded - opening);
    printf("late_job: pid %d: first call returned %lld us after dlopen\n", getpid(),
           first - loaded);
    fflush(stdout);
    if (window_ms > 0) {
        usleep((useconds_t)window_ms * 1000);
        check("cuMemAlloc_v2", alloc(&d, 2 * MIB));
    }
    if (until_path) {
        for (int i = 0; i < 3000 && access(until_path, F_OK) != 0; i++)
            usleep(10000);
        check("cuMemAlloc_v2", alloc(&d, 2 * MIB));
    }
    return 0;
}

/* The state letter of /proc/PID/stat: 'T' when stopped. */
static char state(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : '?';
}

static int stop_the_held_child(const char *lib) {
    pid_t c = fork();
    if (c == 0)
        _exit(run(lib, 0));
    /* Held at its mapping: stopped by the recorder, for the hold. */
    for (int i = 0; i < 5000 && state(c) != 'T'; i++)
        usleep(1000);
    if (state(c) != 'T') {
        fprintf(stderr, "late_job: the child was never seen stopped\n");
        kill(c, SIGKILL);
        return 5;
    }
    kill(c, SIGSTOP);
    usleep(1500 * 1000);
    printf("late_job: child %s after the hold\n",
           state(c) == 'T' ? "stayed stopped" : "was continued");
    fflush(stdout);
    kill(c, SIGCONT);
    int st;
    if (waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "late_job: the worker failed\n");
        return 4;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: late_job LIBCUDA_PATH [fork | window MS]\n");
        return 1;
    }
    if (argc >= 3 && strcmp(argv[2], "stop") == 0)
        return stop_the_held_child(argv[1]);
    if (argc >= 3 && strcmp(argv[2], "fork") == 0) {
        pid_t c = fork();
        if (c == 0)
            _exit(run(argv[1], 0));
        int st;
        if (waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "late_job: the worker failed\n");
            return 4;
        }
        return 0;
    }
    if (argc >= 4 && strcmp(argv[2], "until") == 0)
        until_path = argv[3];
    long window = argc >= 4 && strcmp(argv[2], "window") == 0 ? atol(argv[3]) : 0;
    return run(argv[1], window);
}
