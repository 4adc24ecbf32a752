/* pingpong N: a parent and a child pass one byte back and forth over two
 * pipes N times (N round trips), so that on one CPU every round trip
 * blocks each side once. Prints the mean ns per round trip, then the
 * voluntary and involuntary context switches of both processes together
 * (getrusage): "ns nvcsw nivcsw". */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 100000;
	int ab[2], ba[2];
	char c = 0;
	struct timespec a, z;
	struct rusage self, child;
	int status;

	if (pipe(ab) || pipe(ba))
		return 1;
	pid_t pid = fork();
	if (pid < 0)
		return 1;
	if (pid == 0) {
		for (long i = 0; i < n; i++)
			if (read(ab[0], &c, 1) != 1 || write(ba[1], &c, 1) != 1)
				_exit(1);
		_exit(0);
	}
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < n; i++)
		if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1)
			return 1;
	clock_gettime(CLOCK_MONOTONIC, &z);
	if (wait4(pid, &status, 0, &child) != pid || status != 0)
		return 1;
	getrusage(RUSAGE_SELF, &self);
	printf("%.2f %ld %ld\n", ((z.tv_sec - a.tv_sec) * 1e9 + (z.tv_nsec - a.tv_nsec)) / n,
	       self.ru_nvcsw + child.ru_nvcsw, self.ru_nivcsw + child.ru_nivcsw);
	return 0;
}
