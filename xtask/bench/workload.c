// Workloads for `cargo xtask bench`, compiled with gcc at bench time.
//
// Each mode times its own work and prints one line of key=value pairs on
// stdout, so that a tool's start-up and shutdown (loading eBPF programs,
// writing perf.data) stay out of the figure: what is measured is what the
// job itself feels.
//
//   workload faults THREADS PASSES MIB    W1: map, touch, unmap, per thread
//   workload forks TOTAL MIB PARALLEL     W3: workers touch MIB and exit
//   workload steady SECONDS               W4: training-like step loop
//   workload grow TOTAL_MIB ROUND_MIB WORK W5: steady growth, new highs only
//   workload syscalls N                   B2: getppid N times (a bystander)
//   workload waits N                      B4: waitpid(-1, WNOHANG), no children
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL
#define MIB (1UL << 20)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

// Minor faults and CPU time at the start of main: what the dynamic loader
// took before the work began is not the workload's.
static long start_minflt;
static double start_cpu;

static long minflt(void) {
    struct rusage self, children;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &children);
    return self.ru_minflt + children.ru_minflt;
}

// User plus system CPU of the job, its waited-for workers included. A probe
// runs in the context of the task that hit it, so its cost lands here; and
// unlike elapsed time, CPU time barely moves when other work on the machine
// competes for the cores.
static double cpu_s(void) {
    struct rusage self, children;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &children);
    struct timeval t[4] = {self.ru_utime, self.ru_stime, children.ru_utime, children.ru_stime};
    double sum = 0;
    for (int i = 0; i < 4; i++)
        sum += t[i].tv_sec + t[i].tv_usec / 1e6;
    return sum;
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

// Anonymous memory that really faults page by page: transparent huge pages
// would turn 512 faults into one and hide what the probes cost.
static unsigned char *map_anon(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        die("mmap");
    madvise(p, bytes, MADV_NOHUGEPAGE);
    return p;
}

static void touch(unsigned char *p, size_t bytes, unsigned char v) {
    for (size_t off = 0; off < bytes; off += PAGE)
        p[off] = v;
}

// ------------------------------------------------------------ W1 faults

struct fault_args {
    unsigned long passes;
    size_t bytes;
    pthread_barrier_t *start;
};

static void *fault_thread(void *arg) {
    struct fault_args *a = arg;
    pthread_barrier_wait(a->start);
    for (unsigned long i = 0; i < a->passes; i++) {
        unsigned char *p = map_anon(a->bytes);
        touch(p, a->bytes, (unsigned char)i);
        munmap(p, a->bytes);
    }
    return NULL;
}

static int faults(int threads, unsigned long passes, unsigned long mib) {
    pthread_t tid[threads];
    pthread_barrier_t start;
    struct fault_args args = {passes, mib * MIB, &start};
    // The main thread joins the barrier too, so the clock starts when every
    // worker is ready rather than while threads are still being created.
    pthread_barrier_init(&start, NULL, threads + 1);
    for (int i = 0; i < threads; i++)
        if (pthread_create(&tid[i], NULL, fault_thread, &args))
            die("pthread_create");
    pthread_barrier_wait(&start);
    double t0 = now_s();
    for (int i = 0; i < threads; i++)
        pthread_join(tid[i], NULL);
    double t = now_s() - t0;
    // minflt: the job's own count of its faults (all threads), against which
    // a tool's count of what it saw is checked.
    printf("elapsed_s=%.6f cpu_s=%.6f minflt=%ld\n", t, cpu_s() - start_cpu,
           minflt() - start_minflt);
    return 0;
}

// -------------------------------------------------------------- W3 forks

static int forks(unsigned long total, unsigned long mib, int parallel) {
    // A DataLoader's parent holds the model and the dataset index: its page
    // tables are copied on every fork, which is part of what a fork costs.
    size_t parent_bytes = 64 * MIB;
    unsigned char *held = map_anon(parent_bytes);
    touch(held, parent_bytes, 1);

    size_t bytes = mib * MIB;
    double t0 = now_s();
    unsigned long started = 0;
    while (started < total) {
        int batch = 0;
        for (; batch < parallel && started < total; batch++, started++) {
            pid_t pid = fork();
            if (pid < 0)
                die("fork");
            if (pid == 0) {
                unsigned char *p = map_anon(bytes);
                touch(p, bytes, 7);
                _exit(p[bytes / 2] == 7 ? 0 : 1);
            }
        }
        for (int i = 0; i < batch; i++) {
            int st;
            if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                fprintf(stderr, "workload: a worker failed\n");
                return 1;
            }
        }
    }
    double t = now_s() - t0;
    printf("elapsed_s=%.6f cpu_s=%.6f minflt=%ld forks=%lu\n", t, cpu_s() - start_cpu,
           minflt() - start_minflt, total);
    return 0;
}

// ------------------------------------------------------------- W4 steady

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Each step: a forward/backward-like pass over a resident "model", with
// activation buffers allocated and freed every step (8 MiB, some 2,000
// page faults) and a little memory kept for good (logged metrics), so
// RSS is steady with slow growth, as in a real training loop.
static int steady(double seconds) {
    // glibc raises its mmap threshold after the first large free, after which
    // activations would be recycled from the heap and never fault again; a
    // fixed threshold keeps them mmap'd and freed each step, like a CPU
    // tensor allocator returning memory to the kernel.
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    const size_t model_floats = 32 * MIB / sizeof(float);
    float *model = malloc(model_floats * sizeof(float));
    if (!model)
        die("malloc");
    for (size_t i = 0; i < model_floats; i++)
        model[i] = (float)(i % 1000) / 1000.0f;

    enum { ACTS = 4, LAYER_PASSES = 80 };
    const size_t act_floats = 2 * MIB / sizeof(float);
    size_t cap = (size_t)(seconds * 2000) + 1024;
    double *steps = malloc(cap * sizeof(double));
    if (!steps)
        die("malloc");

    size_t n = 0;
    double sink = 0;
    double t0 = now_s(), end = t0 + seconds;
    while (n < cap) {
        double s0 = now_s();
        if (s0 >= end)
            break;
        float *acts[ACTS];
        for (int a = 0; a < ACTS; a++) {
            acts[a] = malloc(act_floats * sizeof(float));
            if (!acts[a])
                die("malloc");
            const float *w = model + (size_t)a * act_floats;
            for (size_t i = 0; i < act_floats; i++)
                acts[a][i] = w[i] * 1.0001f + (a ? acts[a - 1][i] : 0.5f);
            // The arithmetic of a layer: cache-resident work that makes the
            // step about 50 ms here, so faults are a realistic share of it.
            for (int r = 0; r < LAYER_PASSES; r++)
                for (size_t i = 0; i < act_floats; i++)
                    acts[a][i] = acts[a][i] * 0.999f + w[i] * 0.001f;
        }
        for (int a = ACTS - 1; a >= 0; a--) {
            const float *g = acts[a];
            float *w = model + (size_t)a * act_floats;
            for (size_t i = 0; i < act_floats; i += 16)
                w[i] -= 1e-6f * g[i];
            sink += g[act_floats / 2];
            free(acts[a]);
        }
        // Kept for good: slow growth, a few MiB over minutes.
        char *metrics = malloc(4096);
        if (!metrics)
            die("malloc");
        memset(metrics, (int)n, 4096);
        steps[n++] = now_s() - s0;
    }
    double t = now_s() - t0;
    qsort(steps, n, sizeof(double), cmp_double);
    printf("elapsed_s=%.6f cpu_s=%.6f minflt=%ld steps=%zu step_median_s=%.9f step_p90_s=%.9f "
           "sink=%g\n",
           t, cpu_s() - start_cpu, minflt() - start_minflt, n, n ? steps[n / 2] : 0.0,
           n ? steps[n * 9 / 10] : 0.0, sink);
    return 0;
}

// ------------------------------------------------------------- W5 grow

// Cache-resident arithmetic between two MiB of growth: `work` passes over
// 16 KiB. At the bench's WORK it sets the pace to about 100 MB/s of new
// memory on the machines the bench runs on (the figure printed, rate_mb_s,
// says what it was), so the growth is a share of the job's time, as in a
// job that builds its dataset or caches as it goes.
static float grow_compute(float *buf, size_t n, unsigned long work) {
    for (unsigned long r = 0; r < work; r++)
        for (size_t i = 0; i < n; i++)
            buf[i] = buf[i] * 0.999f + 0.001f;
    return buf[n / 2];
}

// One round: a fresh process touches ROUND_MIB of new memory, a MiB a
// step, and never frees it, so every MiB is a new high of the process's
// added memory (what `record --stacks` samples at). A fresh child per
// round keeps it so: a process that freed and grew again would make no
// new high until it passed its old one.
static int grow_round(size_t round_mib, unsigned long work) {
    unsigned char *p = map_anon(round_mib * MIB);
    float buf[4096];
    for (size_t i = 0; i < 4096; i++)
        buf[i] = (float)i;
    float sink = 0;
    for (size_t m = 0; m < round_mib; m++) {
        touch(p + m * MIB, MIB, (unsigned char)m);
        sink += grow_compute(buf, 4096, work);
    }
    return sink == sink ? 0 : 1;
}

static int grow(unsigned long total_mib, unsigned long round_mib, unsigned long work) {
    if (!round_mib || round_mib > total_mib)
        round_mib = total_mib;
    double t0 = now_s();
    unsigned long done = 0;
    while (done < total_mib) {
        unsigned long n = total_mib - done < round_mib ? total_mib - done : round_mib;
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0)
            _exit(grow_round(n, work));
        int st;
        if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "workload: a grow round failed\n");
            return 1;
        }
        done += n;
    }
    double t = now_s() - t0;
    printf("elapsed_s=%.6f cpu_s=%.6f minflt=%ld rate_mb_s=%.1f\n", t, cpu_s() - start_cpu,
           minflt() - start_minflt, total_mib * (double)MIB / 1e6 / t);
    return 0;
}

// ------------------------------------------------------------ B2, B4

// A cheap system call in a loop: what a tracepoint on every system call
// (or on every wait) adds to each, for a process outside the job. Through
// syscall(2), so that no C library caches the answer.
static int calls(const char *which, unsigned long n) {
    int waits = !strcmp(which, "waits");
    double t0 = now_s();
    for (unsigned long i = 0; i < n; i++) {
        if (waits)
            waitpid(-1, NULL, WNOHANG);
        else
            syscall(SYS_getppid);
    }
    double t = now_s() - t0;
    printf("elapsed_s=%.6f cpu_s=%.6f minflt=%ld ns_per_call=%.1f\n", t, cpu_s() - start_cpu,
           minflt() - start_minflt, t * 1e9 / (double)n);
    return 0;
}

int main(int argc, char **argv) {
    start_minflt = minflt();
    start_cpu = cpu_s();
    if (argc == 5 && !strcmp(argv[1], "faults"))
        return faults(atoi(argv[2]), strtoul(argv[3], NULL, 10), strtoul(argv[4], NULL, 10));
    if (argc == 5 && !strcmp(argv[1], "forks"))
        return forks(strtoul(argv[2], NULL, 10), strtoul(argv[3], NULL, 10), atoi(argv[4]));
    if (argc == 3 && !strcmp(argv[1], "steady"))
        return steady(atof(argv[2]));
    if (argc == 5 && !strcmp(argv[1], "grow"))
        return grow(strtoul(argv[2], NULL, 10), strtoul(argv[3], NULL, 10),
                    strtoul(argv[4], NULL, 10));
    if (argc == 3 && (!strcmp(argv[1], "syscalls") || !strcmp(argv[1], "waits")))
        return calls(argv[1], strtoul(argv[2], NULL, 10));
    fprintf(stderr, "usage: workload faults THREADS PASSES MIB | forks TOTAL MIB PARALLEL | "
                    "steady SECONDS | grow TOTAL_MIB ROUND_MIB WORK | syscalls N | waits N\n");
    return 2;
}
