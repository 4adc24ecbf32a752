/* yieldloop N: a parent and a child, meant to share one CPU (taskset),
 * each call sched_yield(2) N times: with the other runnable there, each
 * yield switches to it, without a wakeup or a blocking syscall between.
 * Prints the mean ns per yield, the voluntary and involuntary context
 * switches of both processes together, and their CPU time (user and
 * system) per yield (getrusage): "ns nvcsw nivcsw cpu_ns". */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1000000;
	struct timespec a, z;
	struct rusage self, child;
	int status;

	clock_gettime(CLOCK_MONOTONIC, &a);
	pid_t pid = fork();
	if (pid < 0)
		return 1;
	for (long i = 0; i < n; i++)
		sched_yield();
	if (pid == 0)
		_exit(0);
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
		return 1;
	clock_gettime(CLOCK_MONOTONIC, &z);
	getrusage(RUSAGE_SELF, &self);
	getrusage(RUSAGE_CHILDREN, &child);
	double ns = (z.tv_sec - a.tv_sec) * 1e9 + (z.tv_nsec - a.tv_nsec);
	double cpu = 0;
	for (int i = 0; i < 2; i++) {
		struct rusage *r = i ? &child : &self;

		cpu += (r->ru_utime.tv_sec + r->ru_stime.tv_sec) * 1e9 +
		       (r->ru_utime.tv_usec + r->ru_stime.tv_usec) * 1e3;
	}
	printf("%.1f %ld %ld %.1f\n", ns / (2.0 * n), self.ru_nvcsw + child.ru_nvcsw,
	       self.ru_nivcsw + child.ru_nivcsw, cpu / (2.0 * n));
	return 0;
}
