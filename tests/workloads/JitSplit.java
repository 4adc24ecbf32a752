// A known 3:1 split between two Java methods (tests/it/runtimes.rs); the
// JVM writes /tmp/perf-PID.map at exit (-XX:+DumpPerfMapAtExit). A round's
// work varies at random: fixed rounds phase-lock with the sampling period.
public class JitSplit {
    static long work(int n) {
        long s = 0;
        for (int i = 0; i < n; i++) {
            s += (long) i * i % 7;
        }
        return s;
    }

    static long heavyJava(int n) {
        return work(3 * n);
    }

    static long lightJava(int n) {
        return work(n);
    }

    public static void main(String[] args) {
        double secs = args.length > 0 ? Double.parseDouble(args[0]) : 2.0;
        long end = System.nanoTime() + (long) (secs * 1e9);
        long t = 0;
        java.util.Random rnd = new java.util.Random(1);
        while (System.nanoTime() < end) {
            int n = 500_000 + rnd.nextInt(1_000_001);
            t += heavyJava(n);
            t += lightJava(n);
        }
        System.out.println(t > 0 ? "done" : "");
    }
}
