/*
 * workers NAME N SECONDS: renames itself NAME, then starts N threads named
 * worker-0 .. worker-N-1 (pthread_setname_np) that each spin in
 * worker_spin for SECONDS, and joins them (tests/it/profile.rs: thread
 * names in every profile output).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

static double seconds;
static volatile unsigned long sink;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static void worker_spin(void)
{
	double end = now() + seconds;

	while (now() < end)
		for (int i = 0; i < 10000; i++)
			sink += i;
}

static void *run(void *arg)
{
	(void)arg;
	worker_spin();
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 4)
		return 2;
	prctl(PR_SET_NAME, argv[1], 0, 0, 0);
	int n = atoi(argv[2]);
	seconds = atof(argv[3]);
	pthread_t t[64];
	if (n < 1 || n > 64)
		return 2;
	for (int i = 0; i < n; i++) {
		char name[16];

		snprintf(name, sizeof(name), "worker-%d", i);
		if (pthread_create(&t[i], NULL, run, NULL))
			return 1;
		pthread_setname_np(t[i], name);
	}
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	return 0;
}
