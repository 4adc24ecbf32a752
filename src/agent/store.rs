//! Windows kept on local disk: one gzipped pprof per window, named by its
//! start and end time, trimmed to an age and a total size after each write.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};

use super::config::StorageConfig;

const PREFIX: &str = "profile-";
const SUFFIX: &str = ".pb.gz";

/// Writes a window (atomically: a reader never sees half a file) and
/// trims the directory. Returns the file written.
pub fn keep(cfg: &StorageConfig, start_ns: u64, end_ns: u64, pprof: &[u8]) -> Result<PathBuf> {
    std::fs::create_dir_all(&cfg.dir)
        .with_context(|| format!("creating the profile directory {}", cfg.dir.display()))?;
    let name = format!(
        "{PREFIX}{}-{}{SUFFIX}",
        start_ns / 1_000_000,
        end_ns / 1_000_000
    );
    let path = cfg.dir.join(&name);
    let tmp = cfg.dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, pprof).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("renaming to {}", path.display()))?;
    trim(&cfg.dir, cfg.max_bytes, cfg.max_age, SystemTime::now())?;
    Ok(path)
}

/// Deletes windows older than `max_age`, then the oldest until the rest
/// fit in `max_bytes` (the newest is always kept).
pub fn trim(dir: &Path, max_bytes: u64, max_age: Duration, now: SystemTime) -> Result<()> {
    let mut files: Vec<(String, u64, SystemTime)> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            // A write that failed half-way leaves its temporary file.
            if name.starts_with(&format!(".{PREFIX}")) && name.ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
                return None;
            }
            if !(name.starts_with(PREFIX) && name.ends_with(SUFFIX)) {
                return None;
            }
            let md = e.metadata().ok()?;
            Some((name, md.len(), md.modified().ok()?))
        })
        .collect();
    // Names carry the start time in ms: sorting them sorts by age.
    files.sort_by_key(|f| window_start(&f.0));
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    let n = files.len();
    for (i, (name, len, mtime)) in files.into_iter().enumerate() {
        let old = now.duration_since(mtime).is_ok_and(|a| a > max_age);
        if i + 1 < n && (old || total > max_bytes) {
            // Already gone (another trim) is fine.
            let _ = std::fs::remove_file(dir.join(&name));
            total = total.saturating_sub(len);
        }
    }
    Ok(())
}

fn window_start(name: &str) -> u64 {
    name.strip_prefix(PREFIX)
        .and_then(|r| r.split('-').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_by_size_keeping_the_newest() {
        let dir = std::env::temp_dir().join(format!("bpfscope-store-{}", std::process::id()));
        let cfg = StorageConfig {
            dir: dir.clone(),
            max_bytes: 250,
            max_age: Duration::from_secs(3600),
        };
        for i in 0..5u64 {
            keep(
                &cfg,
                i * 1_000_000_000 * 100,
                (i * 100 + 60) * 1_000_000_000,
                &[0u8; 100],
            )
            .unwrap();
        }
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort_by_key(|n| window_start(n));
        assert_eq!(
            names,
            ["profile-300000-360000.pb.gz", "profile-400000-460000.pb.gz"]
        );
        trim(
            &dir,
            1 << 20,
            Duration::from_secs(1),
            SystemTime::now() + Duration::from_secs(10),
        )
        .unwrap();
        let left = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(left, 1, "the newest stays");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
