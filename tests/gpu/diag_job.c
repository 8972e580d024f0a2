/*
 * Jobs for the GPU diagnoses (tests/e2e/diagnosis/misc.rs), run against
 * the stand-in libcuda (tests/gpu/standin_cuda.c), each the shape of a
 * real failure:
 *
 *   diag_job pinned LIBCUDA   pins host memory (cuMemHostAlloc, 16 MiB a
 *                             step, and one 32 MiB cuMemHostRegister) until
 *                             the memory cgroup's OOM killer ends it;
 *   diag_job workers LIBCUDA  forks 2 workers that each initialise CUDA and
 *                             create a context (the stand-in's costs 80 MiB
 *                             of host memory, as a real one costs hundreds),
 *                             then grows until a kill; the root never
 *                             touches CUDA;
 *   diag_job oom LIBCUDA      allocates 192 MiB of device memory, then asks
 *                             for 1 TiB, which fails with
 *                             CUDA_ERROR_OUT_OF_MEMORY, and exits 1 as a
 *                             framework does after its out-of-memory error.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

#define MIB (1ULL << 20)

static void *lib;

static void *sym(const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "diag_job: %s missing: %s\n", name, dlerror());
        exit(2);
    }
    return p;
}

static void check(const char *what, CUresult got, CUresult want) {
    if (got != want) {
        fprintf(stderr, "diag_job: %s returned %d, expected %d\n", what, got, want);
        exit(3);
    }
}

static void *volatile kept;

/* Touched host memory: gives the memory probe a record before a CUDA call,
 * which the context's host cost is measured from. */
static void touch(size_t bytes) {
    char *p = malloc(bytes);
    memset(p, 2, bytes);
    kept = p;
}

static void pinned(void) {
    CUresult (*cuInit)(unsigned) = sym("cuInit");
    CUresult (*cuMemHostAlloc)(void **, size_t, unsigned) = sym("cuMemHostAlloc");
    CUresult (*cuMemHostRegister_v2)(void *, size_t, unsigned) = sym("cuMemHostRegister_v2");
    check("cuInit", cuInit(0), 0);
    char *buf = malloc(32 * MIB);
    memset(buf, 3, 32 * MIB);
    check("cuMemHostRegister_v2", cuMemHostRegister_v2(buf, 32 * MIB, 0), 0);
    for (;;) {
        void *h;
        check("cuMemHostAlloc", cuMemHostAlloc(&h, 16 * MIB, 0), 0);
        usleep(100 * 1000);
    }
}

static void worker(int ready) {
    CUresult (*cuInit)(unsigned) = sym("cuInit");
    CUresult (*cuCtxCreate_v2)(CUcontext *, unsigned, int) = sym("cuCtxCreate_v2");
    CUcontext ctx;
    /* A worker dies with its parent, as a DataLoader's do. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    touch(6 * MIB);
    usleep(200 * 1000);
    check("cuInit", cuInit(0), 0);
    check("cuCtxCreate_v2", cuCtxCreate_v2(&ctx, 0, 0), 0);
    if (write(ready, "r", 1) != 1)
        _exit(4);
    for (;;)
        pause();
}

static void workers(void) {
    enum { N = 2 };
    int fds[2];
    pid_t kids[N];
    if (pipe(fds))
        exit(5);
    for (int i = 0; i < N; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            close(fds[0]);
            worker(fds[1]);
        }
    }
    close(fds[1]);
    char c;
    for (int i = 0; i < N; i++)
        if (read(fds[0], &c, 1) != 1)
            exit(6);
    /* Let the memory records of the contexts land, then grow until the
     * kernel kills someone; once a worker is gone the job is over. */
    sleep(1);
    for (;;) {
        touch(8 * MIB);
        usleep(50 * 1000);
        if (waitpid(-1, NULL, WNOHANG) > 0) {
            for (int i = 0; i < N; i++)
                kill(kids[i], SIGKILL);
            while (wait(NULL) > 0)
                ;
            fprintf(stderr, "diag_job: a DataLoader worker was killed\n");
            exit(1);
        }
    }
}

static void oom(void) {
    CUresult (*cuInit)(unsigned) = sym("cuInit");
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int) = sym("cuDevicePrimaryCtxRetain");
    CUresult (*cuMemAlloc_v2)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
    CUcontext ctx;
    CUdeviceptr d;
    check("cuInit", cuInit(0), 0);
    check("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&ctx, 0), 0);
    for (int i = 0; i < 3; i++)
        check("cuMemAlloc_v2", cuMemAlloc_v2(&d, 64 * MIB), 0);
    /* Time for NVML to sample the device before the failure. */
    sleep(2);
    CUresult r = cuMemAlloc_v2(&d, 1ULL << 40);
    check("cuMemAlloc_v2 1 TiB", r, 2);
    fprintf(stderr, "diag_job: CUDA out of memory. Tried to allocate 1 TiB\n");
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: diag_job pinned|workers|oom LIBCUDA_PATH\n");
        return 1;
    }
    touch(8 * MIB);
    lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "diag_job: %s\n", dlerror());
        return 2;
    }
    if (!strcmp(argv[1], "pinned"))
        pinned();
    else if (!strcmp(argv[1], "workers"))
        workers();
    else if (!strcmp(argv[1], "oom"))
        oom();
    fprintf(stderr, "diag_job: unknown mode %s\n", argv[1]);
    return 1;
}
