/*
 * dio NAME FILE N: renames itself NAME, then makes N direct (O_DIRECT)
 * 4 KiB writes at distinct offsets of FILE, which must already hold N blocks.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 4)
		return 2;
	prctl(PR_SET_NAME, argv[1], 0, 0, 0);
	long n = atol(argv[3]);
	int fd = open(argv[2], O_WRONLY | O_DIRECT);
	if (fd < 0)
		return 1;
	void *buf;
	if (posix_memalign(&buf, 4096, 4096))
		return 1;
	memset(buf, 0x5a, 4096);
	for (long i = 0; i < n; i++)
		if (pwrite(fd, buf, 4096, i * 4096) != 4096)
			return 1;
	return 0;
}
