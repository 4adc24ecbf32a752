// A known 3:1 split between two Java methods (tests/it/runtimes.rs); the
// JVM writes /tmp/perf-PID.map at exit (-XX:+DumpPerfMapAtExit).
public class JitSplit {
    static long work(int n) {
        long s = 0;
        for (int i = 0; i < n; i++) {
            s += (long) i * i % 7;
        }
        return s;
    }

    static long heavyJava() {
        return work(3_000_000);
    }

    static long lightJava() {
        return work(1_000_000);
    }

    public static void main(String[] args) {
        double secs = args.length > 0 ? Double.parseDouble(args[0]) : 2.0;
        long end = System.nanoTime() + (long) (secs * 1e9);
        long t = 0;
        while (System.nanoTime() < end) {
            t += heavyJava();
            t += lightJava();
        }
        System.out.println(t > 0 ? "done" : "");
    }
}
