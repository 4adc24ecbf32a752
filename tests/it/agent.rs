//! `bpfscope agent` against the real kernel and the real consumers: a
//! Prometheus server scraping it, `go tool pprof` fetching profiles, and
//! an ingest server standing in for a profile store.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;

/// A running agent and the address it serves on.
pub struct Agent {
    pub run: Running,
    pub addr: SocketAddr,
}

pub fn start_agent(args: &[&str]) -> Agent {
    let mut cmd = Command::new(bin());
    cmd.arg("agent").args(args);
    let run = start_cmd(cmd, "Listening on http://");
    let line = run
        .stderr_seen
        .iter()
        .find(|l| l.starts_with("Listening on http://"))
        .unwrap()
        .clone();
    let addr = line
        .trim_start_matches("Listening on http://")
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    Agent { run, addr }
}

impl Agent {
    /// Waits (up to 20 s, scaled) until the agent has closed one more window.
    pub fn next_window(&self, what: &str) {
        let windows = self
            .metric("bpfscope_agent_windows_total", None)
            .unwrap_or(0.0);
        wait_for(20, what, || {
            self.metric("bpfscope_agent_windows_total", None)
                .filter(|v| *v >= windows + 1.0)
        });
    }

    pub fn get(&self, path: &str) -> (u16, String, Vec<u8>) {
        http(self.addr, "GET", path, &[])
    }

    pub fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> (u16, String, Vec<u8>) {
        http(self.addr, "GET", path, headers)
    }

    /// The value of one sample line of /metrics (`name{labels} value`).
    pub fn metric(&self, series: &str, token: Option<&str>) -> Option<f64> {
        self.metric_text(token).and_then(|t| value_in(&t, series))
    }

    /// A scrape in the 0.0.4 text format, and one in OpenMetrics: both
    /// checked by their reference parsers; the text one is returned.
    pub fn metric_text(&self, token: Option<&str>) -> Option<String> {
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| vec![("Authorization", a)])
            .unwrap_or_default();
        let (st, head, body) = self.get_with("/metrics", &headers);
        assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
        assert!(head.contains("text/plain; version=0.0.4"), "{head}");
        let text = String::from_utf8_lossy(&body).into_owned();
        check_exposition("text", &text);
        headers.push((
            "Accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        ));
        let (st, head, body) = self.get_with("/metrics", &headers);
        assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
        assert!(head.contains("application/openmetrics-text"), "{head}");
        check_exposition("om", &String::from_utf8_lossy(&body));
        Some(text)
    }

    /// One /metrics scrape in the text format, unchecked: for polls that
    /// race a clock (the reference parsers take seconds in a cold guest).
    pub fn metric_text_unchecked(&self) -> String {
        let (st, _, body) = self.get("/metrics");
        assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
        String::from_utf8_lossy(&body).into_owned()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(self.run.pid(), sig) };
    }

    /// Starts the peak resident memory over from the current one (writing
    /// 5 to clear_refs resets VmHWM).
    pub fn reset_peak_rss(&self) {
        std::fs::write(format!("/proc/{}/clear_refs", self.run.pid()), "5").unwrap();
    }

    /// Anonymous resident memory of the agent now (RssAnon), in MiB: what
    /// it allocated, without the pages of files it maps (symbol tables
    /// while symbolizing), which the kernel can drop at any time.
    pub fn anon_mib(&self) -> f64 {
        anon_mib(self.run.pid())
    }

    /// Peak resident memory of the agent so far (VmHWM), in MiB.
    pub fn peak_rss_mib(&self) -> f64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.run.pid())).unwrap();
        let kib: f64 = s
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap();
        kib / 1024.0
    }

    /// SIGTERM; the agent must end cleanly within 20 s.
    pub fn terminate(mut self) -> String {
        self.signal(libc::SIGTERM);
        let (_, err) = self.run.finish();
        let st = self.run.child.wait().unwrap();
        assert!(st.success(), "agent ended with {st}: {err}");
        err
    }
}

/// RssAnon of a process, in MiB (0 once it is gone).
pub fn anon_mib(pid: i32) -> f64 {
    status_field(pid, "RssAnon")
        .as_deref()
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// The reference parsers, one process for the whole test run
/// (tests/tools/exposition_check.py).
static CHECKER: Mutex<Option<(Child, std::io::BufReader<std::process::ChildStdout>)>> =
    Mutex::new(None);

/// Panics unless the reference parsers take `text` (`om`: OpenMetrics,
/// `text`: the 0.0.4 format, promtool included).
pub fn check_exposition(format: &str, text: &str) {
    use std::io::BufRead;
    let mut g = CHECKER.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/exposition_check.py");
        let mut child = Command::new("python3")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        *g = Some((child, out));
    }
    let (child, out) = g.as_mut().unwrap();
    let stdin = child.stdin.as_mut().unwrap();
    stdin
        .write_all(format!("{format} {}\n", text.len()).as_bytes())
        .unwrap();
    stdin.write_all(text.as_bytes()).unwrap();
    stdin.flush().unwrap();
    let mut answer = String::new();
    out.read_line(&mut answer).unwrap();
    assert_eq!(answer.trim(), "ok", "{format} exposition refused:\n{text}");
}

/// The value of one sample line (`name{labels} value`) of an exposition.
pub fn value_in(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// One HTTP/1.1 request on a fresh connection: (status, head, body).
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(secs(5))).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    split_response(&all)
}

pub fn split_response(all: &[u8]) -> (u16, String, Vec<u8>) {
    let end = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(all.len());
    let head = String::from_utf8_lossy(&all[..end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut body = all.get(end + 4..).unwrap_or(&[]).to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = dechunk(&body);
    }
    (status, head, body)
}

/// The data of a chunked body.
fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&b[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok())
            .unwrap_or(0);
        if size == 0 || b.len() < eol + 2 + size {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 4 + size).min(b.len())..];
    }
    out
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn write_writes(name: &str, n: &str, sizes: &[&str]) {
    let w = workload("writer");
    let st = Command::new(&w)
        .arg(name)
        .arg(n)
        .args(sizes)
        .status()
        .unwrap();
    assert!(st.success());
}

/// Waits until `f` returns Some, or panics with `what` after `secs`.
pub fn wait_for<T>(limit: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    // A limit, not a measurement: three times longer when emulated (an
    // arm64 guest's agent took over 20 s to load a metric's programs).
    let deadline = Instant::now() + Duration::from_secs(secs(limit));
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn no_program_of(pid: i32) {
    let left: Vec<_> = loaded_progs()
        .into_iter()
        .filter(|(_, n, pids)| n.starts_with("bpfscope") && pids.contains(&pid))
        .collect();
    assert!(left.is_empty(), "programs left loaded: {left:?}");
}

/// A Prometheus server scraping `target` every second.
pub struct Prometheus {
    child: Child,
    port: u16,
    _dir: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    pub fn start(dir: &Path, target: SocketAddr) -> Option<Prometheus> {
        if Command::new("prometheus")
            .arg("--version")
            .output()
            .is_err()
        {
            skip("prometheus is not installed (scripts/install-deps installs it)");
            return None;
        }
        let port = free_port();
        let cfg = dir.join("prom.yml");
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n  - job_name: bpfscope\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let p = Prometheus {
            child,
            port,
            _dir: dir.to_path_buf(),
        };
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        wait_for(60, "prometheus to be ready", || {
            TcpStream::connect(addr).ok()?;
            (http(addr, "GET", "/-/ready", &[]).0 == 200).then_some(())
        });
        Some(p)
    }

    pub fn query(&self, q: &str) -> serde_json::Value {
        let addr: SocketAddr = format!("127.0.0.1:{}", self.port).parse().unwrap();
        let enc: String = q
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let (st, _, body) = http(addr, "GET", &format!("/api/v1/query?query={enc}"), &[]);
        assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        v["data"]["result"].clone()
    }

    /// The single value of an instant query, if it has one.
    pub fn value(&self, q: &str) -> Option<f64> {
        let r = self.query(q);
        r.as_array()?.first()?["value"][1].as_str()?.parse().ok()
    }
}

#[test]
#[ignore = "needs root and BPF"]
fn prometheus_reads_exact_counts_and_histogram_buckets() {
    require_root();
    let _turn = bpf_stats_turn();
    let dir = scratch_dir("agent-prom");
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        "[profile]\nhz = 0\n[metrics]\ninterval_seconds = 0.5\n\
         [[metric]]\nname = \"agw_writes\"\nspec = \"count tracepoint:syscalls:sys_enter_write --filter 'comm == \\\"agwprom\\\"' --by comm\"\n\
         [[metric]]\nname = \"agw_sizes\"\nspec = \"hist tracepoint:syscalls:sys_enter_write --value count --filter 'comm == \\\"agwprom\\\"'\"\n",
    )
    .unwrap();
    let agent = start_agent(&["--config", cfg.to_str().unwrap(), "--listen", "127.0.0.1:0"]);
    let Some(prom) = Prometheus::start(&dir, agent.addr) else {
        return;
    };
    wait_for(30, "the agent's target to be up", || {
        (prom.value("up{job=\"bpfscope\"}")? == 1.0).then_some(())
    });
    // 1000 writes of 1 byte, 500 of 100 bytes: exactly 1500.
    write_writes("agwprom", "500", &["1", "1", "100"]);
    let n = wait_for(30, "1500 writes in Prometheus", || {
        let v = prom.value("bpfscope_agw_writes_total{comm=\"agwprom\"}")?;
        (v >= 1500.0).then_some(v)
    });
    assert_eq!(n, 1500.0);
    // Counted once: a later scrape still says 1500.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        prom.value("bpfscope_agw_writes_total{comm=\"agwprom\"}"),
        Some(1500.0)
    );
    // Histogram: 1000 of 1 (le 1), 500 of 100 (64 < 100 <= 128: le 128).
    let count = wait_for(30, "the histogram", || {
        let v = prom.value("bpfscope_agw_sizes_count")?;
        (v >= 1500.0).then_some(v)
    });
    assert_eq!(count, 1500.0);
    let buckets = prom.query("bpfscope_agw_sizes_bucket");
    let mut by_le: Vec<(f64, f64)> = buckets
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let le = s["metric"]["le"].as_str().unwrap();
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap()
            };
            (le, s["value"][1].as_str().unwrap().parse().unwrap())
        })
        .collect();
    by_le.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    let at = |le: f64| by_le.iter().find(|b| b.0 == le).map(|b| b.1);
    assert_eq!(at(0.0), Some(0.0), "{by_le:?}");
    assert_eq!(at(1.0), Some(1000.0), "{by_le:?}");
    assert_eq!(at(64.0), Some(1000.0), "{by_le:?}");
    assert_eq!(at(128.0), Some(1500.0), "{by_le:?}");
    assert!(by_le.iter().all(|b| b.0 >= 0.0), "{by_le:?}");
    assert_eq!(at(f64::INFINITY), Some(1500.0), "{by_le:?}");
    assert_eq!(prom.value("bpfscope_agw_sizes_sum"), Some(1000.0 + 50000.0));
    // Prometheus parsed every line (a bad exposition marks the target down).
    let targets = http(
        format!("127.0.0.1:{}", prom.port).parse().unwrap(),
        "GET",
        "/api/v1/targets",
        &[],
    );
    let t: serde_json::Value = serde_json::from_slice(&targets.2).unwrap();
    let active = &t["data"]["activeTargets"][0];
    assert_eq!(active["health"], "up", "{active}");
    assert_eq!(active["lastError"], "", "{active}");
    let pid = agent.run.pid();
    agent.terminate();
    no_program_of(pid);
}

/// A cgroup v2 directory made for a test, removed (with its parents made
/// here) when dropped; None (with a SKIP line) without a cgroup2 mount.
struct Cgroup {
    dirs: Vec<PathBuf>,
}

impl Cgroup {
    fn new(rel: &str) -> Option<Cgroup> {
        let Some(root) = bpfscope_sys::cgroup::cgroup2_root() else {
            skip("no cgroup2 mount: container labels not checked");
            return None;
        };
        let mut dirs = Vec::new();
        let mut p = root;
        for part in rel.split('/') {
            p = p.join(part);
            if !p.exists() {
                std::fs::create_dir(&p).unwrap();
                dirs.push(p.clone());
            }
        }
        Some(Cgroup { dirs })
    }

    fn enter(&self, pid: u32) {
        let leaf = self.dirs.last().unwrap();
        std::fs::write(leaf.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Whatever is still inside (a test that failed half-way) goes.
        if let Some(leaf) = self.dirs.last() {
            let _ = std::fs::write(leaf.join("cgroup.kill"), "1");
        }
        for d in self.dirs.iter().rev() {
            // An exiting process keeps it busy for a moment.
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// `go tool pprof`, as installed by golang-go.
fn go_pprof() -> Option<PathBuf> {
    let out = Command::new("go")
        .args(["env", "GOTOOLDIR"])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("pprof");
    p.exists().then_some(p)
}

#[test]
#[ignore = "needs root and BPF"]
fn go_pprof_fetches_a_labelled_profile() {
    require_root();
    if go_pprof().is_none() {
        skip("go tool pprof is not installed (golang-go; scripts/install-deps installs it)");
        return;
    }
    let _turn = bpf_stats_turn();
    let w = workload_with("nofp", &["-O2", "-fomit-frame-pointer"]);
    let agent = start_agent(&["--listen", "127.0.0.1:0", "--profile-hz", "199"]);
    let mut wl = Command::new(&w)
        .args(["chain", "agpprof", &secs(8).to_string()])
        .spawn()
        .unwrap();
    // The workload runs in a cgroup shaped like a docker container's under
    // systemd: its samples carry the container id and the unit.
    let scope = Cgroup::new(&format!("system.slice/docker-{}.scope", "b".repeat(64)));
    if let Some(c) = &scope {
        c.enter(wl.id());
    }
    let dir = scratch_dir("agent-pprof");
    let url = format!(
        // Emulated, the agent's loop can be seconds late to load the new
        // binary's unwind table (closing a window, symbolizing, takes that
        // long there): a longer profile holds samples from after it.
        "http://{}/debug/pprof/profile?seconds={}&pid={}{}",
        agent.addr,
        secs(3),
        wl.id(),
        if scope.is_some() {
            "&cgroup=/system.slice"
        } else {
            ""
        }
    );
    let cpu_before = cpu_seconds(wl.id() as i32).unwrap();
    let out = Command::new("go")
        .args(["tool", "pprof", "-raw", "-symbolize=none", &url])
        .env("PPROF_TMPDIR", &dir)
        .env("HOME", &dir)
        .output()
        .unwrap();
    let cpu = cpu_seconds(wl.id() as i32).unwrap() - cpu_before;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}\n{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    // The workload has no frame pointers: its callers need unwind tables.
    let frames: &[&str] = if unwinds_here() {
        &[" hot_leaf ", " via_b ", " via_a ", " main "]
    } else {
        &[" hot_leaf "]
    };
    for f in frames {
        assert!(text.contains(f), "{f} missing:\n{text}");
    }
    assert!(text.contains("comm:[agpprof]"), "{text}");
    assert!(text.contains("thread_name:[agpprof]"), "{text}");
    assert!(text.contains("cgroup:[/"), "{text}");
    if scope.is_some() {
        let id = "b".repeat(64);
        assert!(text.contains(&format!("container_id:[{id}]")), "{text}");
        assert!(text.contains("container_runtime:[docker]"), "{text}");
        assert!(
            text.contains(&format!("systemd_unit:[docker-{id}.scope]")),
            "{text}"
        );
    }
    assert!(text.contains(&format!("pid:[{}]", wl.id())), "{text}");
    // Only that process: no other pid label.
    let pids: std::collections::BTreeSet<&str> = text
        .split("pid:[")
        .skip(1)
        .filter_map(|s| s.split(']').next())
        .collect();
    assert_eq!(pids.len(), 1, "{pids:?}");
    let samples: u64 = text
        .lines()
        .skip_while(|l| !l.starts_with("Samples:"))
        .skip(2)
        .take_while(|l| !l.starts_with("Locations"))
        .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    // 3 s (9 s emulated) of one busy CPU at 199 Hz: ~597 samples (1791),
    // fewer when the machine is busy: at least 70% of 199 a second of the
    // CPU time the workload had while pprof ran (a span and a little more;
    // beside two busy loops here it had 2.17-2.32 s and gave 401-456
    // samples, ~190 a CPU second, where a fixed 450 failed 5 runs of 6).
    // The profile covers whole seconds read out, at least the span asked
    // for and more when the agent's loop was late (its Duration says).
    let window = secs(3);
    let span = text
        .lines()
        .find_map(|l| l.strip_prefix("Duration:"))
        .and_then(|d| d.trim().trim_end_matches('s').parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no Duration in the profile:\n{text}"));
    assert!(span >= window as f64 - 0.01, "{span} s for {window} asked");
    eprintln!("{samples} samples, {cpu:.2} s of the workload's CPU, {span} s covered");
    assert!(
        (min_samples((0.7 * 199.0 * cpu) as u64)..=(217.0 * span.ceil()) as u64).contains(&samples),
        "{samples} samples in {window} s ({span} s covered, {cpu:.2} s of CPU)"
    );
    // Bad parameters: 400 with one line, which pprof shows.
    let (st, head, body) = agent.get("/debug/pprof/profile?seconds=abc");
    assert_eq!(st, 400);
    assert!(
        head.to_ascii_lowercase().contains("x-go-pprof: 1"),
        "{head}"
    );
    assert_eq!(String::from_utf8_lossy(&body).lines().count(), 1);
    let (st, _, _) = agent.get("/debug/pprof/profile?seconds=100000");
    assert_eq!(st, 400);
    let (st, _, body) = agent.get("/debug/pprof/profile?seconds=1&bogus=1");
    assert_eq!(st, 400, "{}", String::from_utf8_lossy(&body));
    let _ = wl.kill();
    let _ = wl.wait();
    let pid = agent.run.pid();
    agent.terminate();
    no_program_of(pid);
}

/// A gzipped pprof, decoded.
pub fn decode_pprof(gz: &[u8]) -> bpfscope::render::pprof::proto::Profile {
    use prost::Message;
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzipped");
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut raw)
        .unwrap();
    bpfscope::render::pprof::proto::Profile::decode(&raw[..]).unwrap()
}

/// Samples of a profile whose comm label is `comm`.
pub fn samples_of(p: &bpfscope::render::pprof::proto::Profile, comm: &str) -> i64 {
    let key = p.string_table.iter().position(|s| s == "comm").unwrap() as i64;
    p.sample
        .iter()
        .filter(|s| {
            s.label
                .iter()
                .any(|l| l.key == key && p.string_table[l.str as usize] == comm)
        })
        .map(|s| s.value[0])
        .sum()
}

/// The stacks of a profile's samples whose comm label is `comm`, leaf
/// first, each frame a function name or, unnamed, its mapping's file and
/// address (what a failure shows).
pub fn stacks_of(p: &bpfscope::render::pprof::proto::Profile, comm: &str) -> Vec<String> {
    let key = p.string_table.iter().position(|s| s == "comm").unwrap() as i64;
    let s = |i: i64| p.string_table[i as usize].as_str();
    p.sample
        .iter()
        .filter(|x| x.label.iter().any(|l| l.key == key && s(l.str) == comm))
        .map(|x| {
            let frames: Vec<String> = x
                .location_id
                .iter()
                .filter_map(|id| p.location.iter().find(|l| l.id == *id))
                .map(|l| {
                    let names: Vec<&str> = l
                        .line
                        .iter()
                        .filter_map(|ln| p.function.iter().find(|f| f.id == ln.function_id))
                        .map(|f| s(f.name))
                        .collect();
                    if names.is_empty() {
                        let file = p
                            .mapping
                            .iter()
                            .find(|m| m.id == l.mapping_id)
                            .map_or("?", |m| s(m.filename));
                        format!("{file}+{:#x}", l.address)
                    } else {
                        names.join("/")
                    }
                })
                .collect();
            format!("{} x{}", frames.join(" < "), x.value[0])
        })
        .collect()
}

/// A request the ingest server got: target, head, body.
type Pushed = (String, String, Vec<u8>);

/// A stand-in for Pyroscope's /ingest: records each request, and answers
/// 200 while `up`, else closes the connection.
struct Ingest {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<Pushed>>>,
    up: Arc<std::sync::atomic::AtomicBool>,
}

impl Ingest {
    fn start() -> Ingest {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let got: Arc<Mutex<Vec<Pushed>>> = Arc::default();
        let up = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (g, u) = (got.clone(), up.clone());
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                if !u.load(std::sync::atomic::Ordering::SeqCst) {
                    drop(s);
                    continue;
                }
                let _ = serve_ingest(s, &g);
            }
        });
        Ingest { addr, got, up }
    }
}

fn serve_ingest(mut s: TcpStream, got: &Mutex<Vec<Pushed>>) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    let (head, body_start) = loop {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break (String::from_utf8_lossy(&buf[..p]).into_owned(), p + 4);
        }
    };
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = buf[body_start..].to_vec();
    while body.len() < len {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let target = head.split_whitespace().nth(1).unwrap_or("").to_string();
    got.lock().unwrap().push((target, head, body));
    s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
}

fn query_param<'a>(target: &'a str, name: &str) -> Option<&'a str> {
    target
        .split_once('?')?
        .1
        .split('&')
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            out.push(
                u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap(), 16).unwrap(),
            );
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

#[test]
#[ignore = "needs root and BPF"]
fn windows_are_pushed_with_labels_and_a_dead_store_costs_nothing() {
    require_root();
    let _turn = bpf_stats_turn();
    let ingest = Ingest::start();
    let dir = scratch_dir("agent-push");
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:0\"\n[profile]\nhz = 99\nwindow_seconds = 2\n[push]\nurl = \"http://{}\"\nqueue = 1\nlabels = {{ env = \"test\", team = \"obs\" }}\n",
            ingest.addr
        ),
    )
    .unwrap();
    let w = workload_with("nofp", &["-O2", "-fomit-frame-pointer"]);
    let agent = start_agent(&["--config", cfg.to_str().unwrap()]);
    let mut wl = Command::new(&w)
        .args(["chain", "agpush", "30"])
        .spawn()
        .unwrap();
    let got = wait_for(30, "two pushed windows", || {
        let g = ingest.got.lock().unwrap();
        (g.len() >= 2).then(|| g.clone())
    });
    let mut froms = Vec::new();
    for (target, head, body) in &got {
        assert!(target.starts_with("/ingest?"), "{target}");
        assert_eq!(query_param(target, "format"), Some("pprof"));
        let name = percent_decode(query_param(target, "name").unwrap());
        assert!(name.starts_with("bpfscope{hostname="), "{name}");
        assert!(
            name.contains(",env=test") && name.contains(",team=obs") && name.ends_with('}'),
            "{name}"
        );
        let from: u64 = query_param(target, "from").unwrap().parse().unwrap();
        let until: u64 = query_param(target, "until").unwrap().parse().unwrap();
        // A 2 s window, flushed late when the CPU is starved (5 s once in
        // an emulated arm64 guest): its span says so, and the next one
        // starts where it ended (checked below).
        let longest = if emulated() { 10 } else { 4 };
        assert!(from < until && until - from <= longest, "{from}..{until}");
        froms.push(from);
        assert!(head.starts_with("POST "), "{head}");
        let p = decode_pprof(body);
        let st = |i: i64| p.string_table[i as usize].clone();
        assert_eq!(st(p.period_type.as_ref().unwrap().r#type), "cpu");
        let thread = p
            .string_table
            .iter()
            .position(|s| s == "thread_name")
            .unwrap() as i64;
        let ours = samples_of(&p, "agpush");
        assert!(
            p.sample
                .iter()
                .all(|s| s.label.iter().any(|l| l.key == thread)),
            "every sample names its thread"
        );
        // ~2 s of one busy CPU at 99 Hz.
        assert!(
            ours > min_samples(50) as i64,
            "{ours} samples of the workload in a window"
        );
    }
    froms.dedup();
    assert_eq!(froms.len(), got.len(), "each window once: {froms:?}");
    // Consecutive windows meet without overlapping.
    let spans: Vec<(u64, u64)> = got
        .iter()
        .map(|(t, _, _)| {
            (
                query_param(t, "from").unwrap().parse().unwrap(),
                query_param(t, "until").unwrap().parse().unwrap(),
            )
        })
        .collect();
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "windows overlap: {spans:?}");
    }
    for (_, head, _) in &got {
        assert!(
            head.to_ascii_lowercase().contains(&format!(
                "user-agent: bpfscope/{}",
                env!("CARGO_PKG_VERSION")
            )),
            "{head}"
        );
    }
    // The store goes away: windows keep closing, requests keep being
    // answered at once, and what cannot be pushed is counted as dropped.
    ingest.up.store(false, std::sync::atomic::Ordering::SeqCst);
    let dropped = wait_for(40, "a dropped window", || {
        let t = Instant::now();
        let (st, _, _) = agent.get("/healthz");
        assert_eq!(st, 200);
        // Emulated, 3 s: a guest's one vCPU is shared with the busy
        // workload and a second test; a push's retries take longer still.
        assert!(
            t.elapsed() < Duration::from_secs(secs(1)),
            "healthz took {:?}",
            t.elapsed()
        );
        let d = agent.metric("bpfscope_agent_push_dropped_total", None)?;
        (d >= 1.0).then_some(d)
    });
    assert!(dropped >= 1.0);
    assert!(
        agent
            .metric("bpfscope_agent_push_failed_total", None)
            .unwrap()
            >= 1.0
    );
    let _ = wl.kill();
    let _ = wl.wait();
    let pid = agent.run.pid();
    let t = Instant::now();
    agent.terminate();
    // Retries are given up within the stop's grace (5 s at most), not
    // waited out (a backoff grows to 30 s); emulated, unloading takes longer.
    let limit = if emulated() { 20 } else { 10 };
    assert!(
        t.elapsed() < Duration::from_secs(limit),
        "{:?}",
        t.elapsed()
    );
    no_program_of(pid);
}

#[test]
#[ignore = "needs root and BPF"]
fn token_reload_and_sigterm() {
    require_root();
    let _turn = bpf_stats_turn();
    let dir = scratch_dir("agent-reload");
    let token = dir.join("token");
    std::fs::write(&token, "t0ken-abc\n").unwrap();
    let data = dir.join("windows");
    let cfg = dir.join("agent.toml");
    let one = "[[metric]]\nname = \"rl_writes\"\nspec = \"count t:syscalls:sys_enter_write --filter 'comm == \\\"agreload\\\"'\"\n";
    let base = format!(
        "listen = \"127.0.0.1:0\"\ntoken_file = \"{}\"\n[profile]\nhz = 49\nwindow_seconds = 300\n[storage]\ndir = \"{}\"\n[metrics]\ninterval_seconds = 0.3\n",
        token.display(),
        data.display()
    );
    std::fs::write(&cfg, format!("{base}{one}")).unwrap();
    let agent = start_agent(&["--config", cfg.to_str().unwrap()]);
    let auth = [("Authorization", "Bearer t0ken-abc")];
    // The token: required everywhere but /healthz, compared exactly.
    assert_eq!(agent.get("/healthz").0, 200);
    for path in [
        "/metrics",
        "/debug/pprof/recent",
        "/debug/pprof/profile?seconds=1",
    ] {
        let (st, head, _) = agent.get(path);
        assert_eq!(st, 401, "{path}: {head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("www-authenticate: bearer"),
            "{head}"
        );
        let (st, _, _) = agent.get_with(path, &[("Authorization", "Bearer t0ken-abd")]);
        assert_eq!(st, 401, "{path}");
    }
    assert_eq!(agent.get_with("/metrics", &auth).0, 200);
    // Malformed and oversized requests: refused with one line, agent unharmed.
    let (st, _, _) = http(agent.addr, "POST", "/metrics", &auth);
    assert_eq!(st, 405);
    let big = "x".repeat(20000);
    let (st, _, _) = agent.get_with(
        "/metrics",
        &[("Authorization", "Bearer t0ken-abc"), ("X-Big", &big)],
    );
    assert_eq!(st, 431);
    let mut s = TcpStream::connect(agent.addr).unwrap();
    s.write_all(b"\x01\x02 garbage\r\n\r\n").unwrap();
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    assert_eq!(split_response(&resp).0, 400);
    // /metrics ignores parameters (a scraper's `params:` must not break it).
    assert_eq!(agent.get_with("/metrics?x=1", &auth).0, 200);
    assert_eq!(agent.get_with("/metrics?x=%zz&name[]=y", &auth).0, 200);
    // /debug/pprof/recent takes none, and says so.
    let (st, _, body) = agent.get_with("/debug/pprof/recent?pid=1", &auth);
    assert_eq!(st, 400);
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("takes no parameters"), "{body}");
    assert_eq!(agent.get_with("/nope", &auth).0, 404);

    write_writes("agreload", "300", &["8"]);
    let series = "bpfscope_rl_writes_total";
    let n = wait_for(20, "300 writes", || {
        let v = agent.metric(series, Some("t0ken-abc"))?;
        (v >= 300.0).then_some(v)
    });
    assert_eq!(n, 300.0);
    // SIGHUP with one metric added, the first unchanged and the profiler's
    // rate changed, while 200 writes go on (2 ms apart): the first metric
    // keeps its programs and its count (no gap, no double count).
    let two = "[[metric]]\nname = \"rl_reads\"\nspec = \"count t:syscalls:sys_enter_read --filter 'comm == \\\"agreload\\\"'\"\n";
    std::fs::write(
        &cfg,
        format!("{base}{one}{two}").replace("hz = 49", "hz = 99"),
    )
    .unwrap();
    let mut writes = Command::new(workload("writer"))
        .args(["agreload", "200", "8"])
        .env("PAUSE_US", "2000")
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(150));
    agent.signal(libc::SIGHUP);
    wait_for(20, "the reload", || {
        agent
            .metric(
                "bpfscope_agent_reloads_total{result=\"ok\"}",
                Some("t0ken-abc"),
            )
            .filter(|v| *v >= 1.0)
    });
    wait_for(20, "the new metric", || {
        let (_, _, body) = agent.get_with("/metrics", &auth);
        String::from_utf8_lossy(&body)
            .contains("# TYPE bpfscope_rl_reads_total counter")
            .then_some(())
    });
    assert!(writes.wait().unwrap().success());
    let n = wait_for(20, "500 writes", || {
        let v = agent.metric(series, Some("t0ken-abc"))?;
        (v >= 500.0).then_some(v)
    });
    assert_eq!(n, 500.0);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(agent.metric(series, Some("t0ken-abc")), Some(500.0));
    // A bad file changes nothing.
    std::fs::write(&cfg, "[profile]\nhz = \"many\"\n").unwrap();
    agent.signal(libc::SIGHUP);
    wait_for(20, "the refused reload", || {
        agent
            .metric(
                "bpfscope_agent_reloads_total{result=\"failed\"}",
                Some("t0ken-abc"),
            )
            .filter(|v| *v >= 1.0)
    });
    assert_eq!(agent.metric(series, Some("t0ken-abc")), Some(500.0));
    // SIGTERM: the window in progress (300 s long) is written, nothing
    // stays attached; the profiler's reload closed the one before.
    let pid = agent.run.pid();
    let err = agent.terminate();
    assert!(err.contains("agent stopped: 2 windows"), "{err}");
    let files: Vec<_> = std::fs::read_dir(&data).unwrap().flatten().collect();
    assert_eq!(files.len(), 2, "{files:?}");
    no_program_of(pid);
}

#[test]
#[ignore = "needs root and BPF"]
fn a_scrape_storm_is_bounded_and_the_profile_unaffected() {
    require_root();
    let _turn = bpf_stats_turn();
    let dir = scratch_dir("agent-storm");
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        "listen = \"127.0.0.1:0\"\n[profile]\nhz = 99\nwindow_seconds = 6\n",
    )
    .unwrap();
    let w = workload_with("nofp", &["-O2", "-fomit-frame-pointer"]);
    let agent = start_agent(&["--config", cfg.to_str().unwrap()]);
    // Busy until the test ends: the storm and the window after it take
    // over 30 s in an emulated guest.
    let wl = KillOnDrop(
        Command::new(&w)
            .args(["chain", "agstorm", "600"])
            .spawn()
            .unwrap(),
    );
    let threads = |pid: i32| {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .count()
    };
    let before = threads(agent.run.pid());
    // What starting took (unwind tables of whatever runs on the machine)
    // is not the storm's: the peak starts over here.
    agent.reset_peak_rss();
    let t0 = Instant::now();
    let addr = agent.addr;
    let max_threads = Arc::new(Mutex::new((before, 0.0f64)));
    let pid = agent.run.pid();
    let m = max_threads.clone();
    let watcher = std::thread::spawn(move || {
        while t0.elapsed() < Duration::from_secs(5) {
            let n = threads(pid);
            let anon = anon_mib(pid);
            let mut g = m.lock().unwrap();
            g.0 = g.0.max(n);
            g.1 = g.1.max(anon);
            drop(g);
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let clients: Vec<_> = (0..300)
        .map(|i| {
            std::thread::spawn(move || {
                let path = if i % 10 == 0 {
                    "/debug/pprof/profile?seconds=1"
                } else {
                    "/metrics"
                };
                http(addr, "GET", path, &[]).0
            })
        })
        .collect();
    let codes: Vec<u16> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let took = t0.elapsed();
    watcher.join().unwrap();
    // Every scrape answered; profiles over the cap of 4 refused with 429.
    for (i, c) in codes.iter().enumerate() {
        let want: &[u16] = if i % 10 == 0 { &[200, 429] } else { &[200] };
        assert!(want.contains(c), "request {i}: {c}: {codes:?}");
    }
    assert!(
        codes.iter().step_by(10).filter(|&&c| c == 200).count() >= 4,
        "{codes:?}"
    );
    assert!(took < Duration::from_secs(secs(30)), "{took:?}");
    // Connections are tasks, not threads.
    let (peak, anon) = *max_threads.lock().unwrap();
    assert!(peak <= before + 1, "threads {before} -> {peak}");
    let rss = agent.peak_rss_mib();
    eprintln!("agent: in the storm, anonymous memory at most {anon:.1} MiB, VmHWM {rss:.1} MiB");
    assert!(anon < 64.0, "anonymous memory {anon:.1} MiB in the storm");
    // The profile did not notice: the next full window has the workload's
    // samples at the rate asked for, and the kernel lost none.
    agent.next_window("a window after the storm");
    for reason in ["keys", "kernel_stack", "user_stack", "stack_collision"] {
        assert_eq!(
            agent.metric(
                &format!("bpfscope_agent_samples_lost_total{{reason=\"{reason}\"}}"),
                None
            ),
            Some(0.0),
            "{reason}"
        );
    }
    // Every sample has a place: runs of the sampling program are in the
    // profile, idle, the agent's own or lost; samples taken whose program
    // did not run are counted. All from one scrape: the counters are
    // published together, as of the last read-out.
    let text = agent.metric_text(None).unwrap();
    let m = |n: &str| value_in(&text, n).unwrap();
    let runs = m("bpfscope_agent_sampler_runs_total");
    // Every family the agent exports of its own is in the README.
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    for l in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let name = l.split_whitespace().next().unwrap();
        if name.starts_with("bpfscope_agent_") || name.starts_with("bpfscope_bpf_prog_") {
            assert!(
                readme.contains(&format!("`{name}`")) || readme.contains(&format!("`{name}{{")),
                "{name} is not in the README"
            );
        }
    }
    // samples_total also holds the second sampler's samples inside other
    // tools' BPF programs (another test's tracepoint programs), which are
    // no runs of the sampling program: a 6.1 guest placed 167 more than runs.
    let placed = m("bpfscope_agent_samples_total") - m("bpfscope_agent_samples_in_bpf_total")
        + m("bpfscope_agent_samples_idle_total")
        + m("bpfscope_agent_samples_own_total")
        + m("bpfscope_agent_samples_lost_total{reason=\"keys\"}");
    // The counters are read just before the sampler moves to the next
    // second: runs stored between that and the move are placed but not
    // counted, and a run between its count and its place when they were
    // read is counted but not placed (one per CPU at most). Both are
    // moments, not seconds: the figures before this were 657 apart in an
    // emulated guest, when runs were read at the scrape.
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get()) as f64;
    assert!(
        placed + cpus >= runs && placed <= runs + 10.0 * cpus,
        "runs {runs}, placed {placed}"
    );
    assert!(m("bpfscope_agent_samples_taken_total") >= runs);
    // The window closed after the storm holds the workload at the rate asked
    // for: 6 s of a busy thread at 99 Hz is ~594 samples (fewer when the
    // other tests take its CPU).
    let (st, _, body) = agent.get("/debug/pprof/recent");
    assert_eq!(st, 200);
    let recent = decode_pprof(&body);
    let ours = samples_of(&recent, "agstorm");
    // A window closed late covers more than 6 s (651 samples in a 6.12
    // guest): the bound follows the time it covers.
    let covered = (recent.duration_nanos as f64 / 1e9).max(6.0);
    assert!(
        ours >= min_samples(250) as i64 && ours as f64 <= 110.0 * covered,
        "{ours} samples of the workload in {covered:.2} s"
    );
    drop(wl);
    let pid = agent.run.pid();
    agent.terminate();
    no_program_of(pid);
}

#[test]
fn bad_agent_input_is_refused_with_one_line() {
    let dir = scratch_dir("agent-bad");
    let bad_toml = dir.join("bad.toml");
    std::fs::write(&bad_toml, "[profile]\nhz = 19\nbogus = 1\n").unwrap();
    let empty_token = dir.join("token");
    std::fs::write(&empty_token, "\n").unwrap();
    for (args, word) in [
        (vec!["--listen", "nonsense"], "IP:PORT"),
        (
            vec!["--metric", "trace t:syscalls:sys_enter_write"],
            "neither",
        ),
        (
            vec!["--config", "/nonexistent/agent.toml"],
            "/nonexistent/agent.toml",
        ),
        (vec!["--config", bad_toml.to_str().unwrap()], "bogus"),
        (vec!["--token-file", empty_token.to_str().unwrap()], "empty"),
        (vec!["--profile-hz", "100000"], "100000"),
        (vec!["--push-url", "ftp://x"], "http://"),
    ] {
        let mut a = vec!["agent"];
        a.extend(&args);
        let o = run_timeout(&a, Duration::from_secs(20));
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(word), "{args:?}: {err}");
    }
}

#[test]
#[ignore = "needs root and BPF"]
fn a_taken_port_is_refused_before_anything_loads() {
    require_root();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let o = run_timeout(
        &["agent", "--listen", &format!("127.0.0.1:{port}")],
        Duration::from_secs(20),
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("Address already in use") || err.contains("in use"),
        "{err}"
    );
}

#[test]
fn the_systemd_unit_verifies() {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/bpfscope-agent.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    assert!(
        text.contains("ExecReload=/bin/kill -HUP $MAINPID"),
        "{text}"
    );
    assert!(text.contains("AmbientCapabilities="), "{text}");
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        skip("systemd-analyze is not installed");
        return;
    }
    // verify needs the ExecStart binary: point a copy of the unit at ours.
    let dir = scratch_dir("agent-unit");
    let copy = dir.join("bpfscope-agent.service");
    std::fs::write(&copy, text.replace("/usr/local/bin/bpfscope", bin())).unwrap();
    let o = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    assert!(err.trim().is_empty(), "warnings: {err}");
}

#[test]
#[ignore = "needs root and BPF"]
fn runs_unprivileged_with_the_units_capabilities() {
    require_root();
    if Command::new("setpriv").arg("--version").output().is_err() {
        skip("setpriv (util-linux) is not installed");
        return;
    }
    let _turn = bpf_stats_turn();
    // The capabilities the systemd unit grants, read from the unit itself.
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/bpfscope-agent.service");
    let text = std::fs::read_to_string(unit).unwrap();
    let caps: Vec<String> = text
        .lines()
        .find_map(|l| l.strip_prefix("AmbientCapabilities="))
        .unwrap()
        .split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    let set = format!("-all,{}", caps.join(","));
    // nobody must be able to execute the binary: a copy outside /root.
    let dir = scratch_dir("agent-caps");
    let copy = Path::new("/tmp").join(format!("bpfscope-caps-{}", std::process::id()));
    std::fs::copy(bin(), &copy).unwrap();
    let _ = Command::new("chmod").arg("755").arg(&copy).status();
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(format!("--inh-caps={set}"))
        .arg(format!("--ambient-caps={set}"))
        .arg(format!("--bounding-set={set}"))
        .arg(&copy)
        .args([
            "agent",
            "--listen",
            "127.0.0.1:0",
            "--profile-hz",
            "99",
            "--window",
            "2",
        ])
        .args([
            "--metric",
            "count t:syscalls:sys_enter_write --filter 'comm == \"agcaps\"'",
        ]);
    let run = start_cmd(cmd, "Listening on http://");
    let addr: SocketAddr = run
        .stderr_seen
        .iter()
        .find_map(|l| l.strip_prefix("Listening on http://"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    let agent = Agent { run, addr };
    let w = workload_with("nofp", &["-O2", "-fomit-frame-pointer"]);
    let wl = KillOnDrop(
        Command::new(&w)
            .args(["chain", "agcapsp", "120"])
            .spawn()
            .unwrap(),
    );
    write_writes("agcaps", "100", &["8"]);
    let n = wait_for(20, "100 writes", || {
        let v = agent.metric("bpfscope_syscalls_sys_enter_write_events_total", None)?;
        (v >= 100.0).then_some(v)
    });
    assert_eq!(n, 100.0);
    // A window with the workload's whole stack: files, symbols and the
    // unwinder all work without root. The agent reads a new process's
    // mappings and compiles its tables after its first samples; in a
    // one-vCPU guest beside another agent test that took longer than a
    // 2 s window, whose samples then had `[unknown]` frames only. Up to
    // three windows in a row, the attempts said.
    // The workload has no frame pointers: its callers need unwind tables.
    let frames: &[&str] = if unwinds_here() {
        &["hot_leaf", "via_b", "via_a", "main"]
    } else {
        &["hot_leaf"]
    };
    for attempt in 1.. {
        agent.next_window("a window with the workload");
        let (st, _, body) = agent.get("/debug/pprof/recent");
        assert_eq!(st, 200);
        let p = decode_pprof(&body);
        let n = samples_of(&p, "agcapsp");
        assert!(
            n > 50,
            "{n} samples of the workload in a 2 s window at 99 Hz"
        );
        let missing: Vec<&str> = frames
            .iter()
            .copied()
            .filter(|f| {
                !p.function
                    .iter()
                    .any(|x| p.string_table[x.name as usize] == *f)
            })
            .collect();
        if missing.is_empty() {
            eprintln!("the workload's frames named in window {attempt}");
            break;
        }
        eprintln!("window {attempt}: {missing:?} not named");
        if attempt < 3 {
            continue;
        }
        // What the agent counted and said, for the failure.
        let counters: Vec<String> = agent
            .metric_text(None)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("bpfscope_agent_") && !l.ends_with(" 0"))
            .map(String::from)
            .collect();
        drop(wl);
        let stacks = stacks_of(&p, "agcapsp");
        let err = agent.terminate();
        panic!(
            "{missing:?} not named without root in {attempt} windows; the workload's stacks: {stacks:?}; agent counters: {counters:?}; agent stderr: {err}"
        );
    }
    drop(wl);
    let pid = agent.run.pid();
    agent.terminate();
    no_program_of(pid);
    let _ = std::fs::remove_file(&copy);
    let _ = dir;
}

#[test]
#[ignore = "needs root and BPF"]
fn a_bpf_program_gone_before_its_profile_is_built_is_named_in_it() {
    require_root();
    let _turn = bpf_stats_turn();
    let agent = start_agent(&["--listen", "127.0.0.1:0", "--profile-hz", "499"]);
    // A profile of the next 6 s (18 emulated: an arm64 guest had not
    // loaded the program before 6 s were over), asked for first...
    let addr = agent.addr;
    let window = format!("/debug/pprof/profile?seconds={}", secs(6));
    let fetch = std::thread::spawn(move || http(addr, "GET", &window, &[]));
    std::thread::sleep(Duration::from_millis(300));
    // ...meanwhile a raw_tp program (not held off by the kernel's recursion
    // guard) is loaded, made hot by a million writes, and unloaded.
    let counter = start(&[
        "count",
        "tracepoint:syscalls:sys_enter_write",
        "--by",
        "comm",
    ]);
    let w = workload("writer");
    // A tenth when emulated, where each write costs tens of times more.
    let writes = if emulated() { "100000" } else { "1000000" };
    let st = Command::new(&w)
        .args(["wr_agbpf", writes, "1"])
        .status()
        .unwrap();
    assert!(st.success());
    let progs = prog_ids_of(counter.pid());
    let _ = counter.interrupt();
    wait_for(10, "the program to unload", || {
        let loaded = loaded_progs();
        progs
            .iter()
            .all(|id| !loaded.iter().any(|p| p.0 == *id))
            .then_some(())
    });
    let (st, _, body) = fetch.join().unwrap();
    assert_eq!(st, 200);
    let p = decode_pprof(&body);
    // Named the kernel's way, as perf names it, after the program is gone.
    let in_prog: i64 = p
        .sample
        .iter()
        .filter(|s| {
            s.location_id.iter().any(|&l| {
                p.location[l as usize - 1].line.iter().any(|ln| {
                    let f = &p.function[ln.function_id as usize - 1];
                    let n = &p.string_table[f.name as usize];
                    n.starts_with("bpf_prog_") && n.ends_with("_bpfscope_sysin")
                })
            })
        })
        .map(|s| s.value[0])
        .sum();
    // Emulated, a timer interrupt lands only between translated blocks, so
    // few land inside the program's JIT code (4 in a 6.12 guest once): there
    // one named sample is the proof.
    let floor = if emulated() { 1 } else { 5 };
    assert!(in_prog >= floor, "samples in bpfscope_sysin: {in_prog}");
    let pid = agent.run.pid();
    agent.terminate();
    no_program_of(pid);
}

#[test]
#[ignore = "needs root and BPF"]
fn series_that_stop_changing_expire() {
    require_root();
    let _turn = bpf_stats_turn();
    let dir = scratch_dir("agent-expire");
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        "listen = \"127.0.0.1:0\"\n[profile]\nhz = 0\n[metrics]\ninterval_seconds = 0.3\nseries_expire_seconds = 2\n\
         [[metric]]\nname = \"ex_writes\"\nspec = \"count t:syscalls:sys_enter_write --by comm --filter 'comm == \\\"agexp1\\\" || comm == \\\"agexp2\\\"'\"\n",
    )
    .unwrap();
    let agent = start_agent(&["--config", cfg.to_str().unwrap()]);
    let one = "bpfscope_ex_writes_total{comm=\"agexp1\"}";
    let two = "bpfscope_ex_writes_total{comm=\"agexp2\"}";
    write_writes("agexp1", "10", &["1"]);
    // Polled without the parsers: checking a scrape took longer than the
    // series lives when the guest's caches were cold (the test alone in a
    // 6.12 guest), and the series expired between two polls. The last
    // scrape below is checked.
    wait_for(20, "the first series", || {
        value_in(&agent.metric_text_unchecked(), one).filter(|v| *v == 10.0)
    });
    // The second keeps changing for 4 s, the first does not change again.
    for _ in 0..8 {
        write_writes("agexp2", "5", &["1"]);
        std::thread::sleep(Duration::from_millis(500));
    }
    let text = agent.metric_text(None).unwrap();
    assert_eq!(value_in(&text, one), None, "expired:\n{text}");
    assert_eq!(
        value_in(&text, two),
        Some(40.0),
        "kept, never reset:\n{text}"
    );
    assert_eq!(
        value_in(
            &text,
            "bpfscope_agent_metric_series_expired_total{metric=\"bpfscope_ex_writes\"}"
        ),
        Some(1.0)
    );
    let pid = agent.run.pid();
    agent.terminate();
    no_program_of(pid);
}

#[test]
#[ignore = "needs root and BPF"]
fn python_frames_reach_the_agents_pprof() {
    require_root();
    if !unwinds_here() {
        return;
    }
    let Some(py) = ["/usr/bin/python3.11", "/usr/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
    else {
        skip("no Debian CPython (scripts/install-deps installs python3.11)");
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/pysplit.py");
    let agent = start_agent(&["--listen", "127.0.0.1:0", "--profile-hz", "199"]);
    // The window opens once the interpreter has started and runs the
    // script: an emulated arm64 guest spent a whole window in CPython's
    // start-up (PyType_Ready and its like, no script frame yet). The script
    // is compiled under its own name, so its frames are pysplit.py's.
    let run = format!(
        "import sys; print('ready', flush=True); s = {:?}; exec(compile(open(s).read(), s, 'exec'))",
        script.display().to_string()
    );
    // Runs until the profile is in: beside another agent test in a
    // one-vCPU guest, a script that ran a fixed 24 s had ended before
    // the span was read.
    let mut wl = KillOnDrop(
        Command::new(py)
            .args(["-c", &run])
            .arg("600")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut ready = String::new();
    BufReader::new(wl.0.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "ready");
    // Longer when emulated: the script runs slower there. The agent learns
    // a new process from its first samples (mappings, unwind tables, the
    // interpreter): on an emulated CPU beside another agent test the first
    // span once had native frames only. Up to three spans in a row, the
    // attempts said.
    let want = ["heavy", "light", "work", "main", "<module>"];
    for attempt in 1.. {
        let (st, _, body) = agent.get(&format!(
            "/debug/pprof/profile?seconds={}&pid={}",
            secs(3),
            wl.0.id()
        ));
        assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
        let p = decode_pprof(&body);
        let funcs: Vec<(&str, &str)> = p
            .function
            .iter()
            .map(|f| {
                (
                    p.string_table[f.name as usize].as_str(),
                    p.string_table[f.filename as usize].as_str(),
                )
            })
            .collect();
        let missing: Vec<&str> = want
            .into_iter()
            .filter(|w| {
                !funcs
                    .iter()
                    .any(|(n, f)| n == w && f.ends_with("pysplit.py"))
            })
            .collect();
        if missing.is_empty() {
            eprintln!("the script's frames in profile {attempt}");
            break;
        }
        let samples: i64 = p.sample.iter().map(|s| s.value[0]).sum();
        eprintln!("profile {attempt}: {samples} samples, {missing:?} missing");
        assert!(
            attempt < 3,
            "{missing:?} missing from {attempt} profiles; the last had {samples} samples, functions {funcs:?}"
        );
    }
    drop(wl);
    let pid = agent.run.pid();
    agent.terminate();
    no_program_of(pid);
}
