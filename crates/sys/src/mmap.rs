//! Memory mappings of descriptors, unmapped on drop: a shared, writable
//! window on part of a BPF array created with BPF_F_MMAPABLE (writing
//! through it costs a page fault per page, where a batched map update costs
//! a copy and a map update per element, 40 times more for an unwind table
//! here), a private executable view of a whole file, and a private
//! read-only one.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Bytes `[offset, offset + len)` of a descriptor's memory, mapped.
#[derive(Debug)]
pub struct Mapping {
    addr: *mut libc::c_void,
    map_len: usize,
    /// Where `offset` is, past the page boundary the mapping starts at.
    skip: usize,
    len: usize,
}

impl Mapping {
    /// The pages holding `[offset, offset + len)`, shared, readable and
    /// writable; `len` must be > 0.
    pub fn shared_window(fd: BorrowedFd<'_>, offset: usize, len: usize) -> io::Result<Mapping> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        Mapping::new(fd, offset, len, prot, libc::MAP_SHARED)
    }

    /// The first `len` bytes of a file, private, readable and executable:
    /// the kernel sees this process map it (uprobes check instructions in
    /// every process mapping a file); nothing here reads or runs it.
    pub fn exec_view(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mapping> {
        let prot = libc::PROT_READ | libc::PROT_EXEC;
        Mapping::new(fd, 0, len, prot, libc::MAP_PRIVATE)
    }

    /// The first `len` bytes of a file, private and read-only: pages are
    /// read as they are touched and count in the resident set only while
    /// mapped (a reader of a few tables of a large file never holds it all).
    pub fn read_only(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mapping> {
        Mapping::new(fd, 0, len, libc::PROT_READ, libc::MAP_PRIVATE)
    }

    /// The bytes asked for.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is map_len >= skip + len bytes, alive as long
        // as self; a shared borrow of self allows no write through it.
        unsafe { std::slice::from_raw_parts(self.addr.cast::<u8>().add(self.skip), self.len) }
    }

    fn new(
        fd: BorrowedFd<'_>,
        offset: usize,
        len: usize,
        prot: libc::c_int,
        flags: libc::c_int,
    ) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an empty mapping",
            ));
        }
        let page = page_size();
        let start = offset - offset % page;
        let skip = offset - start;
        let map_len = (skip + len).div_ceil(page) * page;
        let file_off = libc::off_t::try_from(start)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset out of range"))?;
        // SAFETY: a new mapping at an address the kernel picks; only this
        // value refers to it, and Drop unmaps exactly this range.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                prot,
                flags,
                fd.as_raw_fd(),
                file_off,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            addr,
            map_len,
            skip,
            len,
        })
    }

    /// The bytes asked for, of a mapping made writable (`shared_window`).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is map_len >= skip + len bytes, alive as long
        // as self and borrowed mutably through it only; callers write only
        // to writable mappings (an exec view is never written). The kernel
        // side reads a window's bytes only once user space publishes them.
        unsafe { std::slice::from_raw_parts_mut(self.addr.cast::<u8>().add(self.skip), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: addr/map_len are the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.addr, self.map_len) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::fd::AsFd;

    /// A window that starts mid-page writes exactly its bytes, through to
    /// the file behind it.
    #[test]
    fn writes_land_at_the_offset() {
        let mut f = tempfile_in_tmp();
        f.write_all(&vec![0u8; 3 * 4096]).unwrap();
        {
            let mut w = Mapping::shared_window(f.as_fd(), 4096 + 10, 5000).unwrap();
            let b = w.bytes_mut();
            assert_eq!(b.len(), 5000);
            b.fill(7);
        }
        let mut all = Vec::new();
        f.seek(SeekFrom::Start(0)).unwrap();
        f.read_to_end(&mut all).unwrap();
        assert!(all[..4096 + 10].iter().all(|&b| b == 0));
        assert!(all[4096 + 10..4096 + 5010].iter().all(|&b| b == 7));
        assert!(all[4096 + 5010..].iter().all(|&b| b == 0));
        assert!(Mapping::shared_window(f.as_fd(), 0, 0).is_err());
    }

    /// An executable view shows in this process's mappings, and goes on drop.
    #[test]
    fn exec_view_is_mapped_while_it_lives() {
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        let len = f.metadata().unwrap().len() as usize;
        let v = Mapping::exec_view(f.as_fd(), len).unwrap();
        let line = format!("{:x}-", v.addr as usize);
        let mapped = || {
            std::fs::read_to_string("/proc/self/maps")
                .unwrap()
                .lines()
                .any(|l| l.starts_with(&line) && l.split_whitespace().nth(1) == Some("r-xp"))
        };
        assert!(mapped());
        drop(v);
        assert!(!mapped());
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let path = std::env::temp_dir().join(format!("bpfscope-mmap-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let _ = std::fs::remove_file(&path);
        f
    }
}
