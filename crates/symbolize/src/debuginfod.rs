//! A debuginfod client: GET URL/buildid/HEX/debuginfo, kept in a local
//! cache ($XDG_CACHE_HOME/bpfscope/debuginfod, else ~/.cache/...) so each
//! debug file is fetched once per machine.
//!
//! Servers are not trusted to behave: a server that stops answering times
//! out (`DEBUGINFOD_TIMEOUT` seconds without progress, the elfutils
//! variable), bodies are streamed to disk under a size cap
//! (`DEBUGINFOD_MAXSIZE` bytes, also elfutils'), and only a complete ELF
//! file with the requested build id is ever cached.

use std::collections::HashSet;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::elf;

/// Default cap on one debug file: above the debug files of most programs,
/// low enough that a runaway server cannot fill the disk or take minutes
/// (DEBUGINFOD_MAXSIZE raises it for the few larger ones).
const DEFAULT_MAX_BYTES: u64 = 512 << 20;

/// Default seconds without progress (connecting, waiting for the response,
/// each read of the body) before a server is given up.
const DEFAULT_TIMEOUT_SECS: u64 = 10;

/// Why one download failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("HTTP {0}")]
    Status(u16),
    #[error("no answer within {0} s (DEBUGINFOD_TIMEOUT)")]
    Timeout(u64),
    #[error("the debug file is larger than {0} bytes (DEBUGINFOD_MAXSIZE)")]
    TooLarge(u64),
    #[error("the server sent something that is not an ELF file")]
    NotElf,
    #[error("the server sent an ELF file with build id {0}")]
    WrongBuildId(String),
    #[error("{0}")]
    Http(ureq::Error),
    #[error("caching: {0}")]
    Io(#[from] io::Error),
}

impl FetchError {
    /// Not found is the normal answer for a binary the server does not
    /// know; everything else is worth telling without -v.
    fn is_problem(&self) -> bool {
        !matches!(self, FetchError::Status(404))
    }

    /// The server cannot answer at all: not worth asking it again this run.
    fn server_down(&self) -> bool {
        matches!(self, FetchError::Timeout(_))
            || matches!(
                self,
                FetchError::Http(ureq::Error::ConnectionFailed | ureq::Error::HostNotFound)
            )
            || matches!(self, FetchError::Http(ureq::Error::Io(e))
                if e.kind() == io::ErrorKind::ConnectionRefused)
    }
}

pub struct Debuginfod {
    urls: Vec<String>,
    cache: PathBuf,
    agent: ureq::Agent,
    timeout_secs: u64,
    max_bytes: u64,
    /// Servers that timed out or refused connections: skipped from then on.
    down: HashSet<String>,
    /// What was tried and failed, for -v.
    pub log: Vec<String>,
    /// The first failure of each server other than "not found", said once
    /// without -v.
    pub problems: Vec<String>,
    problem_servers: HashSet<String>,
}

pub fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"));
    base.join("bpfscope").join("debuginfod")
}

/// A positive integer from the environment, else the default.
fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

impl Debuginfod {
    pub fn new(urls: Vec<String>) -> Debuginfod {
        let timeout_secs = env_u64("DEBUGINFOD_TIMEOUT", DEFAULT_TIMEOUT_SECS);
        let max_bytes = env_u64("DEBUGINFOD_MAXSIZE", DEFAULT_MAX_BYTES);
        let t = Some(Duration::from_secs(timeout_secs));
        // No total bound on the body: a large file over a slow link is fine
        // as long as it keeps coming (per-read timeout) and stays under the cap.
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_resolve(t)
            .timeout_connect(t)
            .timeout_send_request(t)
            .timeout_recv_response(t)
            .timeout_per_read(t)
            .http_status_as_error(false)
            .build()
            .into();
        Debuginfod {
            urls,
            cache: cache_dir(),
            agent,
            timeout_secs,
            max_bytes,
            down: HashSet::new(),
            log: Vec::new(),
            problems: Vec::new(),
            problem_servers: HashSet::new(),
        }
    }

    /// The cached or downloaded debug file for a build id.
    pub fn debuginfo(&mut self, build_id: &[u8]) -> Option<PathBuf> {
        let hex = bpfscope_sys::buildid::hex(build_id);
        let path = self.cache.join(&hex).join("debuginfo");
        if path.is_file() {
            return Some(path);
        }
        let urls = self.urls.clone();
        for url in urls {
            if self.down.contains(&url) {
                continue;
            }
            let full = format!("{}/buildid/{hex}/debuginfo", url.trim_end_matches('/'));
            match self.fetch(&full, build_id, &path) {
                Ok(()) => return Some(path),
                Err(e) => {
                    self.log.push(format!("{full}: {e}"));
                    if e.is_problem() && self.problem_servers.insert(url.clone()) {
                        self.problems
                            .push(format!("debuginfod {url}: {e} ({full})"));
                    }
                    if e.server_down() {
                        self.down.insert(url);
                    }
                }
            }
        }
        None
    }

    fn fetch(&self, url: &str, build_id: &[u8], dest: &Path) -> Result<(), FetchError> {
        let mut resp = self.agent.get(url).call().map_err(|e| self.http(e))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(FetchError::Status(status.as_u16()));
        }
        // A declared length over the cap is refused before reading anything.
        if resp
            .body()
            .content_length()
            .is_some_and(|n| n > self.max_bytes)
        {
            return Err(FetchError::TooLarge(self.max_bytes));
        }
        let dir = dest.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        // Download beside the final name, then rename: a cut transfer never
        // leaves a file that looks cached. The guard removes it on any error.
        let mut tmp = TempPath {
            path: dir.join(format!(".debuginfo.tmp.{}", std::process::id())),
            keep: false,
        };
        let mut f = std::fs::File::create(&tmp.path)?;
        // Streamed: the body is never held in memory, and the limit turns
        // one byte too many into an error rather than a truncated file.
        let mut body = resp.body_mut().with_config().limit(self.max_bytes).reader();
        io::copy(&mut body, &mut f).map_err(|e| self.read_error(e))?;
        f.flush()?;
        drop(f);
        match elf::inspect(&tmp.path) {
            Err(elf::ElfError::Parse(..)) => return Err(FetchError::NotElf),
            Err(elf::ElfError::Io(_, e)) => return Err(FetchError::Io(e)),
            Ok(info) => match info.build_id {
                Some(b) if b == build_id => {}
                other => {
                    return Err(FetchError::WrongBuildId(other.map_or_else(
                        || "none".to_string(),
                        |b| bpfscope_sys::buildid::hex(&b),
                    )))
                }
            },
        }
        std::fs::rename(&tmp.path, dest)?;
        tmp.keep = true;
        Ok(())
    }

    fn http(&self, e: ureq::Error) -> FetchError {
        match e {
            ureq::Error::Timeout(_) => FetchError::Timeout(self.timeout_secs),
            ureq::Error::BodyExceedsLimit(_) => FetchError::TooLarge(self.max_bytes),
            ureq::Error::Io(e) => self.read_error(e),
            e => FetchError::Http(e),
        }
    }

    /// Errors while reading the body come back as io::Error wrapping ureq's.
    fn read_error(&self, e: io::Error) -> FetchError {
        if e.kind() == io::ErrorKind::TimedOut {
            return FetchError::Timeout(self.timeout_secs);
        }
        match e.downcast::<ureq::Error>() {
            Ok(u) => self.http(u),
            Err(e) => FetchError::Io(e),
        }
    }
}

/// A temporary download, removed unless it was renamed into the cache.
struct TempPath {
    path: PathBuf,
    keep: bool,
}

impl Drop for TempPath {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
