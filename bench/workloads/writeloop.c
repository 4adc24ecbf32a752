/* writeloop N: N one-byte writes to /dev/null; prints the mean ns per write. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 1000000;
	int fd = open("/dev/null", O_WRONLY);
	char b = 0;
	struct timespec a, z;

	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < n; i++)
		if (write(fd, &b, 1) != 1)
			return 1;
	clock_gettime(CLOCK_MONOTONIC, &z);
	printf("%.2f\n", ((z.tv_sec - a.tv_sec) * 1e9 + (z.tv_nsec - a.tv_nsec)) / n);
	return 0;
}
