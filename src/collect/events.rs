//! Decoding per-event records from the ring buffer.

use crate::attach::pod_read;
use crate::bpf::abi::bs_event_hdr;

/// One event: the common header and the probe's field data.
#[derive(Debug, Clone)]
pub struct Event<'a> {
    pub ts_ns: u64,
    pub probe: u32,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub comm: String,
    pub data: &'a [u8],
}

/// A C string from a fixed buffer: up to the first NUL, lossy UTF-8.
pub fn c_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

pub fn decode(raw: &[u8]) -> Option<Event<'_>> {
    let h: bs_event_hdr = pod_read(raw)?;
    let comm: Vec<u8> = h.comm.iter().map(|&c| c as u8).collect();
    Some(Event {
        ts_ns: h.ts_ns,
        probe: h.probe,
        pid: h.pid,
        tid: h.tid,
        cpu: h.cpu,
        comm: c_str(&comm),
        data: &raw[std::mem::size_of::<bs_event_hdr>()..],
    })
}
