//! Pushing finished windows to a Pyroscope-compatible ingest endpoint, on
//! a thread of its own behind a bounded queue: a slow or dead store costs
//! the agent nothing but that queue, and what does not fit, or keeps
//! failing, is dropped and counted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::config::PushConfig;

/// Attempts per window before it is dropped.
const ATTEMPTS: u32 = 5;
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A window's profile, ready to send.
pub struct Window {
    pub pprof: Arc<Vec<u8>>,
    pub start_ns: u64,
    pub end_ns: u64,
}

#[derive(Debug, Default)]
pub struct PushStats {
    pub sent: AtomicU64,
    /// Attempts that failed (each retried one counts).
    pub failed: AtomicU64,
    /// Windows given up: queue full, refused, out of attempts, or still
    /// queued at exit.
    pub dropped: AtomicU64,
}

pub struct Pusher {
    tx: Option<SyncSender<Window>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Pusher {
    pub fn start(cfg: PushConfig, hz: u64, host: String, stats: Arc<PushStats>) -> Pusher {
        let (tx, rx) = sync_channel(cfg.queue);
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let c = cfg;
        let thread = std::thread::Builder::new()
            .name("bpfscope-push".into())
            .spawn(move || send_loop(c, hz, host, rx, s, stats))
            .ok();
        Pusher {
            tx: Some(tx),
            stop,
            thread,
        }
    }

    /// Queues a window; a full queue drops it (counted): never blocks.
    pub fn offer(&self, w: Window, stats: &PushStats) {
        let Some(tx) = &self.tx else {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        match tx.try_send(w) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Sends what is queued within `grace`, then gives up on the rest.
    pub fn stop(mut self, grace: Duration) {
        self.tx = None;
        let deadline = Instant::now() + grace;
        if let Some(t) = self.thread.take() {
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            self.stop.store(true, Ordering::SeqCst);
            let _ = t.join();
        }
    }
}

impl Drop for Pusher {
    fn drop(&mut self) {
        self.tx = None;
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn send_loop(
    cfg: PushConfig,
    hz: u64,
    host: String,
    rx: Receiver<Window>,
    stop: Arc<AtomicBool>,
    stats: Arc<PushStats>,
) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(cfg.timeout))
        .http_status_as_error(false)
        .user_agent(concat!("bpfscope/", env!("CARGO_PKG_VERSION")))
        .build()
        .into();
    let name = series_name(&cfg, &host);
    loop {
        if stop.load(Ordering::SeqCst) {
            // Stopping: what is still queued is given up, not sent one by one.
            drain(&rx, &stats);
            return;
        }
        let w = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(w) => w,
            Err(RecvTimeoutError::Timeout) => {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
        // Whole seconds, both rounded down: consecutive windows meet
        // without overlapping.
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("name", &name)
            .append_pair("from", &(w.start_ns / 1_000_000_000).to_string())
            .append_pair("until", &(w.end_ns / 1_000_000_000).to_string())
            .append_pair("format", "pprof")
            .append_pair("sampleRate", &hz.to_string())
            .append_pair("spyName", "bpfscope")
            .finish();
        let url = format!("{}/ingest?{query}", cfg.url);
        let mut backoff = FIRST_BACKOFF;
        let mut done = false;
        for attempt in 1..=ATTEMPTS {
            match send(&agent, &cfg, &url, &w.pprof) {
                Outcome::Sent => {
                    stats.sent.fetch_add(1, Ordering::Relaxed);
                    done = true;
                    break;
                }
                Outcome::Refused(code) => {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                    eprintln!(
                        "bpfscope: push: the store refused a window with HTTP {code}; dropped"
                    );
                    break;
                }
                Outcome::Retry(why) => {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                    if attempt == ATTEMPTS {
                        eprintln!(
                            "bpfscope: push: {why}; window dropped after {ATTEMPTS} attempts"
                        );
                        break;
                    }
                }
            }
            // Sleep in slices so that a stop is not held up by a backoff.
            let until = Instant::now() + backoff;
            while Instant::now() < until {
                if stop.load(Ordering::SeqCst) {
                    stats.dropped.fetch_add(1, Ordering::Relaxed);
                    drain(&rx, &stats);
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        if !done {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn drain(rx: &Receiver<Window>, stats: &PushStats) {
    while rx.try_recv().is_ok() {
        stats.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

enum Outcome {
    Sent,
    Refused(u16),
    Retry(String),
}

fn send(agent: &ureq::Agent, cfg: &PushConfig, url: &str, body: &[u8]) -> Outcome {
    let mut req = agent
        .post(url)
        .header("Content-Type", "application/octet-stream");
    if let Some(t) = &cfg.token {
        req = req.header("Authorization", &format!("Bearer {t}"));
    }
    if let Some(t) = &cfg.tenant {
        req = req.header("X-Scope-OrgID", t);
    }
    match req.send(body) {
        Ok(resp) => {
            let code = resp.status().as_u16();
            match code {
                200..=299 => Outcome::Sent,
                // Worth another try: the store is busy or briefly away.
                408 | 429 | 500..=599 => Outcome::Retry(format!("HTTP {code}")),
                _ => Outcome::Refused(code),
            }
        }
        Err(e) => Outcome::Retry(e.to_string()),
    }
}

/// `app{hostname=...,k=v}`, as Pyroscope's ingest parses it (no escaping:
/// the config refuses values with its separators).
fn series_name(cfg: &PushConfig, host: &str) -> String {
    let host: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut tags = vec![format!("hostname={host}")];
    tags.extend(cfg.labels.iter().map(|(k, v)| format!("{k}={v}")));
    format!("{}{{{}}}", cfg.app, tags.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_encoding() {
        let cfg = PushConfig {
            url: "http://x".into(),
            app: "bpfscope".into(),
            labels: [("env".to_string(), "prod".to_string())]
                .into_iter()
                .collect(),
            token: None,
            tenant: None,
            queue: 1,
            timeout: Duration::from_secs(1),
        };
        let n = series_name(&cfg, "web 1");
        assert_eq!(n, "bpfscope{hostname=web_1,env=prod}");
    }
}
