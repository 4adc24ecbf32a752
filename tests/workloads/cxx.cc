/*
 * cxx NAME SECONDS: C++ names for the symbolizer (namespaces, methods,
 * templates) and a function inlined into its caller. Renames itself NAME.
 */
#include <cstdlib>
#include <ctime>
#include <sys/prctl.h>

namespace shapes {

static volatile unsigned long sink;

template <typename T> __attribute__((always_inline)) inline T mix(T v)
{
	return v ^ (v >> 3) ^ (v << 7);
}

struct Worker {
	__attribute__((noinline)) void run(unsigned long n);
};

void Worker::run(unsigned long n)
{
	volatile unsigned long slot = 0;

	for (unsigned long i = 0; i < n; i++) {
		sink += mix<unsigned long>(i + sink);
		slot = slot + 1;
	}
}

} // namespace shapes

static double now()
{
	timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	prctl(PR_SET_NAME, argv[1], 0, 0, 0);
	double end = now() + atof(argv[2]);
	shapes::Worker w;
	while (now() < end)
		w.run(100000);
	return 0;
}
