/*
 * nofp MODE NAME ARGS...: code for the unwinder, built by the tests with
 * -O2 -fomit-frame-pointer (no frame pointers anywhere, as in distribution
 * binaries). Renames itself NAME.
 *
 *   chain NAME SECS        main -> via_a -> via_b -> hot_leaf; hot_leaf has
 *                          no prologue at all (frame pointers lose via_b)
 *   deep NAME DEPTH SECS   main -> recurse x DEPTH -> deep_leaf
 *   signal NAME SECS       main -> interrupted, which a SIGALRM every 20 ms
 *                          interrupts; the handler spins for 10 ms in
 *                          handler_spin, so about half the samples are in
 *                          the handler, above the kernel's signal frame
 *   short NAME MS          main -> short_spin for MS milliseconds, then exit
 *                          (a storm of these is the short-lived test)
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <time.h>

static volatile unsigned long sink;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* No calls, no stack use: gcc gives it no prologue. */
__attribute__((noinline)) unsigned long hot_leaf(unsigned long x)
{
	for (int i = 0; i < 4000; i++)
		x = x * 6364136223846793005UL + 1442695040888963407UL;
	return x;
}

/* Work after each call keeps them from being tail calls. */
__attribute__((noinline)) unsigned long via_b(unsigned long x)
{
	unsigned long y = hot_leaf(x);

	sink += y;
	return y + 1;
}

__attribute__((noinline)) unsigned long via_a(unsigned long x)
{
	unsigned long y = via_b(x) ^ 3;

	sink += y;
	return y;
}

__attribute__((noinline)) unsigned long deep_leaf(unsigned long x)
{
	for (int i = 0; i < 200000; i++)
		x = x * 6364136223846793005UL + 1;
	return x;
}

/* A frame of its own at every level (the buffer), and work after the call. */
__attribute__((noinline)) unsigned long recurse(int n, unsigned long x)
{
	volatile char buf[48];
	unsigned long y;

	buf[n % 48] = (char)x;
	y = n > 1 ? recurse(n - 1, x + 1) : deep_leaf(x);
	return y + buf[n % 48];
}

static volatile double handler_until;

__attribute__((noinline)) void handler_spin(void)
{
	while (now() < handler_until)
		sink += hot_leaf(sink);
}

static void on_alarm(int sig)
{
	(void)sig;
	handler_until = now() + 0.010;
	handler_spin();
	sink++;
}

__attribute__((noinline)) void interrupted(double until)
{
	while (now() < until)
		for (int i = 0; i < 100; i++)
			sink = sink * 31 + i;
}

__attribute__((noinline)) void short_spin(double until)
{
	while (now() < until)
		sink = sink * 31 + 7;
}

int main(int argc, char **argv)
{
	double until;

	if (argc < 4)
		return 2;
	prctl(PR_SET_NAME, argv[2]);
	if (!strcmp(argv[1], "chain")) {
		until = now() + atof(argv[3]);
		while (now() < until)
			for (int i = 0; i < 100; i++)
				sink = via_a(sink);
	} else if (!strcmp(argv[1], "deep") && argc > 4) {
		int depth = atoi(argv[3]);

		until = now() + atof(argv[4]);
		while (now() < until)
			sink += recurse(depth, sink);
	} else if (!strcmp(argv[1], "signal")) {
		struct sigaction sa;
		struct itimerval it = { { 0, 20000 }, { 0, 20000 } };

		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = on_alarm;
		sigaction(SIGALRM, &sa, NULL);
		setitimer(ITIMER_REAL, &it, NULL);
		interrupted(now() + atof(argv[3]));
		memset(&it, 0, sizeof(it));
		setitimer(ITIMER_REAL, &it, NULL);
	} else if (!strcmp(argv[1], "short")) {
		short_spin(now() + atof(argv[3]) / 1000);
	} else {
		return 2;
	}
	return sink == 42;
}
