//! `bpfscope agent` under careless and hostile clients, and through
//! reloads: abandoned profile requests, slow heads, concurrent profiles,
//! reloads that fail, a real Prometheus watching every counter.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::agent::*;
use crate::common::*;

/// Sockets of the agent's port in a TCP state (hex, as /proc/net/tcp
/// writes it: 08 is CLOSE_WAIT).
fn sockets_in_state(port: u16, state: &str) -> usize {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|t| t.lines().skip(1).map(str::to_string).collect::<Vec<_>>())
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1].rsplit(':').next() == Some(&format!("{port:04X}")) && f[3] == state
        })
        .count()
}

/// /healthz and /metrics both answer 200 within a second.
fn cheap_endpoints_answer(agent: &Agent) {
    for path in ["/healthz", "/metrics"] {
        let t = Instant::now();
        let (st, _, _) = agent.get(path);
        let took = t.elapsed();
        assert_eq!(st, 200, "{path}");
        assert!(took < Duration::from_secs(1), "{path} took {took:?}");
    }
}

#[test]
#[ignore = "needs root and BPF"]
fn abandoned_profile_requests_are_cancelled_at_once() {
    require_root();
    let _turn = bpf_stats_turn();
    let agent = start_agent(&["--listen", "127.0.0.1:0", "--profile-hz", "49"]);
    let samples = |a: &Agent| {
        a.metric("bpfscope_agent_samples_total", None)
            .unwrap_or(0.0)
    };
    let busy = |a: &Agent| {
        let text = a.metric_text(None)?;
        value_in(&text, "bpfscope_agent_http_profiles_in_progress")
    };
    // One client that goes while its 5-minute profile is being gathered:
    // the request is cancelled within a second or two.
    let mut s = TcpStream::connect(agent.addr).unwrap();
    s.write_all(b"GET /debug/pprof/profile?seconds=300 HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    wait_for(10, "the profile to be in progress", || {
        (busy(&agent)? == 1.0).then_some(())
    });
    drop(s);
    let t = Instant::now();
    wait_for(5, "the gone client's profile to be cancelled", || {
        let text = agent.metric_text(None)?;
        let c = value_in(&text, "bpfscope_agent_http_profiles_cancelled_total")?;
        (c == 1.0 && busy(&agent)? == 0.0).then_some(())
    });
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // 20 requests for 5-minute profiles whose clients close at once.
    for _ in 0..20 {
        let mut s = TcpStream::connect(agent.addr).unwrap();
        s.write_all(b"GET /debug/pprof/profile?seconds=300 HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        drop(s);
    }
    // Each is cancelled once its client is seen gone, refused (429) while
    // 4 are in progress, or, when the close came with the request, never
    // dispatched at all: none may stay in progress, and none is answered.
    let gone = wait_for(10, "the abandoned requests to be let go", || {
        let text = agent.metric_text(None)?;
        let busy = value_in(&text, "bpfscope_agent_http_profiles_in_progress")?;
        let cancelled = value_in(&text, "bpfscope_agent_http_profiles_cancelled_total")?;
        let refused = value_in(
            &text,
            "bpfscope_agent_http_refused_total{reason=\"profiles\"}",
        )?;
        (busy == 0.0).then_some((cancelled, refused))
    });
    assert!(gone.0 + gone.1 <= 21.0, "{gone:?}");
    // Nothing waits for the gone clients: no socket half-closed, the
    // cheap endpoints answer at once, profiles can be asked for again
    // (the slots were given back) and the sampler keeps sampling.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(busy(&agent), Some(0.0));
    assert_eq!(
        sockets_in_state(agent.addr.port(), "08"),
        0,
        "sockets in CLOSE-WAIT"
    );
    for _ in 0..5 {
        cheap_endpoints_answer(&agent);
        std::thread::sleep(Duration::from_millis(200));
    }
    let before = samples(&agent);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let a = agent.addr;
            std::thread::spawn(move || http(a, "GET", "/debug/pprof/profile?seconds=1", &[]).0)
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 200);
    }
    wait_for(10, "samples after the abandon", || {
        (samples(&agent) > before).then_some(())
    });
    let pid = agent.run.pid();
    agent.terminate();
    no_program_of(pid);
}

#[test]
#[ignore = "needs root and BPF"]
fn slow_heads_do_not_starve_scrapes() {
    require_root();
    let _turn = bpf_stats_turn();
    let agent = start_agent(&["--listen", "127.0.0.1:0", "--profile-hz", "19"]);
    // 100 connections sending their request head one byte every 0.5 s.
    let mut slow: Vec<TcpStream> = (0..100)
        .map(|_| {
            let s = TcpStream::connect(agent.addr).unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect();
    let head = b"GET /metrics HTTP/1.1\r\nHost: slow\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let t0 = Instant::now();
    let mut sent = 0;
    let mut closed = vec![None; slow.len()];
    let mut tries = 0;
    while t0.elapsed() < Duration::from_secs(12) {
        for (i, s) in slow.iter_mut().enumerate() {
            if closed[i].is_some() {
                continue;
            }
            let mut b = [0u8; 512];
            match s.read(&mut b) {
                Ok(_) => closed[i] = Some(t0.elapsed()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => closed[i] = Some(t0.elapsed()),
            }
            if closed[i].is_none() && sent < head.len() && s.write(&head[sent..sent + 1]).is_err() {
                closed[i] = Some(t0.elapsed());
            }
        }
        sent += 1;
        cheap_endpoints_answer(&agent);
        tries += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(tries >= 14, "{tries} rounds of scrapes");
    // The head deadline (5 s from the connection's start) closed them all.
    for (i, c) in closed.iter().enumerate() {
        let at = c.unwrap_or_else(|| panic!("slow connection {i} still open after 12 s"));
        assert!(
            at >= Duration::from_secs(4) && at <= Duration::from_secs(8),
            "slow connection {i} closed after {at:?}"
        );
    }
    let pid = agent.run.pid();
    agent.terminate();
    no_program_of(pid);
}

#[test]
#[ignore = "needs root and BPF"]
fn concurrent_profiles_are_built_once_within_64_mib() {
    require_root();
    let Some(py) = ["/usr/bin/python3.11", "/usr/bin/python3"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        skip("no Debian CPython (scripts/install-deps installs python3.11)");
        return;
    };
    let _turn = bpf_stats_turn();
    let dir = scratch_dir("agent-fanout");
    let cfg = dir.join("agent.toml");
    std::fs::write(
        &cfg,
        "listen = \"127.0.0.1:0\"\n[profile]\nhz = 99\n[http]\nmax_profiles = 8\n",
    )
    .unwrap();
    let agent = start_agent(&["--config", cfg.to_str().unwrap()]);
    // Debian's python3.11 (no frame pointers, a large libpython to
    // symbolize) and a C program keep both CPUs busy.
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workloads/pysplit.py");
    let mut py = Command::new(py).arg(&script).arg("20").spawn().unwrap();
    let w = workload_with("nofp", &["-O2", "-fomit-frame-pointer"]);
    let mut c = Command::new(&w)
        .args(["chain", "agfan", "20"])
        .spawn()
        .unwrap();
    // What starting took (unwind tables of whatever runs on the machine)
    // is not what this measures: the peak starts over once it settled.
    std::thread::sleep(Duration::from_secs(2));
    agent.reset_peak_rss();
    // Profiles of the Python process: what they hold does not depend on
    // what else runs on the machine.
    let path = format!("/debug/pprof/profile?seconds=5&pid={}", py.id());
    let bodies: Vec<_> = (0..8)
        .map(|_| {
            let a = agent.addr;
            let path = path.clone();
            std::thread::spawn(move || http(a, "GET", &path, &[]))
        })
        .collect();
    // Anonymous memory every 20 ms while they are built (file pages of
    // the symbol tables mapped meanwhile are the page cache's).
    let mut most: f64 = 0.0;
    while bodies.iter().any(|h| !h.is_finished()) {
        most = most.max(agent.anon_mib());
        std::thread::sleep(Duration::from_millis(20));
    }
    let bodies: Vec<(u16, String, Vec<u8>)> =
        bodies.into_iter().map(|h| h.join().unwrap()).collect();
    let _ = py.kill();
    let _ = c.kill();
    let _ = py.wait();
    let _ = c.wait();
    for (st, _, b) in &bodies {
        assert_eq!(*st, 200, "{}", String::from_utf8_lossy(b));
    }
    // Requests of the same second share one profile: at most two
    // distinct answers (a second boundary between the requests).
    let mut distinct: Vec<&Vec<u8>> = bodies.iter().map(|b| &b.2).collect();
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() <= 2, "{} distinct profiles", distinct.len());
    let p = decode_pprof(&bodies[0].2);
    let n: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    assert!(n > 50, "{n} samples of python in 5 s at 99 Hz");
    assert!(
        p.function
            .iter()
            .any(|f| p.string_table[f.name as usize] == "heavy"),
        "python frames named"
    );
    let peak = agent.peak_rss_mib();
    eprintln!(
        "agent_clients: RSS at most {most:.1} MiB (VmHWM {peak:.1}) while 8 profiles were built"
    );
    assert!(most < 64.0, "RSS {most:.1} MiB with 8 profiles at once");
    let pid = agent.run.pid();
    agent.terminate();
    no_program_of(pid);
}

#[test]
#[ignore = "needs root and BPF"]
fn reloads_are_all_or_nothing_and_no_counter_goes_back() {
    require_root();
    let _turn = bpf_stats_turn();
    let dir = scratch_dir("agent-reloads");
    let cfg = dir.join("agent.toml");
    let port = free_port();
    let base = |hz: u32, listen: u16| {
        format!(
            "listen = \"127.0.0.1:{listen}\"\n[profile]\nhz = {hz}\nwindow_seconds = 3\n\
             [metrics]\ninterval_seconds = 0.3\n"
        )
    };
    let writes = "[[metric]]\nname = \"rr_writes\"\nspec = \"count t:syscalls:sys_enter_write --filter 'comm == \\\"agrr\\\"'\"\n";
    let sizes = "[[metric]]\nname = \"rr_sizes\"\nspec = \"hist t:syscalls:sys_enter_write --value count --filter 'comm == \\\"agrr\\\"'\"\n";
    std::fs::write(&cfg, format!("{}{writes}{sizes}", base(49, port))).unwrap();
    let agent = start_agent(&["--config", cfg.to_str().unwrap()]);
    let Some(prom) = Prometheus::start(&dir, agent.addr) else {
        return;
    };
    wait_for(30, "the agent's target to be up", || {
        (prom.value("up{job=\"bpfscope\"}")? == 1.0).then_some(())
    });
    let total = |a: &Agent| a.metric("bpfscope_rr_writes_total", None);
    write_writes("agrr", "100", &["8"]);
    wait_for(20, "100 writes", || total(&agent).filter(|v| *v == 100.0));
    let reload = |text: String, result: &str, n: f64| {
        std::fs::write(&cfg, text).unwrap();
        agent.signal(libc::SIGHUP);
        wait_for(20, &format!("reload {n} ({result})"), || {
            agent
                .metric(
                    &format!("bpfscope_agent_reloads_total{{result=\"{result}\"}}"),
                    None,
                )
                .filter(|v| *v >= n)
        });
    };
    // A probe that does not exist: refused whole, both metrics keep counting.
    let unknown = writes.replace("sys_enter_write", "sys_enter_writeX");
    reload(format!("{}{unknown}{sizes}", base(49, port)), "failed", 1.0);
    write_writes("agrr", "50", &["8"]);
    wait_for(20, "150 writes", || total(&agent).filter(|v| *v == 150.0));
    assert_eq!(
        agent.metric("bpfscope_rr_sizes_count", None),
        Some(150.0),
        "the other metric of the refused file kept counting"
    );
    // A taken port: refused whole, still served where it was.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    reload(format!("{}{writes}", base(99, taken_port)), "failed", 2.0);
    assert_eq!(
        agent.metric("bpfscope_rr_sizes_count", None),
        Some(150.0),
        "nothing removed by the refused reload"
    );
    // A broken file: refused.
    reload("[profile\n".into(), "failed", 3.0);
    // The rate changed, one metric removed, the other's filter changed
    // under the same name: the sampler's and the metric's counters go on.
    let samples_before = agent.metric("bpfscope_agent_samples_total", None).unwrap();
    let changed = writes.replace(
        "comm == \\\"agrr\\\"",
        "comm == \\\"agrr\\\" || comm == \\\"agrr2\\\"",
    );
    reload(format!("{}{changed}", base(99, port)), "ok", 1.0);
    let samples_after = agent.metric("bpfscope_agent_samples_total", None).unwrap();
    assert!(
        samples_after >= samples_before,
        "{samples_before} -> {samples_after}"
    );
    write_writes("agrr2", "25", &["8"]);
    wait_for(20, "175 writes", || total(&agent).filter(|v| *v == 175.0));
    assert_eq!(
        agent.metric("bpfscope_rr_sizes_count", None),
        None,
        "removed"
    );
    // Added back, with a new name.
    reload(
        format!(
            "{}{changed}{}",
            base(99, port),
            sizes.replace("rr_sizes", "rr_sizes2")
        ),
        "ok",
        2.0,
    );
    write_writes("agrr", "10", &["8"]);
    wait_for(20, "185 writes", || total(&agent).filter(|v| *v == 185.0));
    wait_for(20, "the new histogram", || {
        agent
            .metric("bpfscope_rr_sizes2_count", None)
            .filter(|v| *v == 10.0)
    });
    // Prometheus scraped all along: no counter or histogram of the
    // agent's went back in any of its scrapes.
    std::thread::sleep(Duration::from_secs(3));
    let series = prom.query("{__name__=~\"bpfscope_.+(_total|_count|_sum|_bucket)\"}[10m]");
    let series = series.as_array().unwrap();
    assert!(series.len() > 20, "{} series", series.len());
    for s in series {
        let values: Vec<f64> = s["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v[1].as_str().unwrap().parse().unwrap())
            .collect();
        assert!(
            values.windows(2).all(|w| w[1] >= w[0]),
            "{} went back: {values:?}",
            s["metric"]
        );
    }
    assert_eq!(prom.value("bpfscope_rr_writes_total"), Some(185.0));
    drop(taken);
    let pid = agent.run.pid();
    agent.terminate();
    no_program_of(pid);
}

#[test]
#[ignore = "needs root and BPF"]
fn filtered_latency_starts_are_not_losses() {
    require_root();
    let _turn = bpf_stats_turn();
    let agent = start_agent(&[
        "--listen",
        "127.0.0.1:0",
        "--profile-hz",
        "0",
        "--metric",
        "latency t:syscalls:sys_enter_write t:syscalls:sys_exit_write --filter 'comm == \"aglat\"' --name lat_writes",
    ]);
    // Writes of ours and of another name: the other's ends find no start.
    write_writes("aglat", "200", &["8"]);
    write_writes("aglatother", "300", &["8"]);
    let n = wait_for(20, "200 latencies", || {
        agent
            .metric("bpfscope_lat_writes_seconds_count", None)
            .filter(|v| *v >= 200.0)
    });
    assert_eq!(n, 200.0);
    let text = agent.metric_text(None).unwrap();
    for l in text
        .lines()
        .filter(|l| l.starts_with("bpfscope_agent_metric_lost_events_total"))
    {
        assert!(l.ends_with(" 0"), "{l}");
    }
    let unmatched = value_in(
        &text,
        "bpfscope_agent_metric_unmatched_ends_total{metric=\"bpfscope_lat_writes_seconds\"}",
    )
    .unwrap();
    assert!(
        unmatched >= 300.0,
        "unmatched ends counted apart: {unmatched}"
    );
    // Latency buckets are whole seconds' powers of two, cleanly written.
    for l in text
        .lines()
        .filter(|l| l.starts_with("bpfscope_lat_writes_seconds_bucket"))
    {
        let le = l.split("le=\"").nth(1).unwrap().split('"').next().unwrap();
        assert!(le.len() <= 14 && !le.contains("00000000001"), "{l}");
    }
    let pid = agent.run.pid();
    agent.terminate();
    no_program_of(pid);
}

#[test]
fn http_settings_are_checked() {
    let dir = scratch_dir("agent-http-bad");
    for (body, word) in [
        (
            "[http]\nheader_timeout_seconds = 0\n",
            "header_timeout_seconds",
        ),
        (
            "[http]\nwrite_timeout_seconds = 9999\n",
            "write_timeout_seconds",
        ),
        ("[http]\nmax_profile = 3\n", "max_profile"),
    ] {
        let cfg = dir.join("agent.toml");
        std::fs::write(&cfg, body).unwrap();
        let o = run_timeout(
            &["agent", "--config", cfg.to_str().unwrap()],
            Duration::from_secs(20),
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{body}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{body}: {err}");
        assert!(err.contains(word), "{body}: {err}");
    }
}

/// The BPF links a process holds: (link type, tracepoint name).
fn links_of(pid: i32) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
    {
        let Ok(t) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let field = |k: &str| {
            t.lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_string())
        };
        if let Some(kind) = field("link_type:") {
            out.push((kind, field("tp_name:").unwrap_or_default()));
        }
    }
    out.sort();
    out
}

#[test]
#[ignore = "needs root and BPF"]
fn syscall_metrics_share_one_raw_tracepoint() {
    require_root();
    let _turn = bpf_stats_turn();
    let dir = scratch_dir("agent-dispatch");
    let cfg = dir.join("agent.toml");
    // Five syscall metrics, two of them on the same syscall.
    let mut text = String::from(
        "listen = \"127.0.0.1:0\"\n[profile]\nhz = 0\n[metrics]\ninterval_seconds = 0.3\n",
    );
    for (name, spec) in [
        (
            "ds_w",
            "count t:syscalls:sys_enter_write --filter 'comm == \\\"agds\\\"'",
        ),
        (
            "ds_wc",
            "count t:syscalls:sys_enter_write --by comm --filter 'comm == \\\"agds\\\"'",
        ),
        (
            "ds_size",
            "hist t:syscalls:sys_enter_write --value count --filter 'comm == \\\"agds\\\"'",
        ),
        (
            "ds_ret",
            "stats t:syscalls:sys_exit_write --value ret --filter 'comm == \\\"agds\\\"'",
        ),
        (
            "ds_read",
            "count t:syscalls:sys_enter_read --filter 'comm == \\\"agds\\\"'",
        ),
    ] {
        text.push_str(&format!(
            "[[metric]]\nname = \"{name}\"\nspec = \"{spec}\"\n"
        ));
    }
    std::fs::write(&cfg, text).unwrap();
    let agent = start_agent(&["--config", cfg.to_str().unwrap()]);
    // One raw_tp on each of sys_enter and sys_exit for all of them; the
    // metrics whose syscall another one routes already get classic
    // tracepoints (perf links).
    let links = links_of(agent.run.pid());
    let raw: Vec<&str> = links
        .iter()
        .filter(|l| l.0 == "raw_tracepoint")
        .map(|l| l.1.as_str())
        .collect();
    assert_eq!(raw, ["sys_enter", "sys_exit"], "{links:?}");
    assert_eq!(
        links.iter().filter(|l| l.0 == "perf").count(),
        2,
        "{links:?}"
    );
    write_writes("agds", "700", &["1", "100"]);
    let n = wait_for(20, "1400 writes", || {
        agent
            .metric("bpfscope_ds_w_total", None)
            .filter(|v| *v >= 1400.0)
    });
    assert_eq!(n, 1400.0);
    std::thread::sleep(Duration::from_millis(700));
    let text = agent.metric_text(None).unwrap();
    assert_eq!(
        value_in(&text, "bpfscope_ds_wc_total{comm=\"agds\"}"),
        Some(1400.0)
    );
    assert_eq!(value_in(&text, "bpfscope_ds_size_count"), Some(1400.0));
    assert_eq!(value_in(&text, "bpfscope_ds_size_sum"), Some(70700.0));
    assert_eq!(
        value_in(&text, "bpfscope_ds_ret_events_total"),
        Some(1400.0)
    );
    assert_eq!(value_in(&text, "bpfscope_ds_ret_sum_total"), Some(70700.0));
    assert_eq!(value_in(&text, "bpfscope_ds_ret_min"), Some(1.0));
    assert_eq!(value_in(&text, "bpfscope_ds_ret_max"), Some(100.0));
    let pid = agent.run.pid();
    agent.terminate();
    no_program_of(pid);
}

/// Another tool's classic tracepoint program keeps the sampling program
/// from running while it runs: the agent's second sampler shows its time,
/// as `profile` does.
#[test]
#[ignore = "needs root and BPF"]
fn other_tools_bpf_programs_are_in_the_agents_profiles() {
    require_root();
    let _turn = bpf_stats_turn();
    let agent = start_agent(&["--listen", "127.0.0.1:0", "--profile-hz", "499"]);
    // Programs that come and go before bpftrace's: the JIT reuses their
    // memory, and a program unloaded before the profile's span once took
    // the name of bpftrace's samples at its address.
    for args in [
        &[
            "count",
            "t:syscalls:sys_enter_write",
            "t:syscalls:sys_exit_write",
        ][..],
        &["trace", "t:syscalls:sys_enter_read"][..],
    ] {
        let o = run_env(
            &[args, &["--duration", "0.3"][..]].concat(),
            &[],
            Duration::from_secs(30),
        );
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
    let Some(mut bt) = crate::bpfprof::start_bpftrace_write_count() else {
        return;
    };
    // A write loop nobody here wrote: dd, one byte per write.
    let mut dd = Command::new("dd")
        .args(["if=/dev/zero", "of=/dev/null", "bs=1", "count=100000000"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The agent starts its second sampler once it has seen the load
    // (within a second on a quiet machine; a loaded one ran this test
    // before it had, with a fixed two-second wait): the profile is asked
    // for once that sampler has taken samples in the program.
    wait_for(30, "samples in bpftrace's program", || {
        let text = agent.metric_text_unchecked();
        (value_in(&text, "bpfscope_agent_samples_in_bpf_total")? > 0.0).then_some(())
    });
    let (st, _, body) = agent.get(&format!("/debug/pprof/profile?seconds=3&pid={}", dd.id()));
    let _ = dd.kill();
    let _ = dd.wait();
    stop_bpftrace(&mut bt, Duration::from_secs(30));
    assert_eq!(st, 200, "{}", String::from_utf8_lossy(&body));
    let p = decode_pprof(&body);
    let name = |loc: u64| -> Vec<String> {
        p.location[loc as usize - 1]
            .line
            .iter()
            .map(|l| p.string_table[p.function[l.function_id as usize - 1].name as usize].clone())
            .collect()
    };
    let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    let in_prog: i64 = p
        .sample
        .iter()
        .filter(|s| {
            s.location_id.iter().any(|&l| {
                name(l)
                    .iter()
                    .any(|n| n.starts_with("bpf_prog_") && n.contains("sys_enter_write"))
            })
        })
        .map(|s| s.value[0])
        .sum();
    // What trace_call_bpf called, by name, to tell a program named
    // otherwise from samples lost when this fails.
    let mut callees: std::collections::BTreeMap<String, i64> = Default::default();
    for s in &p.sample {
        let names: Vec<Vec<String>> = s.location_id.iter().map(|&l| name(l)).collect();
        if let Some(i) = names
            .iter()
            .position(|n| n.iter().any(|n| n == "trace_call_bpf"))
        {
            let callee = i
                .checked_sub(1)
                .and_then(|j| names[j].last().cloned())
                .unwrap_or_else(|| "(leaf)".into());
            *callees.entry(callee).or_default() += s.value[0];
        }
    }
    eprintln!(
        "{in_prog} of {total} samples of dd in bpftrace's program over {} ns; called by trace_call_bpf: {callees:?}",
        p.duration_nanos
    );
    assert!(
        in_prog * 50 >= total && in_prog > 0,
        "{in_prog} of {total} samples of dd in bpftrace's program; called by trace_call_bpf: {callees:?}; agent: {}",
        agent
            .metric_text_unchecked()
            .lines()
            .filter(|l| !l.starts_with('#')
                && ["samples_lost", "samples_in_bpf", "not_run", "bpf_events_lost"]
                    .iter()
                    .any(|k| l.contains(k)))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let n = agent
        .metric("bpfscope_agent_samples_in_bpf_total", None)
        .unwrap();
    assert!(n >= in_prog as f64, "{n} counted, {in_prog} in the profile");
    let pid = agent.run.pid();
    agent.terminate();
    no_program_of(pid);
}
