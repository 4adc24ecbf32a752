//! A debuginfod client: GET URL/buildid/HEX/debuginfo, kept in a local
//! cache ($XDG_CACHE_HOME/bpfscope/debuginfod, else ~/.cache/...) so each
//! debug file is fetched once per machine.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::symbolize::elf;

/// Debug files can be large; anything beyond this is refused.
const MAX_BYTES: u64 = 4 << 30;

pub struct Debuginfod {
    urls: Vec<String>,
    cache: PathBuf,
    agent: ureq::Agent,
    /// What was tried and failed, for -v.
    pub log: Vec<String>,
}

pub fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"));
    base.join("bpfscope").join("debuginfod")
}

impl Debuginfod {
    pub fn new(urls: Vec<String>) -> Debuginfod {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_connect(Some(Duration::from_secs(3)))
            .timeout_global(Some(Duration::from_secs(120)))
            .http_status_as_error(false)
            .build()
            .into();
        Debuginfod {
            urls,
            cache: cache_dir(),
            agent,
            log: Vec::new(),
        }
    }

    /// The cached or downloaded debug file for a build id.
    pub fn debuginfo(&mut self, build_id: &[u8]) -> Option<PathBuf> {
        let hex = elf::hex(build_id);
        let path = self.cache.join(&hex).join("debuginfo");
        if path.is_file() {
            return Some(path);
        }
        let urls = self.urls.clone();
        for url in urls {
            let full = format!("{}/buildid/{hex}/debuginfo", url.trim_end_matches('/'));
            match self.fetch(&full, &path) {
                Ok(()) => return Some(path),
                Err(e) => self.log.push(format!("{full}: {e}")),
            }
        }
        None
    }

    fn fetch(&self, url: &str, dest: &Path) -> io::Result<()> {
        let mut resp = self.agent.get(url).call().map_err(io::Error::other)?;
        let status = resp.status();
        if !status.is_success() {
            return Err(io::Error::other(format!("HTTP {}", status.as_u16())));
        }
        let dir = dest.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        // Download beside the final name, then rename: a cut transfer never
        // leaves a file that looks cached.
        let tmp = dir.join(format!(".debuginfo.tmp.{}", std::process::id()));
        let result = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            let mut body = resp
                .body_mut()
                .with_config()
                .limit(MAX_BYTES)
                .reader()
                .take(MAX_BYTES);
            io::copy(&mut body, &mut f)?;
            f.flush()?;
            std::fs::rename(&tmp, dest)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}
