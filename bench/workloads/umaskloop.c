/*
 * umaskloop N: N umask(2) calls with masks 0..0777 in turn; prints the mean
 * CPU time per call in ns (the process's, not wall time: on a busy machine
 * the time spent waiting for a CPU would swamp what tracing adds). umask is
 * as cheap as getppid but has an argument, so that histograms and keys of a
 * field have a value to read.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1000000;
	struct timespec a, z;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
	for (long i = 0; i < n; i++)
		umask(i & 0777);
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &z);
	printf("%.2f\n", ((z.tv_sec - a.tv_sec) * 1e9 + (z.tv_nsec - a.tv_nsec)) / n);
	return 0;
}
