/*
 * writer NAME N SIZE...: renames itself NAME (the comm the kernel reports),
 * then writes to /dev/null N times for each SIZE given, in order.
 * Environment: FORK=1 does the writes in a forked child; GATE=1 waits for
 * stdin to close (or carry a byte) before the first write, so a tracer can
 * attach to the pid first however slow its start; PAUSE_US=n sleeps between
 * writes.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static char buf[1 << 20];

int main(int argc, char **argv)
{
	if (argc < 4)
		return 2;
	prctl(PR_SET_NAME, argv[1], 0, 0, 0);
	if (getenv("FORK")) {
		pid_t p = fork();
		if (p > 0) {
			int st;
			waitpid(p, &st, 0);
			return 0;
		}
	}
	long n = atol(argv[2]);
	long pause_us = getenv("PAUSE_US") ? atol(getenv("PAUSE_US")) : 0;
	if (getenv("GATE")) {
		char c;
		if (read(0, &c, 1) < 0)
			return 1;
	}
	int fd = open("/dev/null", O_WRONLY);
	if (fd < 0)
		return 1;
	for (int a = 3; a < argc; a++) {
		size_t size = strtoul(argv[a], NULL, 0);
		if (size > sizeof(buf))
			return 2;
		for (long i = 0; i < n; i++) {
			if (write(fd, buf, size) != (ssize_t)size)
				return 1;
			if (pause_us)
				usleep(pause_us);
		}
	}
	return 0;
}
