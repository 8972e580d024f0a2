/*
 * A CUDA job for trainbpf's GPU tests, run against the stand-in libcuda.
 * It loads the library with dlopen and calls it through dlsym pointers, as
 * the CUDA runtime and frameworks do, from four threads, with failing calls,
 * then forks a worker that creates a context of its own, and exits holding
 * memory. tests/e2e/gpu/ledger.rs asserts the ledger this must produce; the
 * figures are spelled out there.
 *
 * usage: cuda_job LIBCUDA_PATH
 * With CUDA_JOB_WAIT_MS set, it waits that long after dlopen before the
 * first call: time for a recorder to find the library in its maps.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;

#define MIB (1ULL << 20)

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int);
static CUresult (*cuCtxCreate_v2)(CUcontext *, unsigned, int);
static CUresult (*cuMemAlloc_v2)(CUdeviceptr *, size_t);
static CUresult (*cuMemFree_v2)(CUdeviceptr);
static CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, void *);
static CUresult (*cuMemAllocAsync_ptsz)(CUdeviceptr *, size_t, void *);
static CUresult (*cuMemFreeAsync)(CUdeviceptr, void *);
static CUresult (*cuMemFreeAsync_ptsz)(CUdeviceptr, void *);
static CUresult (*cuMemAllocFromPoolAsync)(CUdeviceptr *, size_t, void *, void *);
static CUresult (*cuMemAllocFromPoolAsync_ptsz)(CUdeviceptr *, size_t, void *, void *);
static CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned);
static CUresult (*cuMemAllocHost_v2)(void **, size_t);
static CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
static CUresult (*cuMemFreeHost)(void *);
static CUresult (*cuMemHostRegister_v2)(void *, size_t, unsigned);
static CUresult (*cuMemHostUnregister)(void *);
static CUresult (*cuMemCreate)(unsigned long long *, size_t, const CUmemAllocationProp *,
                               unsigned long long);
static CUresult (*cuMemRelease)(unsigned long long);
static CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, unsigned long long, unsigned long long);
static CUresult (*cuMemUnmap)(CUdeviceptr, size_t);

static void *lib;

static void *sym(const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "cuda_job: %s missing: %s\n", name, dlerror());
        exit(2);
    }
    return p;
}

static void check(const char *what, CUresult got, CUresult want) {
    if (got != want) {
        fprintf(stderr, "cuda_job: %s returned %d, expected %d\n", what, got, want);
        exit(3);
    }
}

/* What an interpreter holds before it touches CUDA: gives the host memory
 * probe a sample before cuInit. */
static void *volatile kept; /* so the compiler keeps the memory */

static void warm_up(void) {
    char *p = malloc(8 * MIB);
    memset(p, 2, 8 * MIB);
    kept = p;
}

static pthread_barrier_t all_allocated;

static void *worker_thread(void *arg) {
    long i = (long)arg;
    CUdeviceptr a, b, c, d, m;
    void *pool = (void *)0x5;
    check("cuMemAlloc_v2", cuMemAlloc_v2(&a, (size_t)(i + 1) * 16 * MIB), 0);
    check("cuMemAlloc_v2", cuMemAlloc_v2(&b, 8 * MIB), 0);
    check("cuMemAllocAsync", (i % 2 ? cuMemAllocAsync : cuMemAllocAsync_ptsz)(&c, 4 * MIB, NULL), 0);
    check("cuMemAllocFromPoolAsync",
          (i % 2 ? cuMemAllocFromPoolAsync : cuMemAllocFromPoolAsync_ptsz)(&d, 2 * MIB, pool, NULL),
          0);
    check("cuMemAllocManaged", cuMemAllocManaged(&m, 1 * MIB, 1), 0);
    /* Every thread's allocations are in before any free: the peak is their
     * sum, whatever the scheduling. */
    pthread_barrier_wait(&all_allocated);
    check("cuMemFree_v2", cuMemFree_v2(b), 0);
    check("cuMemFreeAsync", (i % 2 ? cuMemFreeAsync : cuMemFreeAsync_ptsz)(c, NULL), 0);
    check("cuMemFreeAsync", cuMemFreeAsync(d, NULL), 0);
    return NULL;
}

/* A DataLoader-like worker that initialises CUDA on its own. */
static void worker_process(void) {
    warm_up();
    CUcontext ctx;
    void *h;
    CUdeviceptr d, big;
    check("cuInit", cuInit(0), 0);
    check("cuCtxCreate_v2", cuCtxCreate_v2(&ctx, 0, 0), 0);
    check("cuMemAllocHost_v2", cuMemAllocHost_v2(&h, 8 * MIB), 0);
    check("cuMemAlloc_v2", cuMemAlloc_v2(&d, 32 * MIB), 0);
    check("cuMemAllocAsync", cuMemAllocAsync(&big, 2ULL << 40, NULL), 2);
    sleep(2);
    _exit(0); /* holding 32 MiB of device and 8 MiB of pinned memory */
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: cuda_job LIBCUDA_PATH\n");
        return 1;
    }
    warm_up();
    lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "cuda_job: %s\n", dlerror());
        return 2;
    }
    cuInit = sym("cuInit");
    cuDevicePrimaryCtxRetain = sym("cuDevicePrimaryCtxRetain");
    cuCtxCreate_v2 = sym("cuCtxCreate_v2");
    cuMemAlloc_v2 = sym("cuMemAlloc_v2");
    cuMemFree_v2 = sym("cuMemFree_v2");
    cuMemAllocAsync = sym("cuMemAllocAsync");
    cuMemAllocAsync_ptsz = sym("cuMemAllocAsync_ptsz");
    cuMemFreeAsync = sym("cuMemFreeAsync");
    cuMemFreeAsync_ptsz = sym("cuMemFreeAsync_ptsz");
    cuMemAllocFromPoolAsync = sym("cuMemAllocFromPoolAsync");
    cuMemAllocFromPoolAsync_ptsz = sym("cuMemAllocFromPoolAsync_ptsz");
    cuMemAllocManaged = sym("cuMemAllocManaged");
    cuMemAllocHost_v2 = sym("cuMemAllocHost_v2");
    cuMemHostAlloc = sym("cuMemHostAlloc");
    cuMemFreeHost = sym("cuMemFreeHost");
    cuMemHostRegister_v2 = sym("cuMemHostRegister_v2");
    cuMemHostUnregister = sym("cuMemHostUnregister");
    cuMemCreate = sym("cuMemCreate");
    cuMemRelease = sym("cuMemRelease");
    cuMemMap = sym("cuMemMap");
    cuMemUnmap = sym("cuMemUnmap");
    const char *wait = getenv("CUDA_JOB_WAIT_MS");
    if (wait)
        usleep((useconds_t)atoi(wait) * 1000);

    CUcontext ctx, again;
    check("cuInit", cuInit(0), 0);
    check("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&ctx, 0), 0);
    /* Retaining the primary context again creates nothing. */
    check("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&again, 0), 0);

    pthread_t t[4];
    pthread_barrier_init(&all_allocated, NULL, 4);
    for (long i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, worker_thread, (void *)i);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);

    CUdeviceptr huge;
    check("cuMemAlloc_v2 1 TiB", cuMemAlloc_v2(&huge, 1ULL << 40), 2);
    check("cuMemFree_v2 of nothing", cuMemFree_v2(0xdeadbeef), 1);

    void *h1, *h2;
    char *buf = malloc(8 * MIB);
    memset(buf, 3, 8 * MIB);
    kept = buf;
    check("cuMemAllocHost_v2", cuMemAllocHost_v2(&h1, 32 * MIB), 0);
    check("cuMemHostAlloc", cuMemHostAlloc(&h2, 16 * MIB, 0), 0);
    check("cuMemHostRegister_v2", cuMemHostRegister_v2(buf, 8 * MIB, 0), 0);
    check("cuMemFreeHost", cuMemFreeHost(h2), 0);
    check("cuMemHostUnregister", cuMemHostUnregister(buf), 0);

    /* PyTorch's expandable segments: create, map, release (still mapped),
     * unmap; then a host-located allocation kept to the end. */
    CUmemAllocationProp dev = {.type = 1, .location = {.type = 1, .id = 0}};
    CUmemAllocationProp host = {.type = 1, .location = {.type = 2, .id = 0}};
    unsigned long long hd, hh;
    CUdeviceptr va = 0x7e0000000000ULL;
    check("cuMemCreate", cuMemCreate(&hd, 64 * MIB, &dev, 0), 0);
    check("cuMemMap", cuMemMap(va, 64 * MIB, 0, hd, 0), 0);
    check("cuMemRelease", cuMemRelease(hd), 0);
    check("cuMemUnmap", cuMemUnmap(va, 64 * MIB), 0);
    check("cuMemCreate host", cuMemCreate(&hh, 4 * MIB, &host, 0), 0);

    pid_t w = fork();
    if (w == 0)
        worker_process();
    /* Hold still while NVML samples, then exit holding memory. */
    sleep(3);
    waitpid(w, NULL, 0);
    return 0;
}
