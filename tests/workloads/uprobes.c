/*
 * Workload for user-space probes. Usage: uprobes MODE N [M]
 *   calls N: calls work() N times
 *   usdt N:  fires USDT probe bpfscope_test:plain N times (args i, 2*i), and
 *            bpfscope_test:guarded N times, only while its semaphore is set
 *   sleep K M: calls nap(1) K times and nap(20) M times (ms)
 *   stack N: calls work() N times through outer() -> middle()
 *   paced N US: calls work() N times, sleeping US microseconds after each
 *   zeroframe N: calls work() N times with %rbp pointing at a frame record
 *            of zeros, so a frame-pointer walk from work() meets return
 *            address 0 (where frame chains end)
 *   vexones N: calls vex_ones() N times (needs AVX); exits 3 if it ever
 *            returns anything but all ones
 * refused_lock() and refused_vex() begin with instructions x86 uprobes
 * refuse (a lock prefix; a VEX opcode byte of the in/out range); they are
 * never called, so the program runs on CPUs without AVX too.
 * GATE=1 waits for stdin to close (or carry a byte) before starting, so a
 * tracer can attach to the pid first however slow its start.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>
#include <time.h>
#include <unistd.h>

volatile long sink;

/* A probe whose note has no semaphore. */
__attribute__((noinline)) void fire_plain(long i)
{
	STAP_PROBE2(bpfscope_test, plain, i, 2 * i);
}

/*
 * sdt.h decides on semaphores when a probe macro expands, through these two
 * macros: switch them on for the guarded probe only.
 */
#undef _SDT_SEMAPHORE
#define _SDT_SEMAPHORE(p, n) _SDT_ASM_1(_SDT_ASM_ADDR p##_##n##_semaphore)
#undef _SDT_NOTE_SEMAPHORE_USE
#define _SDT_NOTE_SEMAPHORE_USE(provider, name) \
	__asm__ __volatile__("" ::"m"(provider##_##name##_semaphore));

__extension__ unsigned short bpfscope_test_guarded_semaphore
	__attribute__((unused)) __attribute__((section(".probes")));

/* Fires only while a tracer holds the semaphore, as real guarded probes do. */
__attribute__((noinline)) void fire_guarded(long i)
{
	if (bpfscope_test_guarded_semaphore)
		STAP_PROBE1(bpfscope_test, guarded, i);
}

__attribute__((noinline)) long work(long i)
{
	sink += i;
	return i * 3;
}

__attribute__((noinline)) void nap(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

__attribute__((noinline)) void middle(long i)
{
	work(i);
	sink++;
}

__attribute__((noinline)) void outer(long i)
{
	middle(i);
	sink++;
}

#if defined(__x86_64__)
__attribute__((naked, noinline)) void refused_lock(void)
{
	__asm__ volatile("lock incq sink(%rip)\n\tret");
}

__attribute__((naked, noinline)) void refused_vex(void)
{
	__asm__ volatile("vpxor %xmm0, %xmm0, %xmm0\n\tret");
}

/*
 * Stores 16 bytes of ones. Its first instruction, vpcmpeqb (VEX opcode byte
 * 0x74), is one Linux's x86 uprobes accept but take for "je" and skip.
 */
__attribute__((naked, noinline)) void vex_ones(char *b)
{
	__asm__ volatile("vpcmpeqb %xmm0, %xmm0, %xmm0\n\t"
			 "vmovdqu %xmm0, (%rdi)\n\tret");
}

#endif

/* Zeros: {saved frame pointer, return address}. */
static long zero_frame_rec[2];

#if defined(__x86_64__)

__attribute__((noinline)) void zero_frame(long i)
{
	/* The push keeps the real %rbp; work() is a leaf that needs no stack alignment. */
	__asm__ volatile("push %%rbp\n\t"
			 "mov %1, %%rbp\n\t"
			 "call work\n\t"
			 "pop %%rbp"
			 : "+D"(i)
			 : "r"(zero_frame_rec)
			 : "rax", "rcx", "rdx", "rsi", "r8", "r9", "r10", "r11",
			   "memory", "cc");
}
#elif defined(__aarch64__)
__attribute__((noinline)) void zero_frame(long i)
{
	/* x29 points at a zero frame record while work() runs. */
	register long x0 __asm__("x0") = i;

	__asm__ volatile("stp x29, x30, [sp, #-16]!\n\t"
			 "mov x29, %1\n\t"
			 "bl work\n\t"
			 "ldp x29, x30, [sp], #16"
			 : "+r"(x0)
			 : "r"(zero_frame_rec)
			 : "x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "x9", "x10", "x11",
			   "x12", "x13", "x14", "x15", "x16", "x17", "x18", "x30", "memory", "cc");
}
#endif

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	if (getenv("GATE")) {
		char c;
		if (read(0, &c, 1) < 0)
			return 1;
	}
	long n = atol(argv[2]);
	if (!strcmp(argv[1], "calls")) {
		for (long i = 0; i < n; i++)
			work(i);
	} else if (!strcmp(argv[1], "usdt")) {
		for (long i = 0; i < n; i++) {
			fire_plain(i);
			fire_guarded(i);
		}
	} else if (!strcmp(argv[1], "sleep")) {
		long m = argc > 3 ? atol(argv[3]) : 0;
		long long_ms = argc > 4 ? atol(argv[4]) : 20;
		for (long i = 0; i < n; i++)
			nap(1);
		for (long i = 0; i < m; i++)
			nap(long_ms);
	} else if (!strcmp(argv[1], "paced")) {
		long us = argc > 3 ? atol(argv[3]) : 1000;
		for (long i = 0; i < n; i++) {
			work(i);
			usleep(us);
		}
#if defined(__x86_64__)
	} else if (!strcmp(argv[1], "vexones")) {
		for (long i = 0; i < n; i++) {
			unsigned char b[16] = { 0 };
			/* A skipped vpcmpeqb would leave these zeros. */
			__asm__ volatile("vpxor %%xmm0, %%xmm0, %%xmm0" ::: "xmm0");
			vex_ones((char *)b);
			for (int j = 0; j < 16; j++)
				if (b[j] != 0xff)
					return 3;
		}
#endif
	} else if (!strcmp(argv[1], "zeroframe")) {
		for (long i = 0; i < n; i++)
			zero_frame(i);
	} else if (!strcmp(argv[1], "stack")) {
		for (long i = 0; i < n; i++)
			outer(i);
	} else {
		return 2;
	}
	return 0;
}
