/*
 * GPU allocation stacks (`record --stacks`), run against the stand-in
 * libcuda, linked to it as a framework is: alloc_here() asks the driver
 * for 8 MiB three times, pin_here() for 4 MiB of pinned host memory once.
 * Built with frame pointers and debug information, so each allocation's
 * stack names its function and line. It stays a moment after, so that
 * the recorder names its stacks while it lives.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, int);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocHost_v2(void **, size_t);

#define MIB (1ULL << 20)

static void check(const char *what, CUresult r) {
    if (r != 0) {
        fprintf(stderr, "cuda_stacks: %s returned %d\n", what, r);
        exit(3);
    }
}

__attribute__((noinline)) CUdeviceptr alloc_here(size_t n) {
    CUdeviceptr p = 0;
    check("cuMemAlloc_v2", cuMemAlloc_v2(&p, n)); /* ALLOC */
    return p;
}

__attribute__((noinline)) void *pin_here(size_t n) {
    void *p = NULL;
    check("cuMemAllocHost_v2", cuMemAllocHost_v2(&p, n)); /* PIN */
    return p;
}

int main(void) {
    CUcontext ctx;
    check("cuInit", cuInit(0));
    check("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&ctx, 0));
    for (int i = 0; i < 3; i++)
        alloc_here(8 * MIB);
    pin_here(4 * MIB);
    /* Two of the recorder's drains: named while this process lives. */
    sleep(3);
    return 0;
}
