//! Decoding per-event records from the ring buffer.

use bpfscope_bpf::abi::bs_event_hdr;
use bpfscope_sys::pod;

/// One event: the common header and the probe's field data.
#[derive(Debug, Clone)]
pub struct Event<'a> {
    pub ts_ns: u64,
    pub probe: u32,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    /// Bit i: field i could not be read (its pointer faulted).
    pub faults: u32,
    pub comm: String,
    pub data: &'a [u8],
}

/// A C string from a fixed buffer: up to the first NUL, lossy UTF-8.
pub fn c_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// A buffer field (see BS_T_BUF_UPTR): the length the program passed, then
/// the bytes copied. Returns the bytes shown (at most what was copied) and
/// whether the length went beyond them.
pub fn buf_field(b: &[u8]) -> (&[u8], bool) {
    let (len, data) = match b.split_first_chunk::<8>() {
        Some((l, d)) => (u64::from_ne_bytes(*l), d),
        None => return (&[], false),
    };
    let shown = usize::try_from(len).unwrap_or(usize::MAX).min(data.len());
    (&data[..shown], len > shown as u64)
}

/// Bytes as text the way bpftrace's buf() prints them: printable ASCII as
/// is, every other byte (and the backslash) as an escape, `\x0a`.
pub fn escape_bytes(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len());
    for &c in b {
        match c {
            b'\\' => s.push_str("\\\\"),
            0x20..=0x7e => s.push(c as char),
            _ => s.push_str(&format!("\\x{c:02x}")),
        }
    }
    s
}

pub fn decode(raw: &[u8]) -> Option<Event<'_>> {
    let h: bs_event_hdr = pod::read(raw)?;
    let comm: Vec<u8> = h.comm.iter().map(|&c| c as u8).collect();
    Some(Event {
        ts_ns: h.ts_ns,
        probe: h.probe,
        pid: h.pid,
        tid: h.tid,
        cpu: h.cpu,
        faults: h.faults,
        comm: c_str(&comm),
        data: &raw[std::mem::size_of::<bs_event_hdr>()..],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_show_their_length_escaped() {
        let mut raw = 6u64.to_ne_bytes().to_vec();
        raw.extend_from_slice(b"ab\0c\\\nstale bytes");
        let (b, cut) = buf_field(&raw);
        assert_eq!((escape_bytes(b).as_str(), cut), (r"ab\x00c\\\x0a", false));
        // A length beyond the bytes copied is cut, and says so.
        let mut raw = 100u64.to_ne_bytes().to_vec();
        raw.extend_from_slice(&[b'x'; 64]);
        let (b, cut) = buf_field(&raw);
        assert_eq!((b.len(), cut), (64, true));
        assert_eq!(buf_field(&[1, 2]), (&[][..], false));
    }
}
