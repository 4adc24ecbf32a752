/* Drives kernel functions a known number of times for the kernel function
 * probe tests. Linked statically, so nothing but what is asked runs in it
 * (no dynamic loader reading libraries).
 *
 *   kfunc getppid N        N getppid() syscalls
 *   kfunc read PATH N K    N preads of K bytes from PATH (created with 4096 bytes)
 *   kfunc write PATH N K   N pwrites of K bytes to PATH
 *   kfunc block M PATH N   M children blocked in read(2) on a pipe, then N
 *                          preads of 1 byte from PATH, then the children
 *                          are let go (holds M kretprobe instances of
 *                          vfs_read while the N reads happen)
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Whether pid sits in read(2): /proc/PID/syscall starts with its number. */
static int in_read(pid_t pid)
{
	char path[64], buf[64] = "";
	snprintf(path, sizeof(path), "/proc/%d/syscall", pid);
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return n > 2 && buf[0] == '0' && buf[1] == ' ';
}

static int block(long m, const char *path, long n)
{
	int p[2];
	pid_t kids[256];
	char c;

	if (m > 256 || pipe(p))
		return 1;
	for (long i = 0; i < m; i++) {
		kids[i] = fork();
		if (kids[i] < 0)
			return 1;
		if (kids[i] == 0) {
			close(p[1]);
			_exit(read(p[0], &c, 1) == 0 ? 0 : 1);
		}
	}
	close(p[0]);
	/* Wait (up to 10 s) until every child is blocked in read. */
	for (int tries = 0; tries < 1000; tries++) {
		long blocked = 0;
		for (long i = 0; i < m; i++)
			blocked += in_read(kids[i]);
		if (blocked == m)
			break;
		struct timespec ts = { 0, 10 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	int fd = open(path, O_RDWR | O_CREAT, 0644);
	if (fd < 0 || pwrite(fd, "x", 1, 0) != 1)
		return 1;
	for (long i = 0; i < n; i++)
		if (pread(fd, &c, 1, 0) != 1)
			return 1;
	close(p[1]);
	int rc = 0, st;
	for (long i = 0; i < m; i++)
		if (waitpid(kids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
			rc = 1;
	return rc;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "getppid")) {
		long n = atol(argv[2]);

		for (long i = 0; i < n; i++)
			syscall(SYS_getppid);
		return 0;
	}
	if (argc >= 5 && !strcmp(argv[1], "write")) {
		long n = atol(argv[3]);
		size_t k = atol(argv[4]);
		char buf[4096];
		int fd = open(argv[2], O_WRONLY | O_CREAT, 0644);

		if (fd < 0 || k > sizeof(buf))
			return 1;
		memset(buf, 'x', sizeof(buf));
		for (long i = 0; i < n; i++)
			if (pwrite(fd, buf, k, 0) != (ssize_t)k)
				return 1;
		return 0;
	}
	if (argc >= 5 && !strcmp(argv[1], "block"))
		return block(atol(argv[2]), argv[3], atol(argv[4]));
	if (argc >= 5 && !strcmp(argv[1], "read")) {
		long n = atol(argv[3]);
		size_t k = atol(argv[4]);
		char buf[4096];
		int fd = open(argv[2], O_RDWR | O_CREAT, 0644);

		if (fd < 0 || k > sizeof(buf))
			return 1;
		memset(buf, 'x', sizeof(buf));
		if (pwrite(fd, buf, sizeof(buf), 0) != sizeof(buf))
			return 1;
		for (long i = 0; i < n; i++)
			if (pread(fd, buf, k, 0) != (ssize_t)k)
				return 1;
		return 0;
	}
	fprintf(stderr, "usage: kfunc getppid N | kfunc read|write PATH N K\n");
	return 2;
}
