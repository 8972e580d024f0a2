/*
 * A stand-in libcuda.so.1 for trainbpf's tests: no GPU, no driver.
 *
 * It exports the CUDA driver API calls trainbpf probes, with the real
 * signatures (cuda.h), and behaves enough like the driver for the probes to
 * see real traffic:
 *   - device and managed pointers, pool allocations and VMM handles are fake
 *     but unique addresses, freed by size through a small table;
 *   - pinned host memory (cuMemAllocHost, cuMemHostAlloc) is real memory,
 *     mapped and touched, so it shows on the host timeline as it would;
 *   - cuInit and each new context touch host memory (a real context costs
 *     hundreds of MiB of host memory; here 16 and 64 MiB);
 *   - a request of 1 TiB or more fails with CUDA_ERROR_OUT_OF_MEMORY, a free
 *     of an unknown pointer with CUDA_ERROR_INVALID_VALUE.
 * When STANDIN_NVIDIACTL names a file, every call that would reach the
 * device (allocations, frees, contexts) makes one ioctl on it, as the real
 * driver calls its kernel module through /dev/nvidiactl: what trainbpf counts
 * in a window where a late-mapped library could not be held.
 * When STANDIN_GPU_DIR is set, each process writes there what "the device"
 * holds for it (its device memory plus 300 MiB per context, the overhead a
 * real GPU shows in NVML and not in cuMemAlloc), for the stand-in NVML.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct { int type; unsigned int param; } CUexecAffinityParam;
typedef struct CUctxCreateParams_st CUctxCreateParams;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define TOO_BIG (1ULL << 40)
#define CONTEXT_DEVICE_BYTES (300ULL << 20)

enum { DEVICE = 1, MANAGED = 2, HOST = 3, VMM_DEVICE = 4, VMM_HOST = 5 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long next_va = 0x7f0000000000ULL;
static unsigned long long next_handle = 0x100;
static unsigned long long device_used; /* as the stand-in NVML sees it */
static int contexts;
static pid_t init_pid;
static CUcontext primary;

#define SLOTS 8192
static struct { unsigned long long ptr, size; int kind; } table[SLOTS];

static void put(unsigned long long ptr, unsigned long long size, int kind) {
    for (unsigned i = 0; i < SLOTS; i++) {
        unsigned j = (unsigned)((ptr >> 12) + i) % SLOTS;
        if (table[j].ptr == 0) {
            table[j].ptr = ptr;
            table[j].size = size;
            table[j].kind = kind;
            return;
        }
    }
}

static int take(unsigned long long ptr, int kind, unsigned long long *size) {
    for (unsigned i = 0; i < SLOTS; i++) {
        unsigned j = (unsigned)((ptr >> 12) + i) % SLOTS;
        if (table[j].ptr == ptr && table[j].kind == kind) {
            *size = table[j].size;
            table[j].ptr = 0;
            return 1;
        }
        if (table[j].ptr == 0 && i > 64)
            return 0;
    }
    return 0;
}

/* Called with the lock held. */
static void publish(void) {
    const char *dir = getenv("STANDIN_GPU_DIR");
    if (!dir)
        return;
    char path[512], tmp[512];
    snprintf(path, sizeof path, "%s/%d", dir, getpid());
    snprintf(tmp, sizeof tmp, "%s/.%d", dir, getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    fprintf(f, "%llu\n", device_used + (unsigned long long)contexts * CONTEXT_DEVICE_BYTES);
    fclose(f);
    rename(tmp, path);
}

/* One call into "the driver's kernel module": an ioctl on STANDIN_NVIDIACTL
 * (a plain file named like the device node; the ioctl fails with ENOTTY,
 * which does not matter: the call is what is counted). */
static int nvctl = -2;
static void driver_call(void) {
    if (nvctl == -2) {
        const char *path = getenv("STANDIN_NVIDIACTL");
        nvctl = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    }
    if (nvctl >= 0) {
        int arg = 0;
        (void)ioctl(nvctl, 0xc020462aUL, &arg);
    }
}

static unsigned long long fake(unsigned long long size) {
    unsigned long long p = next_va;
    next_va += (size + (2ULL << 20) - 1) & ~((2ULL << 20) - 1);
    next_va += 2ULL << 20;
    return p;
}

/* Kept here so that the compiler cannot drop the allocation: a context's
 * host memory lives on. */
static void *volatile kept;

static void touch(size_t bytes) {
    char *p = malloc(bytes);
    if (p)
        memset(p, 1, bytes);
    kept = p;
}

static CUresult alloc(unsigned long long *out, size_t size, int kind) {
    driver_call();
    if (!out || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (size >= TOO_BIG)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    unsigned long long p = fake(size);
    put(p, size, kind);
    if (kind == DEVICE) {
        device_used += size;
        publish();
    }
    pthread_mutex_unlock(&lock);
    *out = p;
    return CUDA_SUCCESS;
}

static CUresult release(unsigned long long p, int kind) {
    unsigned long long size;
    driver_call();
    pthread_mutex_lock(&lock);
    int ok = take(p, kind, &size);
    if (ok && kind == DEVICE) {
        device_used -= size;
        publish();
    }
    pthread_mutex_unlock(&lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult new_context(CUcontext *pctx) {
    driver_call();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    touch(64 << 20);
    pthread_mutex_lock(&lock);
    contexts++;
    *pctx = (CUcontext)(uintptr_t)(0xc0000000ULL + (unsigned long long)contexts * 0x1000);
    publish();
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

/* A forked child is a new process to the device: it starts with nothing
 * (the real driver does not carry a context across fork either). */
static void forked(void) {
    device_used = 0;
    contexts = 0;
    primary = NULL;
    memset(table, 0, sizeof table);
}

__attribute__((constructor)) static void setup(void) { pthread_atfork(NULL, NULL, forked); }

CUresult cuInit(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    int first = init_pid != getpid();
    init_pid = getpid();
    pthread_mutex_unlock(&lock);
    if (first)
        touch(16 << 20);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    (void)dev;
    pthread_mutex_lock(&lock);
    CUcontext have = primary;
    pthread_mutex_unlock(&lock);
    if (have) {
        *pctx = have;
        return CUDA_SUCCESS;
    }
    CUresult r = new_context(pctx);
    pthread_mutex_lock(&lock);
    primary = *pctx;
    pthread_mutex_unlock(&lock);
    return r;
}

/* The context is only remembered: every call acts on "the" device. */
CUresult cuCtxSetCurrent(CUcontext ctx) { return ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    (void)dev;
    return new_context(pctx);
}

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
                        unsigned int flags, CUdevice dev) {
    (void)params;
    (void)n;
    (void)flags;
    (void)dev;
    return new_context(pctx);
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) { return alloc(dptr, size, DEVICE); }
CUresult cuMemFree_v2(CUdeviceptr p) { return release(p, DEVICE); }
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s) {
    (void)s;
    return alloc(dptr, size, DEVICE);
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s) {
    (void)s;
    return alloc(dptr, size, DEVICE);
}
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    (void)s;
    return release(p, DEVICE);
}
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
    (void)s;
    return release(p, DEVICE);
}
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) {
    (void)pool;
    (void)s;
    return alloc(dptr, size, DEVICE);
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                      CUstream s) {
    (void)pool;
    (void)s;
    return alloc(dptr, size, DEVICE);
}
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) {
    (void)flags;
    return alloc(dptr, size, MANAGED);
}

static CUresult host_alloc(void **pp, size_t size) {
    driver_call();
    if (!pp || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (size >= TOO_BIG)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    memset(p, 1, size);
    pthread_mutex_lock(&lock);
    put((unsigned long long)(uintptr_t)p, size, HOST);
    pthread_mutex_unlock(&lock);
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void **pp, size_t size) { return host_alloc(pp, size); }
CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    (void)flags;
    return host_alloc(pp, size);
}
CUresult cuMemFreeHost(void *p) {
    unsigned long long size;
    pthread_mutex_lock(&lock);
    int ok = take((unsigned long long)(uintptr_t)p, HOST, &size);
    pthread_mutex_unlock(&lock);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    munmap(p, size);
    return CUDA_SUCCESS;
}
CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags) {
    (void)flags;
    return p && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemHostUnregister(void *p) { return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags) {
    (void)flags;
    driver_call();
    if (!handle || !prop || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (size >= TOO_BIG)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    *handle = next_handle++;
    int device = prop->location.type == 1;
    put(*handle, size, device ? VMM_DEVICE : VMM_HOST);
    if (device) {
        device_used += size;
        publish();
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
/* The memory goes back at the release here, not at the last unmap: close
 * enough for NVML figures, which the tests take with no VMM memory live. */
CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    unsigned long long size;
    pthread_mutex_lock(&lock);
    int ok = 1;
    if (take(h, VMM_DEVICE, &size)) {
        device_used -= size;
        publish();
    } else {
        ok = take(h, VMM_HOST, &size);
    }
    pthread_mutex_unlock(&lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                  unsigned long long flags) {
    (void)offset;
    (void)flags;
    return ptr && size && h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    return ptr && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
