/*
 * forker N SECONDS: forks and execs /bin/true N times, one at a time
 * (each child reaped before the next), stopping early after SECONDS.
 * Prints how many children it ran. Many short-lived processes for the
 * profiler's per-process bookkeeping.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	long n = atol(argv[1]);
	double end = now() + atof(argv[2]);
	long done = 0;

	prctl(PR_SET_NAME, "fk_forker", 0, 0, 0);
	for (; done < n && now() < end; done++) {
		pid_t p = fork();
		if (p < 0)
			return 1;
		if (p == 0) {
			execl("/bin/true", "true", (char *)NULL);
			_exit(127);
		}
		int st;
		if (waitpid(p, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			return 1;
	}
	printf("%ld\n", done);
	return 0;
}
