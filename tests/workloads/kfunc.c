/* Drives kernel functions a known number of times for the kernel function
 * probe tests. Linked statically, so nothing but what is asked runs in it
 * (no dynamic loader reading libraries).
 *
 *   kfunc getppid N        N getppid() syscalls
 *   kfunc read PATH N K    N preads of K bytes from PATH (created with 4096 bytes)
 *   kfunc write PATH N K   N pwrites of K bytes to PATH
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

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
