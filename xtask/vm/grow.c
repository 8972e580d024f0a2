/* The job that `cargo xtask vm` runs in the guest, under a 64 MiB memory
 * cgroup limit: it grows its heap 4 MiB at a time until the OOM killer takes
 * it. Built with `gcc -static`, so the initramfs needs no libc.
 *
 * The short sleep between steps lets the recorder's memory samples see the
 * growth, as they would a real job's; the guest is an emulated CPU, so each
 * step is slow anyway. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK (4 << 20)
/* 1 GiB, the guest's RAM: if the limit were not applied, a global OOM would
 * still end it, and the check of the kill's constraint would say so. */
#define MAX_CHUNKS 256

int main(void)
{
	for (int i = 0; i < MAX_CHUNKS; i++) {
		char *p = malloc(CHUNK);
		if (!p) {
			perror("grow: malloc");
			return 2;
		}
		/* Touching the pages, not allocating them, is what charges the
		 * memory cgroup. */
		memset(p, 1, CHUNK);
		usleep(20 * 1000);
	}
	fprintf(stderr, "grow: reached %d MiB without being killed\n", MAX_CHUNKS * 4);
	return 1;
}
