/*
 * A stand-in libnvidia-ml.so.1 for trainbpf's tests: the calls nvml-wrapper
 * makes for init, device count, memory info and running processes, with
 * nvml.h's signatures. One 80 GiB "GPU"; its processes and their memory are
 * what the stand-in libcuda publishes in STANDIN_GPU_DIR (one file per pid,
 * ignored once the process has exited, as the driver forgets it).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define TOTAL (80ULL << 30)
#define MAX_PROCS 64

static nvmlDevice_t the_device = (nvmlDevice_t)0x1;

/* Live processes (not zombies) with what they hold. */
static int scan(unsigned int *pids, unsigned long long *bytes) {
    const char *dir = getenv("STANDIN_GPU_DIR");
    int n = 0;
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < MAX_PROCS) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        char path[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *st = fopen(path, "r");
        if (!st)
            continue;
        char state = 0;
        int ok = fscanf(st, "%*d (%*[^)]) %c", &state) == 1;
        fclose(st);
        if (!ok || state == 'Z' || state == 'X')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r");
        unsigned long long b = 0;
        if (!f)
            continue;
        if (fscanf(f, "%llu", &b) == 1) {
            pids[n] = (unsigned)atoi(e->d_name);
            bytes[n] = b;
            n++;
        }
        fclose(f);
    }
    closedir(d);
    return n;
}

nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
const char *nvmlErrorString(nvmlReturn_t r) { return r ? "stand-in error" : "success"; }
nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    snprintf(version, length, "999.99-standin");
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    *count = 1;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (index != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = the_device;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    (void)device;
    snprintf(name, length, "Stand-in GPU");
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    (void)device;
    unsigned int pids[MAX_PROCS];
    unsigned long long bytes[MAX_PROCS];
    int n = scan(pids, bytes);
    unsigned long long used = 0;
    for (int i = 0; i < n; i++)
        used += bytes[i];
    memory->total = TOTAL;
    memory->reserved = 0;
    memory->used = used;
    memory->free = TOTAL - used;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    (void)device;
    unsigned int pids[MAX_PROCS];
    unsigned long long bytes[MAX_PROCS];
    int n = scan(pids, bytes);
    if (!infos || *count < (unsigned)n) {
        *count = (unsigned)n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < n; i++) {
        infos[i].pid = pids[i];
        infos[i].usedGpuMemory = bytes[i];
        infos[i].gpuInstanceId = 0xFFFFFFFF;
        infos[i].computeInstanceId = 0xFFFFFFFF;
    }
    *count = (unsigned)n;
    return NVML_SUCCESS;
}
