//! `bpf list` and `bpf top` against the real kernel (run as root).

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

fn stats_sysctl() -> String {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
        .unwrap()
        .trim()
        .to_string()
}

/// Restores the stats sysctl when the test ends, however it ends.
struct Sysctl(String);
impl Drop for Sysctl {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", &self.0);
    }
}

#[test]
#[ignore = "needs root and BPF"]
fn top_counts_every_run_of_a_known_program() {
    require_root();
    let _turn = bpf_stats_turn();
    let _restore = Sysctl(stats_sysctl());
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "0").unwrap();
    let w = workload("uprobes");
    // 300 calls, 2 ms apart: about 500 runs per second for ~0.7 s.
    let mut wl = Gated::spawn({
        let mut c = Command::new(&w);
        c.args(["paced", "300", "2000"]);
        c
    });
    // Not `-p`: that run would end with the workload, unloading the
    // program before top's last look. Only this workload runs the binary.
    let counter = start(&["count", &format!("uprobe:{}:work", w.display())]);
    let ids = prog_ids_of(counter.pid());
    assert_eq!(ids.len(), 1, "one program counts the calls: {ids:?}");
    // bpf list names it and says where it is attached.
    let list = ok(&run(&["bpf", "list", "--json"]));
    let entry = json_lines(&list)
        .into_iter()
        .find(|v| v["id"] == ids[0])
        .unwrap();
    assert!(
        entry["name"].as_str().unwrap().starts_with("bpfscope_u"),
        "{entry}"
    );
    assert!(
        entry["attached"][0].as_str().unwrap().contains("uprobe"),
        "{entry}"
    );

    let top = start_top();
    let during = stats_sysctl();
    wl.go_and_wait();
    std::thread::sleep(Duration::from_millis(400));
    let (out, _) = top.interrupt();
    let (mut total, mut time, mut intervals) = (0u64, 0u64, 0);
    for v in json_lines(&out).iter().filter(|v| v["id"] == ids[0]) {
        let (cnt, t) = (
            v["run_cnt"].as_u64().unwrap(),
            v["run_time_ns"].as_u64().unwrap(),
        );
        total += cnt;
        time += t;
        intervals += 1;
        assert_eq!(v["type"], "bpf_prog");
        if cnt > 0 {
            let avg = v["avg_ns"].as_f64().unwrap();
            assert!((avg - t as f64 / cnt as f64).abs() < 1e-6);
            assert!(v["cpu_pct"].as_f64().unwrap() > 0.0);
        }
    }
    // Every run between top's first and last look, no more, no less.
    assert_eq!(total, 300, "{out}");
    assert!(time > 0 && intervals >= 2);
    // Statistics came from BPF_ENABLE_STATS, not the sysctl.
    assert_eq!(during, "0");
    let _ = counter.interrupt();
}

fn start_top() -> Running {
    start_until(&["bpf", "top", "--json", "--interval", "0.3"], "Watching")
}

/// Like start(), waiting for another ready line.
fn start_until(args: &[&str], ready: &str) -> Running {
    let mut cmd = Command::new(bin());
    cmd.args(args);
    start_cmd(cmd, ready)
}

#[test]
#[ignore = "needs root and BPF"]
fn top_leaves_the_stats_setting_as_found() {
    require_root();
    let _turn = bpf_stats_turn();
    let _restore = Sysctl(stats_sysctl());
    let w = workload("uprobes");
    let runs_of = |id: u64| -> u64 {
        let out = ok(&run(&["bpf", "list", "--json"]));
        json_lines(&out)
            .into_iter()
            .find(|v| v["id"] == id)
            .map_or(0, |v| v["run_cnt"].as_u64().unwrap())
    };
    for initial in ["0", "1"] {
        std::fs::write("/proc/sys/kernel/bpf_stats_enabled", initial).unwrap();
        let mut wl = Command::new(&w)
            .args(["paced", "100000", "1000"])
            .spawn()
            .unwrap();
        let pid = wl.id().to_string();
        let counter = start(&["count", "uprobe:uprobes:work", "-p", &pid]);
        let id = prog_ids_of(counter.pid())[0];
        let top = start_until(&["bpf", "top", "--json", "--interval", "0.2"], "Watching");
        std::thread::sleep(Duration::from_millis(300));
        // However top ends, the kernel drops its hold on statistics.
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(top.pid(), libc::SIGKILL) };
        let mut top = top;
        let _ = top.finish();
        assert_eq!(stats_sysctl(), initial);
        let a = runs_of(id);
        let deadline = Instant::now() + Duration::from_millis(300);
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let b = runs_of(id);
        if initial == "0" {
            assert_eq!(a, b, "statistics are off again after top");
        } else {
            assert!(b > a, "statistics stay on when they were on before");
        }
        let _ = counter.interrupt();
        let _ = wl.kill();
        let _ = wl.wait();
    }
}

/// A pseudo-terminal pair: (master, slave).
fn pty() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    // SAFETY: plain libc calls on descriptors this function creates and owns.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(m >= 0, "posix_openpt");
        let master = std::os::fd::OwnedFd::from_raw_fd(m);
        assert_eq!(libc::grantpt(m), 0);
        assert_eq!(libc::unlockpt(m), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0);
        let s = libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY);
        assert!(s >= 0, "opening the pty slave");
        (master, std::os::fd::OwnedFd::from_raw_fd(s))
    }
}

/// The terminal's local flags (the master reports the slave's settings).
fn lflag(fd: &std::os::fd::OwnedFd) -> libc::tcflag_t {
    use std::os::fd::AsRawFd;
    // SAFETY: termios is plain data that tcgetattr fills.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a valid termios pointer.
    assert_eq!(unsafe { libc::tcgetattr(fd.as_raw_fd(), &mut t) }, 0);
    t.c_lflag
}

/// Runs `bpf top` on a terminal, sends `key` once it reads keys, and
/// checks that it ends within a second and gives the terminal back as found.
fn top_on_a_terminal_ends_on(key: &[u8]) {
    use std::io::{Read, Write};
    use std::os::unix::process::CommandExt;
    let _turn = bpf_stats_turn();
    let _restore = Sysctl(stats_sysctl());
    let (master, slave) = pty();
    let before = lflag(&master);
    assert_ne!(before & libc::ICANON, 0, "a fresh pty is canonical");
    let mut cmd = Command::new(bin());
    cmd.args(["bpf", "top", "--interval", "0.2"])
        .stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave);
    // SAFETY: setsid and ioctl are async-signal-safe; the pty becomes the
    // child's controlling terminal, so Ctrl-C on it raises SIGINT.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let child = Kill(&mut child);
    drop(cmd);
    let mut reader = std::fs::File::from(master.try_clone().unwrap());
    let screen = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = reader.read_to_end(&mut v); // EIO once the child is gone
        v
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while lflag(&master) & libc::ICANON != 0 {
        assert!(
            Instant::now() < deadline,
            "top never put the terminal in cbreak mode"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    std::fs::File::from(master.try_clone().unwrap())
        .write_all(key)
        .unwrap();
    let sent = Instant::now();
    let status = loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(secs(1)),
            "bpf top still runs {} s after {key:?}",
            secs(1)
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status}");
    assert_eq!(lflag(&master), before, "terminal settings restored");
    drop(master);
    let screen = String::from_utf8_lossy(&screen.join().unwrap()).into_owned();
    assert!(screen.contains("; q quits"), "{screen}");
}

#[test]
#[ignore = "needs root and BPF"]
fn top_quits_on_q() {
    require_root();
    top_on_a_terminal_ends_on(b"q");
}

#[test]
#[ignore = "needs root and BPF"]
fn top_quits_on_ctrl_c() {
    require_root();
    top_on_a_terminal_ends_on(b"\x03");
}
