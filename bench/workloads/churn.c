/*
 * churn RATE COUNTFILE GZFILE: starts RATE short-lived processes a second,
 * forever, so that pids come and go: in turn /usr/bin/true, ls /usr/bin,
 * sh -c 'echo churn', gzip -c GZFILE and cat /proc/self/status, with
 * their output thrown away. Children are not waited for one by one (they
 * overlap), only reaped. About once a second the number started so far is
 * written to COUNTFILE (replaced whole, by rename). Never falls behind by
 * more than a second's worth: if the machine is too slow, it skips ahead
 * rather than bursting. Runs until killed; kill its process group to
 * take the children too.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void write_count(const char *path, unsigned long n)
{
	char tmp[4096], buf[32];
	int fd, len;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		return;
	len = snprintf(buf, sizeof(buf), "%lu\n", n);
	if (write(fd, buf, len) == len)
		rename(tmp, path);
	close(fd);
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: churn RATE COUNTFILE GZFILE\n");
		return 2;
	}
	long rate = atol(argv[1]);
	const char *countfile = argv[2];
	char *gz = argv[3];
	if (rate < 1)
		rate = 1;

	char *cmd_true[] = { "/usr/bin/true", NULL };
	char *cmd_ls[] = { "/usr/bin/ls", "/usr/bin", NULL };
	char *cmd_sh[] = { "/usr/bin/sh", "-c", "echo churn", NULL };
	char *cmd_gzip[] = { "/usr/bin/gzip", "-c", gz, NULL };
	char *cmd_cat[] = { "/usr/bin/cat", "/proc/self/status", NULL };
	char **cmds[] = { cmd_true, cmd_ls, cmd_sh, cmd_gzip, cmd_cat };
	const int ncmds = sizeof(cmds) / sizeof(cmds[0]);

	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);

	long long period = 1000000000LL / rate;
	long long next = now_ns(), last_write = 0;
	unsigned long started = 0;
	int outstanding = 0;

	write_count(countfile, 0);
	for (unsigned long i = 0;; i++) {
		pid_t pid;

		while (outstanding > 0 && waitpid(-1, NULL, WNOHANG) > 0)
			outstanding--;
		/* Never more than 256 at once: wait for one if it comes to that. */
		if (outstanding >= 256 && waitpid(-1, NULL, 0) > 0)
			outstanding--;
		if (posix_spawn(&pid, cmds[i % ncmds][0], &fa, NULL, cmds[i % ncmds], environ) == 0) {
			started++;
			outstanding++;
		}
		long long t = now_ns();
		if (t - last_write >= 1000000000LL) {
			write_count(countfile, started);
			last_write = t;
		}
		next += period;
		if (t - next > 1000000000LL)
			next = t;
		if (next > t) {
			struct timespec ts = { next / 1000000000LL, next % 1000000000LL };

			clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
		}
	}
}
