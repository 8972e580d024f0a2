// A crowded node for `cargo xtask bench`'s A1 (`record --all` at scale):
//
//   crowd SLEEPERS SECONDS RATE KILL_EVERY
//
// forks SLEEPERS processes that wait on a pipe, prints "churn-start", then
// for SECONDS forks RATE short-lived children a second (paced, not in
// bursts): each exits at once, except every KILL_EVERY-th, which waits
// until its parent kills it with SIGKILL, a death the recorder must keep.
// Prints "churn-end", lets the sleepers go (they exit 0 at the pipe's
// end), reaps them, and prints one line of key=value pairs.
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: crowd SLEEPERS SECONDS RATE KILL_EVERY\n");
        return 2;
    }
    long sleepers = atol(argv[1]);
    double seconds = atof(argv[2]);
    long rate = atol(argv[3]);
    long kill_every = atol(argv[4]);
    int gate[2];
    if (pipe(gate) < 0)
        die("pipe");
    for (long i = 0; i < sleepers; i++) {
        pid_t p = fork();
        if (p < 0)
            die("fork (a sleeper)");
        if (p == 0) {
            char c;
            close(gate[1]);
            // EOF once the parent closes its end: a plain exit.
            while (read(gate[0], &c, 1) > 0)
                ;
            _exit(0);
        }
    }
    close(gate[0]);
    printf("churn-start sleepers=%ld\n", sleepers);
    fflush(stdout);

    double t0 = now_s();
    long forks = 0, killed = 0;
    while (now_s() - t0 < seconds) {
        // The next fork's time on a steady grid.
        double due = t0 + (double)forks / (double)rate;
        double wait = due - now_s();
        if (wait > 0) {
            struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
            nanosleep(&ts, NULL);
        }
        int victim = kill_every > 0 && forks % kill_every == kill_every - 1;
        pid_t p = fork();
        if (p < 0)
            die("fork (a short-lived child)");
        if (p == 0) {
            if (victim)
                for (;;)
                    pause();
            _exit(0);
        }
        forks++;
        if (victim) {
            kill(p, SIGKILL);
            killed++;
        }
        int st;
        if (waitpid(p, &st, 0) < 0)
            die("waitpid");
        if (victim ? !(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
                   : !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
            fprintf(stderr, "crowd: a child ended other than expected\n");
            return 1;
        }
    }
    double elapsed = now_s() - t0;
    printf("churn-end\n");
    fflush(stdout);
    close(gate[1]);
    long gone = 0;
    int st;
    while (wait(&st) > 0)
        gone += WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (gone != sleepers) {
        fprintf(stderr, "crowd: %ld of %ld sleepers exited 0\n", gone, sleepers);
        return 1;
    }
    printf("elapsed_s=%.6f forks=%ld killed=%ld sleepers=%ld\n", elapsed, forks, killed, sleepers);
    return 0;
}
