// G1/G2 of `cargo xtask bench`: an allocation-heavy CUDA job, as PyTorch
// with its caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) is:
// every tensor a cuMemAlloc_v2 and a cuMemFree_v2.
//
//   cuda_loop LIBCUDA STEPS PAIRS WORK
//
// Loads the driver with dlopen (as the CUDA runtime does: under trainbpf a
// library it did not know at start is probed at this mapping), makes the
// primary context current, then runs STEPS steps. Each step allocates and
// frees PAIRS buffers of 1 to 16 MiB and does WORK passes of cache-resident
// arithmetic between them (the step's "kernels"). Prints key=value pairs
// like xtask/bench/workload.c: elapsed_s, cpu_s, steps, step_median_s,
// calls (driver calls made in the steps).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_s(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec +
           r.ru_stime.tv_usec / 1e6;
}

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "cuda_loop: %s missing\n", name);
        exit(2);
    }
    return p;
}

static void check(const char *what, CUresult r) {
    if (r != 0) {
        fprintf(stderr, "cuda_loop: %s returned %d\n", what, r);
        exit(3);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static float buf[4096];

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: cuda_loop LIBCUDA STEPS PAIRS WORK\n");
        return 1;
    }
    long steps = atol(argv[2]), pairs = atol(argv[3]), work = atol(argv[4]);
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "cuda_loop: %s\n", dlerror());
        return 2;
    }
    CUresult (*init)(unsigned) = sym(lib, "cuInit");
    CUresult (*retain)(CUcontext *, int) = sym(lib, "cuDevicePrimaryCtxRetain");
    CUresult (*set_current)(CUcontext) = sym(lib, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) = sym(lib, "cuMemAlloc_v2");
    CUresult (*release)(CUdeviceptr) = sym(lib, "cuMemFree_v2");
    CUcontext ctx;
    check("cuInit", init(0));
    check("cuDevicePrimaryCtxRetain", retain(&ctx, 0));
    check("cuCtxSetCurrent", set_current(ctx));
    for (int i = 0; i < 4096; i++)
        buf[i] = (float)i;
    double *times = malloc((size_t)steps * sizeof(double));
    if (!times)
        return 4;
    double sink = 0, t0 = now_s(), c0 = cpu_s();
    for (long s = 0; s < steps; s++) {
        double s0 = now_s();
        for (long p = 0; p < pairs; p++) {
            CUdeviceptr d;
            check("cuMemAlloc_v2", alloc(&d, ((size_t)(p % 16) + 1) << 20));
            for (long w = 0; w < work; w++)
                for (int i = 0; i < 4096; i++)
                    buf[i] = buf[i] * 0.999f + 0.001f;
            check("cuMemFree_v2", release(d));
        }
        sink += buf[s % 4096];
        times[s] = now_s() - s0;
    }
    double t = now_s() - t0;
    qsort(times, (size_t)steps, sizeof(double), cmp_double);
    printf("elapsed_s=%.6f cpu_s=%.6f steps=%ld step_median_s=%.9f calls=%ld sink=%g\n", t,
           cpu_s() - c0, steps, steps ? times[steps / 2] : 0.0, steps * pairs * 2, sink);
    return 0;
}
