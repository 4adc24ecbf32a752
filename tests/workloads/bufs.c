/*
 * bufs MODE: reads bpfscope shows of syscall buffers and faulting strings.
 * write: writes to /dev/null 5 bytes of "hello world" (a count shorter
 * than the string), 6 bytes of "ab\0cd\nXYZ" (a NUL and bytes after it), and
 * 100 bytes of 'x' (more than an event keeps).
 * fault FILE: opens the path written in FILE through a fresh mapping of
 * FILE whose page this process has not touched yet (a read at syscall entry
 * faults), then again after touching it.
 */
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	if (!strcmp(argv[1], "write")) {
		static char big[100];
		int fd = open("/dev/null", O_WRONLY);

		if (fd < 0)
			return 1;
		memset(big, 'x', sizeof(big));
		if (write(fd, "hello world", 5) != 5 || write(fd, "ab\0cd\nXYZ", 6) != 6 ||
		    write(fd, big, sizeof(big)) != sizeof(big))
			return 1;
		return 0;
	}
	if (!strcmp(argv[1], "fault") && argc > 2) {
		int fd = open(argv[2], O_RDONLY);
		const char *p;
		int r;

		if (fd < 0)
			return 1;
		p = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0);
		if (p == MAP_FAILED)
			return 1;
		r = openat(AT_FDCWD, p, O_RDONLY);
		if (r >= 0)
			close(r);
		*(volatile const char *)p;
		r = openat(AT_FDCWD, p, O_RDONLY);
		if (r >= 0)
			close(r);
		return 0;
	}
	return 2;
}
