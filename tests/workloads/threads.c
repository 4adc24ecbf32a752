/*
 * threads NAME N SLEEPS: renames itself NAME, then N times starts a thread
 * that sleeps 1 ms SLEEPS times and exits, and waits for it. Each thread is
 * a fork (clone) event and an exit event of its own tid; each sleep is one
 * wakeup of that thread.
 */
#include <pthread.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

static int sleeps;

static void *run(void *arg)
{
	struct timespec ts = { 0, 1000000 };

	(void)arg;
	for (int i = 0; i < sleeps; i++)
		nanosleep(&ts, NULL);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 4)
		return 2;
	prctl(PR_SET_NAME, argv[1], 0, 0, 0);
	int n = atoi(argv[2]);
	sleeps = atoi(argv[3]);
	for (int i = 0; i < n; i++) {
		pthread_t t;

		if (pthread_create(&t, NULL, run, NULL))
			return 1;
		pthread_join(t, NULL);
	}
	return 0;
}
