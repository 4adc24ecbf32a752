/*
 * gapmeter CPU SECS: pinned to CPU, DEPTH frames deep (no frame pointers
 * when built that way), reads the monotonic clock in a tight loop for SECS
 * seconds and prints how much of that time it did not run: the sum of
 * gaps of 1 us or more between two reads, and their count. Every sample a
 * profiler takes on this CPU (timer interrupt, stack walk, record) shows
 * up as one such gap; so do other interrupts and the hypervisor.
 * Gaps under 100 us are also summed apart: a sample's interrupt is one of
 * those, while the rare long ones (the host preempting this VM, a kernel
 * thread) add most of the noise between runs.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define DEPTH 24

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long gaps_ns, short_ns, gaps, reads;

__attribute__((noinline)) void measure(long long until)
{
	long long prev = now_ns(), t;

	while ((t = now_ns()) < until) {
		if (t - prev >= 1000) {
			gaps_ns += t - prev;
			if (t - prev < 100000)
				short_ns += t - prev;
			gaps++;
		}
		prev = t;
		reads++;
	}
}

/* Work after the call keeps each level a frame of its own. */
__attribute__((noinline)) long descend(int n, long long until)
{
	volatile char pad[32];

	pad[n % 32] = (char)n;
	if (n > 0)
		return descend(n - 1, until) + pad[n % 32];
	measure(until);
	return 0;
}

int main(int argc, char **argv)
{
	cpu_set_t set;
	long long t0;

	if (argc < 3)
		return 2;
	CPU_ZERO(&set);
	CPU_SET(atoi(argv[1]), &set);
	if (sched_setaffinity(0, sizeof(set), &set))
		return 1;
	t0 = now_ns();
	descend(DEPTH, t0 + (long long)(atof(argv[2]) * 1e9));
	printf("%lld %lld %lld %lld %lld\n", now_ns() - t0, gaps_ns, gaps, reads, short_ns);
	return 0;
}
