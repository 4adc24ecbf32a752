//! tracefs: where tracepoints are listed and their record formats described.

use std::ffi::{CStr, CString};
use std::fs;
use std::path::{Path, PathBuf};

use crate::error::Error;

const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// The tracefs mount point, mounting tracefs at /sys/kernel/tracing if it is missing.
pub fn root() -> Result<PathBuf, Error> {
    for dir in [TRACEFS, DEBUGFS_TRACING] {
        if Path::new(dir).join("available_events").exists() {
            return Ok(PathBuf::from(dir));
        }
    }
    mount_tracefs()?;
    Ok(PathBuf::from(TRACEFS))
}

/// Mounts one of the kernel's pseudo filesystems (tracefs, securityfs).
pub fn mount_fs(src: &CStr, target: &CStr, fstype: &CStr) -> std::io::Result<()> {
    // SAFETY: all pointers are valid NUL-terminated strings for the call's duration; data is null.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn mount_tracefs() -> Result<(), Error> {
    let target = CString::new(TRACEFS).map_err(|_| Error::Environment("bad path".into()))?;
    if let Err(err) = mount_fs(c"tracefs", &target, c"tracefs") {
        return Err(Error::Environment(format!(
            "tracefs is not mounted and mounting it at {TRACEFS} failed ({err}): run bpfscope as root, or mount it with 'mount -t tracefs tracefs {TRACEFS}'"
        )));
    }
    Ok(())
}

/// All tracepoints as (subsystem, event).
pub fn events(root: &Path) -> Result<Vec<(String, String)>, Error> {
    let path = root.join("available_events");
    let text = fs::read_to_string(&path).map_err(|e| {
        Error::Environment(format!(
            "cannot read {}: {e} (bpfscope needs root)",
            path.display()
        ))
    })?;
    let mut v: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(s, e)| (s.to_string(), e.to_string()))
        .collect();
    v.sort();
    v.dedup();
    Ok(v)
}

/// One `field:` line of a format file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawField {
    /// The C declaration without the name, e.g. `const char *` or `__data_loc char[]`.
    pub ctype: String,
    pub name: String,
    /// Array length for `type name[N]`.
    pub array_len: Option<u32>,
    pub offset: u16,
    pub size: u16,
    pub signed: bool,
}

/// Reads and parses events/SUBSYS/EVENT/format.
pub fn format(root: &Path, subsys: &str, event: &str) -> Result<Vec<RawField>, Error> {
    let path = root.join("events").join(subsys).join(event).join("format");
    let text = fs::read_to_string(&path)
        .map_err(|e| Error::Environment(format!("cannot read {}: {e}", path.display())))?;
    Ok(parse_format(&text))
}

/// Parses the field lines of a format file; lines it does not understand are skipped.
pub fn parse_format(text: &str) -> Vec<RawField> {
    text.lines().filter_map(parse_field_line).collect()
}

fn parse_field_line(line: &str) -> Option<RawField> {
    let line = line.trim().strip_prefix("field:")?;
    let mut decl = None;
    let (mut offset, mut size, mut signed) = (None, None, false);
    for part in line.split(';') {
        let part = part.trim();
        if let Some(v) = part.strip_prefix("offset:") {
            offset = v.parse().ok();
        } else if let Some(v) = part.strip_prefix("size:") {
            size = v.parse().ok();
        } else if let Some(v) = part.strip_prefix("signed:") {
            signed = v == "1";
        } else if decl.is_none() && !part.is_empty() {
            decl = Some(part);
        }
    }
    let decl = decl?;
    // The name is the last identifier; an array suffix follows it.
    let (head, array_len) = match decl.strip_suffix(']') {
        Some(d) => {
            let open = d.rfind('[')?;
            (&d[..open], d[open + 1..].parse().ok())
        }
        None => (decl, None),
    };
    let name_start = head
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    let name = head[name_start..].to_string();
    let ctype = head[..name_start].trim().to_string();
    if name.is_empty() {
        return None;
    }
    Some(RawField {
        ctype,
        name,
        array_len,
        offset: offset?,
        size: size?,
        signed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHED_SWITCH: &str = "name: sched_switch
ID: 372
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;
\tfield:__data_loc char[] name;\toffset:64;\tsize:4;\tsigned:0;
\tfield:const char * filename;\toffset:24;\tsize:8;\tsigned:0;

print fmt: \"prev_comm=%s\", REC->prev_comm
";

    #[test]
    fn parses_fields() {
        let f = parse_format(SCHED_SWITCH);
        assert_eq!(f.len(), 6);
        assert_eq!(f[2].name, "prev_comm");
        assert_eq!(f[2].ctype, "char");
        assert_eq!(f[2].array_len, Some(16));
        assert_eq!((f[3].offset, f[3].size, f[3].signed), (32, 8, true));
        assert_eq!(f[4].name, "name");
        assert_eq!(f[4].ctype, "__data_loc char[]");
        assert_eq!(f[5].ctype, "const char *");
        assert_eq!(f[5].name, "filename");
    }
}
