/*
 * hotline NAME SECONDS: renames itself NAME, then for SECONDS runs
 * hot_loop, whose body has one cheap line (COLD) and one line of eight
 * dependent multiplications (HOT). Built with -O0 each line's code is its
 * own, so nearly every sample lands on HOT (tests/it/profile.rs:
 * `annotate`). The markers are found by the test in this file.
 */
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

volatile unsigned long sink;

__attribute__((noinline)) void hot_loop(unsigned long n)
{
	unsigned long x = n, y = 0;

	for (unsigned long i = 0; i < n; i++) {
		y += i; /* COLD */
		x = x * 0x5851f42d4c957f2dUL + 1; x = x * 0x5851f42d4c957f2dUL + 1; x = x * 0x5851f42d4c957f2dUL + 1; x = x * 0x5851f42d4c957f2dUL + 1; x = x * 0x5851f42d4c957f2dUL + 1; x = x * 0x5851f42d4c957f2dUL + 1; x = x * 0x5851f42d4c957f2dUL + 1; x = x * 0x5851f42d4c957f2dUL + 1; /* HOT */
	}
	sink = x + y;
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	prctl(PR_SET_NAME, argv[1], 0, 0, 0);
	double end = now() + atof(argv[2]);
	while (now() < end)
		hot_loop(1000000);
	return 0;
}
