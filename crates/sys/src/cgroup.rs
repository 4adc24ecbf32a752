//! cgroup v2: where it is mounted, and ids (what bpf_get_current_cgroup_id
//! returns: a directory's inode number) to paths and back.

use std::collections::HashMap;
use std::fs;
use std::io;
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

/// Why a path names no cgroup.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup2 file system is mounted")]
    NotMounted,
    #[error("{0}: {1}")]
    Io(PathBuf, io::Error),
    #[error("{0}: not a cgroup directory")]
    NotADirectory(PathBuf),
}

/// A cgroup's id (its directory's inode) and depth below the root. The
/// path is absolute under the mount point or relative to it.
pub fn id_of(path: &Path) -> Result<(u64, u32), CgroupError> {
    let root = cgroup2_root().ok_or(CgroupError::NotMounted)?;
    let full = if path.is_absolute() && path.starts_with(&root) {
        path.to_path_buf()
    } else {
        root.join(path.strip_prefix("/").unwrap_or(path))
    };
    let md = fs::metadata(&full).map_err(|e| CgroupError::Io(full.clone(), e))?;
    if !md.is_dir() {
        return Err(CgroupError::NotADirectory(full));
    }
    let level = full
        .strip_prefix(&root)
        .map(|r| r.components().count() as u32)
        .unwrap_or(0);
    Ok((md.ino(), level))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_cgroup_round_trips() {
        let Some(root) = cgroup2_root() else {
            eprintln!("SKIP: no cgroup2 mounted");
            return;
        };
        let (id, level) = id_of(Path::new("/")).unwrap();
        assert_eq!(level, 0);
        assert_eq!(id_paths().get(&id).map(String::as_str), Some("/"));
        assert!(matches!(
            id_of(Path::new("/no-such-cgroup-bpfscope")),
            Err(CgroupError::Io(..))
        ));
        assert!(root.is_absolute());
    }
}
