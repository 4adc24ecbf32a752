/* openloop N [PATH]: N open(2) calls (openat in glibc) of a file that does
 * not exist (default /nonexistent/bpfscope-openloop), each failing with
 * ENOENT, so no close is needed; prints the mean ns per call. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 100000;
	const char *path = argc > 2 ? argv[2] : "/nonexistent/bpfscope-openloop";
	struct timespec a, z;

	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < n; i++) {
		int fd = open(path, O_RDONLY);
		if (fd >= 0) {
			fprintf(stderr, "openloop: %s exists\n", path);
			return 1;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &z);
	printf("%.2f\n", ((z.tv_sec - a.tv_sec) * 1e9 + (z.tv_nsec - a.tv_nsec)) / n);
	return 0;
}
