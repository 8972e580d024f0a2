/* A bystander's wait calls, outside the job: `waitpid(-1, WNOHANG)` with
 * no children, N times (default 2,000,000); prints the CPU time per call
 * in ns. BENCHMARKS.md (issue 27) runs it untraced and while a recorder
 * traces `sleep 30`, interleaved:
 *
 *   cc -O2 -o /tmp/waitloop xtask/bench/waitloop.c
 *   /tmp/waitloop
 *   trainbpf record -q -o /tmp/w.rec -- sleep 30 & sleep 3; /tmp/waitloop
 *
 * The bystander table of issue 28 is to take it into `cargo xtask bench`. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    struct rusage a, b;
    getrusage(RUSAGE_SELF, &a);
    for (long i = 0; i < n; i++) waitpid(-1, NULL, WNOHANG);
    getrusage(RUSAGE_SELF, &b);
    double us = (b.ru_utime.tv_sec - a.ru_utime.tv_sec) * 1e6 + (b.ru_utime.tv_usec - a.ru_utime.tv_usec)
              + (b.ru_stime.tv_sec - a.ru_stime.tv_sec) * 1e6 + (b.ru_stime.tv_usec - a.ru_stime.tv_usec);
    printf("%.1f\n", us * 1000 / n);
    return 0;
}
