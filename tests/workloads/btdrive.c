/*
 * btdrive NAME WHAT N: renames itself NAME, then does N times what the
 * shipped bpftrace tools watch, so that `bpfscope run TOOL.bt` and
 * `bpftrace TOOL.bt`, attached side by side, see the same events:
 *   open     opens a missing file (ENOENT) and /etc/hostname (an fd)
 *   kill     kill(self, 0) (0) and kill of a pid that does not exist (ESRCH)
 *   stat     stat (of a file and a missing one), lstat, statfs
 *   setuid   setuid, setresuid, setfsuid to the current ids
 *   sync     sync, syncfs, fsync, fdatasync, msync
 *   fork     fork and reap a child
 *   exec     run /bin/true with two arguments
 *   sleep    nanosleep of 1 ms
 *   syscalls getppid, many times (a known count of one syscall)
 *   dio FILE direct 4 KiB writes to FILE (which must hold N blocks)
 *   dns      getaddrinfo("localhost")
 *   faults   touches a fresh anonymous page (one page fault)
 * A last argument "hold" keeps the process (and its mappings) alive after
 * the N rounds until a signal ends it, so its user stacks can be named.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 4)
		return 2;
	prctl(PR_SET_NAME, argv[1], 0, 0, 0);
	const char *what = argv[2];
	long n = atol(argv[3]);
	for (long i = 0; i < n; i++) {
		if (!strcmp(what, "open")) {
			int fd = open("/nonexistent/bpfscope-btdrive", O_RDONLY);
			if (fd >= 0)
				close(fd);
			fd = open("/etc/hostname", O_RDONLY);
			if (fd >= 0)
				close(fd);
		} else if (!strcmp(what, "kill")) {
			kill(getpid(), 0);
			kill(999999999, 0);
		} else if (!strcmp(what, "stat")) {
			/* The syscalls statsnoop names (glibc's stat() is newfstatat). */
			struct stat st;
			struct statfs sf;
#ifdef SYS_stat
			syscall(SYS_stat, "/etc/hostname", &st);
			syscall(SYS_stat, "/nonexistent/bpfscope-btdrive", &st);
			syscall(SYS_lstat, "/etc", &st);
#else
			/* arm64 has no stat or lstat: fstatat stands for both. */
			syscall(SYS_newfstatat, AT_FDCWD, "/etc/hostname", &st, 0);
			syscall(SYS_newfstatat, AT_FDCWD, "/nonexistent/bpfscope-btdrive", &st, 0);
			syscall(SYS_newfstatat, AT_FDCWD, "/etc", &st, AT_SYMLINK_NOFOLLOW);
#endif
			statfs("/", &sf);
		} else if (!strcmp(what, "setuid")) {
			if (setuid(getuid()) || setresuid(-1, -1, -1))
				return 1;
			syscall(SYS_setfsuid, getuid());
		} else if (!strcmp(what, "sync")) {
			int fd = open("/tmp/bpfscope-btdrive-sync", O_RDWR | O_CREAT, 0600);
			if (fd < 0)
				return 1;
			sync();
			syncfs(fd);
			fsync(fd);
			fdatasync(fd);
			void *m = mmap(NULL, 4096, PROT_READ, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
			if (m != MAP_FAILED) {
				msync(m, 4096, MS_SYNC);
				munmap(m, 4096);
			}
			close(fd);
		} else if (!strcmp(what, "fork")) {
			pid_t p = fork();
			if (p == 0)
				_exit(0);
			if (p > 0)
				waitpid(p, NULL, 0);
		} else if (!strcmp(what, "exec")) {
			pid_t p = fork();
			if (p == 0) {
				execl("/bin/true", "true", "bpfscope-arg1", "arg2", (char *)NULL);
				_exit(127);
			}
			if (p > 0) {
				/* The tests pick the lines of these pids out of execsnoop's. */
				printf("child %d\n", p);
				fflush(stdout);
				waitpid(p, NULL, 0);
			}
		} else if (!strcmp(what, "sleep")) {
			/* The syscall itself: glibc's nanosleep() calls clock_nanosleep. */
			struct timespec ts = { 0, 1000000 };
			syscall(SYS_nanosleep, &ts, NULL);
		} else if (!strcmp(what, "syscalls")) {
			syscall(SYS_getppid);
		} else if (!strcmp(what, "dio")) {
			if (argc < 5)
				return 2;
			int fd = open(argv[4], O_WRONLY | O_DIRECT);
			void *buf;
			if (fd < 0 || posix_memalign(&buf, 4096, 4096))
				return 1;
			memset(buf, 0x5a, 4096);
			if (pwrite(fd, buf, 4096, i * 4096) != 4096)
				return 1;
			close(fd);
			free(buf);
		} else if (!strcmp(what, "faults")) {
			volatile char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
						MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (p == MAP_FAILED)
				return 1;
			p[0] = 1;
			munmap((void *)p, 4096);
		} else if (!strcmp(what, "dns")) {
			struct addrinfo *res = NULL;
			if (getaddrinfo("localhost", NULL, NULL, &res) == 0)
				freeaddrinfo(res);
		} else {
			return 2;
		}
	}
	if (!strcmp(argv[argc - 1], "hold"))
		pause();
	return 0;
}
