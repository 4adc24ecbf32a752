//! `bpfscope top`: the live view driven in tmux (keys sent, the pane
//! captured), and its JSON lines.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::common::*;

/// A tmux session running one command, killed when dropped.
struct Tmux {
    name: String,
}

impl Tmux {
    /// None (SKIP said) without tmux.
    fn start(cmd: &str) -> Option<Tmux> {
        if Command::new("tmux").arg("-V").output().is_err() {
            skip("tmux is not installed (scripts/install-deps installs it)");
            return None;
        }
        let name = format!("bpfscope-top-{}", std::process::id());
        let st = Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-s",
                &name,
                "-x",
                "160",
                "-y",
                "40",
                cmd,
            ])
            .status()
            .unwrap();
        assert!(st.success(), "tmux new-session");
        Some(Tmux { name })
    }

    fn capture(&self) -> String {
        let o = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.name])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn keys(&self, k: &str) {
        let st = Command::new("tmux")
            .args(["send-keys", "-t", &self.name, k])
            .status()
            .unwrap();
        assert!(st.success());
    }

    fn alive(&self) -> bool {
        Command::new("tmux")
            .args(["has-session", "-t", &self.name])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// Waits up to `secs` for the pane to satisfy `ok`; the last capture.
    fn wait_for(&self, secs: u64, ok: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            let c = self.capture();
            if ok(&c) || Instant::now() > end {
                return c;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.name])
            .output();
    }
}

fn busy(name: &str, secs: &str) -> Child {
    Command::new(workload("split"))
        .args([name, secs])
        .spawn()
        .unwrap()
}

/// Rows of the view: (self, total, function).
fn rows(screen: &str) -> Vec<(u64, u64, String)> {
    screen
        .lines()
        .skip_while(|l| !l.contains("FUNCTION"))
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 5 {
                return None;
            }
            Some((f[1].parse().ok()?, f[3].parse().ok()?, f[4..].join(" ")))
        })
        .collect()
}

/// The view in a terminal: refreshed every second, sorted by self, then
/// by total after `t`, back after `s`, ended by `q` (the terminal left as
/// it was found).
#[test]
#[ignore = "needs root and BPF"]
fn top_in_a_terminal_sorts_by_self_and_total_and_quits_on_q() {
    require_root();
    let mut w = busy("sp_top", "40");
    let cmd = format!("{} top -p {} -F 499", bin(), w.id());
    let Some(t) = Tmux::start(&cmd) else {
        let _ = w.kill();
        let _ = w.wait();
        return;
    };
    let screen = t.wait_for(30, |s| rows(s).len() >= 3);
    assert!(screen.contains("bpfscope top: "), "{screen}");
    assert!(screen.contains("by self samples"), "{screen}");
    let r = rows(&screen);
    assert_eq!(
        r[0].2, "spin",
        "the hottest function by self first: {screen}"
    );
    // It refreshes: the window's count grows over the next seconds.
    let n0: u64 = r.iter().map(|x| x.0).sum();
    let later = t.wait_for(10, |s| rows(s).iter().map(|x| x.0).sum::<u64>() > n0);
    assert!(
        rows(&later).iter().map(|x| x.0).sum::<u64>() > n0,
        "{later}"
    );

    t.keys("t");
    let screen = t.wait_for(5, |s| s.contains("by total samples"));
    assert!(screen.contains("by total samples"), "{screen}");
    let r = rows(&screen);
    // Sorted by total: main and the leaf hold every sample (ties keep
    // the greater self first), the callers of each half follow.
    assert!(r.windows(2).all(|p| p[0].1 >= p[1].1), "{screen}");
    let main = r.iter().find(|x| x.2 == "main").expect("main");
    assert_eq!(main.1, r[0].1, "{screen}");
    let alpha = r.iter().position(|x| x.2 == "alpha_caller");
    let beta = r.iter().position(|x| x.2 == "beta_caller");
    assert!(alpha < beta && alpha.is_some(), "{screen}");
    t.keys("s");
    let screen = t.wait_for(5, |s| s.contains("by self samples"));
    let r = rows(&screen);
    assert!(r.windows(2).all(|p| p[0].0 >= p[1].0), "{screen}");

    t.keys("q");
    let end = Instant::now() + Duration::from_secs(10);
    while t.alive() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!t.alive(), "top did not quit on q");
    let _ = w.kill();
    let _ = w.wait();
}

/// `--json`: one object per refresh, whose counts cover the window and
/// give the workload's 3:1 split between its two callers.
#[test]
#[ignore = "needs root and BPF"]
fn top_json_refreshes_with_the_split() {
    require_root();
    let mut w = busy("sp_topj", "20");
    let pid = w.id().to_string();
    let o = run(&[
        "top",
        "-p",
        &pid,
        "-F",
        "499",
        "--duration",
        "4",
        "--json",
        "-n",
        "50",
    ]);
    let _ = w.kill();
    let _ = w.wait();
    let out = ok(&o);
    let lines = json_lines(&out);
    assert!((3..=5).contains(&lines.len()), "{out}");
    let last = lines.last().unwrap();
    assert_eq!(last["type"], "top");
    assert_eq!(last["sort"], "self");
    let f = |name: &str| {
        last["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["function"] == name)
            .map_or(0, |x| x["total"].as_u64().unwrap())
    };
    let (a, b) = (f("alpha_caller"), f("beta_caller"));
    assert!(a + b > 300, "{last}");
    let share = a as f64 / (a + b) as f64;
    assert!((0.68..=0.82).contains(&share), "alpha {a} beta {b}");
}

/// The whole system while compilers run (clang++ maps libLLVM and
/// libclang-cpp, 200 MB of code with 10 MB of symbols) and python3
/// loops: top's resident memory stays bounded. Each file's unwind table
/// is compiled one after another into 16-byte rows, the heap freed
/// after a large one goes back, and the symbolizer state of files is let
/// go within a budget (all files held for the run peaked at 100-200 MiB).
#[test]
#[ignore = "needs root and BPF"]
fn top_whole_system_memory_stays_bounded_while_compilers_run() {
    require_root();
    let Some(cxx) = ["clang++-19", "clang++", "g++"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok())
    else {
        skip("no C++ compiler (scripts/install-deps installs clang-19)");
        return;
    };
    let dir = scratch_dir("top_rss");
    let src = dir.join("m.cpp");
    std::fs::write(
        &src,
        "#include <map>\n#include <string>\n#include <vector>\n\
         int main(){std::map<std::string,std::vector<int>> m; m[\"a\"].push_back(1); return m.size();}\n",
    )
    .unwrap();
    let obj = dir.join("m.o");
    let script = format!(
        "while :; do {cxx} -O2 -c -o {} {}; done",
        obj.display(),
        src.display()
    );
    // Its own process group: the compilers it starts go with it. At
    // nice 19, so that tests sampling a workload of their own beside this
    // one still get their CPU (on 2 cores, a full-priority compiler loop
    // cost them a third of their samples).
    let mut compilers = Command::new("nice")
        .args(["-n", "19", "sh", "-c", &script])
        .process_group(0)
        .spawn()
        .unwrap();
    let mut python = Command::new("nice")
        .args([
            "-n",
            "19",
            "python3",
            "-c",
            "import json\nwhile True: json.dumps({'a': [1, 2, 3] * 100})",
        ])
        .spawn()
        .ok();
    // Compilers already running when top starts, and more starting meanwhile.
    std::thread::sleep(Duration::from_secs(2));
    let mut top = Command::new(bin())
        .args([
            "top",
            "-F",
            "199",
            "--duration",
            &secs(12).to_string(),
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = top.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).unwrap();
        s
    });
    let done = wait4_timeout(&mut top, Duration::from_secs(secs(12) + 60));
    // SAFETY: kill(2) on the process group made above.
    unsafe { libc::kill(-(compilers.id() as i32), libc::SIGKILL) };
    let _ = compilers.wait();
    if let Some(p) = python.as_mut() {
        let _ = p.kill();
        let _ = p.wait();
    }
    let (status, ru) = done.expect("top ended");
    let stdout = reader.join().unwrap();
    assert!(status.success(), "{status:?}");
    let lines = json_lines(&stdout);
    assert!(lines.len() >= 5, "{stdout}");
    let total: u64 = lines.iter().filter_map(|l| l["samples"].as_u64()).sum();
    assert!(total > 0, "{stdout}");
    let peak = ru.ru_maxrss as f64 / 1024.0;
    eprintln!(
        "top_rss: peak RSS {peak:.1} MiB over {} refreshes ({cxx})",
        lines.len()
    );
    assert!(peak < 80.0, "peak RSS {peak:.1} MiB");
}
