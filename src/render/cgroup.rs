//! cgroup v2 ids (what bpf_get_current_cgroup_id returns) to paths.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The cgroup2 mount point, from /proc/self/mountinfo.
pub fn cgroup2_root() -> Option<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if post.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        pre.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// Maps every cgroup's id (its directory's inode number) to its path.
pub fn id_paths() -> HashMap<u64, String> {
    let mut out = HashMap::new();
    let Some(root) = cgroup2_root() else {
        return out;
    };
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        if let Ok(md) = fs::metadata(&dir) {
            out.insert(md.ino(), rel(&root, &dir));
        }
        if let Ok(rd) = fs::read_dir(&dir) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }
    out
}

fn rel(root: &Path, dir: &Path) -> String {
    match dir.strip_prefix(root) {
        Ok(r) if r.as_os_str().is_empty() => "/".into(),
        Ok(r) => format!("/{}", r.display()),
        Err(_) => dir.display().to_string(),
    }
}
