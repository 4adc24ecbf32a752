/*
 * split NAME SECONDS [sleep]: renames itself NAME, then for SECONDS burns
 * CPU in a known 3:1 split: alpha_caller -> alpha_work runs three times
 * as many identical loop iterations as beta_caller -> beta_work.
 * With "sleep", it instead blocks in wait_here (10 ms naps) for SECONDS.
 * With "count", it prints how many rounds it completed (for benchmarks).
 * With "beta K", beta_caller does K times its usual work: alpha's share
 * is then 3 / (3 + K) (a known change for `bpfscope diff`).
 * A round's work varies at random around 200000 iterations: rounds of one
 * fixed length phase-lock with a sampling period and skew the split.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/*
 * A stack slot makes gcc give spin a frame even though it is a leaf, so
 * frame-pointer unwinding from a sample in it still finds its caller.
 */
__attribute__((noinline)) static void spin(unsigned long n)
{
	volatile unsigned long slot[2] = { 0, 0 };

	for (unsigned long i = 0; i < n; i++) {
		slot[i & 1] += i;
		sink += i ^ (sink >> 3);
	}
}

__attribute__((noinline)) void alpha_work(unsigned long n)
{
	spin(3 * n);
	asm volatile("" ::: "memory");
}

__attribute__((noinline)) void beta_work(unsigned long n)
{
	spin(n);
	asm volatile("" ::: "memory");
}

__attribute__((noinline)) void alpha_caller(unsigned long n)
{
	alpha_work(n);
	asm volatile("" ::: "memory");
}

__attribute__((noinline)) void beta_caller(unsigned long n)
{
	beta_work(n);
	asm volatile("" ::: "memory");
}

__attribute__((noinline)) void wait_here(double secs)
{
	double end = now() + secs;
	struct timespec nap = { 0, 10 * 1000 * 1000 };

	while (now() < end)
		nanosleep(&nap, NULL);
	asm volatile("" ::: "memory");
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	prctl(PR_SET_NAME, argv[1], 0, 0, 0);
	/* GATE=1: wait until stdin closes, so a tracer can attach by pid first. */
	if (getenv("GATE")) {
		char c;
		if (read(0, &c, 1) < 0)
			return 1;
	}
	double secs = atof(argv[2]);
	if (argc > 3 && !strcmp(argv[3], "sleep")) {
		wait_here(secs);
		return 0;
	}
	unsigned long beta = 1;
	if (argc > 4 && !strcmp(argv[3], "beta"))
		beta = strtoul(argv[4], NULL, 10);
	double end = now() + secs;
	unsigned long rounds = 0;
	unsigned int seed = 1;
	while (now() < end) {
		/* 100000..299999: the mean stays 200000. */
		unsigned long n = 100000 + rand_r(&seed) % 200000;

		alpha_caller(n);
		beta_caller(n * beta);
		rounds++;
	}
	if (argc > 3 && !strcmp(argv[3], "count"))
		printf("%lu\n", rounds);
	return 0;
}
