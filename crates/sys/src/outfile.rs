//! Output files created before a run and filled after it: a bad path
//! (a directory, a read-only place, a missing folder) fails before
//! anything is attached, and the final name only ever holds a whole file.
//!
//! The data goes to an unnamed file (O_TMPFILE) that is linked into the
//! directory when complete, so even a SIGKILL leaves no temporary file
//! behind; on filesystems without O_TMPFILE (9p, some network filesystems)
//! a named temporary file is created, written and renamed at the end only.
//! A symlink is followed (its target is replaced, the link stays), and a
//! FIFO or device (`/dev/stdout`) is written directly at the end.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A reserved output file: checked now, given its contents and name by
/// [`commit`](PendingFile::commit).
#[derive(Debug)]
pub struct PendingFile {
    /// The name the user gave (for messages).
    path: PathBuf,
    /// Where the file really goes (a symlink's target).
    real: PathBuf,
    how: How,
}

#[derive(Debug)]
enum How {
    /// An unnamed file in the target's directory, linked in at commit.
    Unnamed(File),
    /// No O_TMPFILE on this filesystem: a named temporary file written and
    /// renamed at commit (created only then, so a killed run leaves none).
    Renamed,
    /// A FIFO or device (`-o /dev/stdout`): opened and written at commit.
    Direct,
}

/// Why an output path cannot be used, in one line with the fix.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {}: {reason}", path.display())]
pub struct OutputError {
    pub path: PathBuf,
    pub reason: String,
}

impl PendingFile {
    /// Checks that `path` can be written, reserving a file for it.
    pub fn reserve(path: &Path) -> Result<PendingFile, OutputError> {
        let fail = |reason: String| OutputError {
            path: path.to_path_buf(),
            reason,
        };
        if path.is_dir() {
            return Err(fail("it is a directory; give a file name".into()));
        }
        let pending = |real: PathBuf, how: How| PendingFile {
            path: path.to_path_buf(),
            real,
            how,
        };
        // A FIFO or a device cannot be replaced by a rename.
        if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
            return Ok(pending(path.to_path_buf(), How::Direct));
        }
        let real = resolve_links(path);
        let dir = parent(&real);
        if !dir.is_dir() {
            return Err(fail(format!(
                "the directory {} does not exist; create it first",
                dir.display()
            )));
        }
        let explain = |e: io::Error| {
            let hint = match e.raw_os_error() {
                Some(libc::EACCES) | Some(libc::EPERM) => {
                    "no permission to write there; choose another path"
                }
                Some(libc::EROFS) => "the filesystem is read-only; choose another path",
                Some(libc::ENOSPC) | Some(libc::EDQUOT) => "no space left; free some first",
                _ => "choose another path",
            };
            fail(format!("{e} ({hint})"))
        };
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            // The umask decides, as for any file the user's shell creates.
            .mode(0o666)
            .open(&dir)
        {
            Ok(file) => Ok(pending(real, How::Unnamed(file))),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL)
                ) =>
            {
                // Commit will create a file next to the target: ask whether
                // that may be done (permissions, a read-only filesystem)
                // without creating one, which a SIGKILL could leave behind.
                writable_dir(&dir).map_err(explain)?;
                Ok(pending(real, How::Renamed))
            }
            Err(e) => Err(explain(e)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `bytes` and gives the file its name (replacing an older file).
    pub fn commit(self, bytes: &[u8]) -> io::Result<()> {
        let tmp = temp_name(&self.real, "tmp");
        match self.how {
            How::Direct => std::fs::OpenOptions::new()
                .write(true)
                .open(&self.real)?
                .write_all(bytes),
            How::Renamed => {
                let _ = std::fs::remove_file(&tmp);
                let written = create_new(&tmp).and_then(|mut f| {
                    f.write_all(bytes)?;
                    f.sync_all()
                });
                let r = written.and_then(|()| std::fs::rename(&tmp, &self.real));
                if r.is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
                r
            }
            How::Unnamed(mut file) => {
                file.write_all(bytes)?;
                file.sync_all()?;
                // linkat cannot replace a file: link under a temporary name, then rename over.
                let _ = std::fs::remove_file(&tmp);
                let src = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
                    .map_err(io::Error::other)?;
                let dst = CString::new(tmp.as_os_str().as_bytes()).map_err(io::Error::other)?;
                // SAFETY: both paths are valid NUL-terminated strings; linkat
                // only reads them. AT_SYMLINK_FOLLOW resolves the /proc magic
                // link to the unnamed file.
                let rc = unsafe {
                    libc::linkat(
                        libc::AT_FDCWD,
                        src.as_ptr(),
                        libc::AT_FDCWD,
                        dst.as_ptr(),
                        libc::AT_SYMLINK_FOLLOW,
                    )
                };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
                let r = std::fs::rename(&tmp, &self.real);
                if r.is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
                r
            }
        }
    }
}

fn parent(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `.NAME.WHAT.PID` next to `path`.
fn temp_name(path: &Path, what: &str) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    parent(path).join(format!(".{name}.{what}.{}", std::process::id()))
}

/// A new file that must not exist yet: never follows or truncates anything.
fn create_new(p: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o666)
        .open(p)
}

/// Follows symlinks (up to a bound) to the path a write really replaces,
/// so that a link keeps pointing at the new file.
fn resolve_links(path: &Path) -> PathBuf {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::read_link(&p) {
            Ok(target) => {
                p = match p.parent() {
                    Some(d) if target.is_relative() => d.join(target),
                    _ => target,
                };
            }
            Err(_) => break,
        }
    }
    p
}

/// Whether files may be created in `dir` (search and write permission, a
/// filesystem mounted read-write), as the effective user.
fn writable_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: c is a valid NUL-terminated path; faccessat reads it only.
    let r = unsafe {
        libc::faccessat(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::W_OK | libc::X_OK,
            libc::AT_EACCESS,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_refused_before_any_write() {
        let d = std::env::temp_dir();
        let e = PendingFile::reserve(&d).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
    }

    #[test]
    fn missing_directory_refused() {
        let p = Path::new("/nonexistent-bpfscope-dir/x.svg");
        let e = PendingFile::reserve(p).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
    }

    #[test]
    fn commit_makes_the_whole_file_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("bpfscope-outfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("out.txt");
        std::fs::write(&p, b"old").unwrap();
        let f = PendingFile::reserve(&p).unwrap();
        // Nothing visible before commit: the old file is untouched.
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        f.commit(b"new contents").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new contents");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // Dropped without commit: no file appears.
        let q = dir.join("never.txt");
        drop(PendingFile::reserve(&q).unwrap());
        assert!(!q.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_symlink_keeps_pointing_at_the_new_file() {
        let dir = std::env::temp_dir().join(format!("bpfscope-outlink-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let real = dir.join("real.txt");
        let link = dir.join("link.txt");
        std::fs::write(&real, b"old").unwrap();
        std::os::unix::fs::symlink("real.txt", &link).unwrap();
        PendingFile::reserve(&link).unwrap().commit(b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&real).unwrap(), b"new");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
