//! A second sampler for the time the profiler's own cannot see. kprobe,
//! tracepoint and perf_event BPF programs run under the kernel's per-CPU
//! BPF recursion guard (`bpf_prog_active`); a perf_event BPF program whose
//! clock fires meanwhile is not run, and its sample is dropped. A plain
//! perf sampling event, with no BPF program, is not guarded: the kernel
//! writes its sample (IP, pid, kernel call chain) to a ring buffer whatever
//! runs. One such event per CPU at the profile's frequency sees the guarded
//! programs as perf does; user space keeps the samples whose call chain
//! passes through such a program (the profiler's own sampler got the
//! others) and adds them to the profile.

use std::sync::{Arc, Mutex};

use anyhow::Result;

use super::perfbuf::{Handlers, Reader};
use bpfscope_sys::pod;

/// Kernel-mode samples kept at most (with their call chains), so a long
/// run cannot grow without bound; more are counted as dropped.
const MAX_FRAMES: usize = 4 << 20;
/// Per-CPU ring pages: at 999 Hz a CPU writes ~999 records of ~200 bytes a second.
const PAGES: usize = 64;

#[derive(Debug, Default)]
struct Samples {
    /// (pid, CPU, kernel call chain innermost first) of kernel-mode samples.
    kept: Vec<(u32, u32, Vec<u64>)>,
    frames: usize,
    /// Samples taken, kernel-mode samples not kept for room, and samples
    /// the kernel dropped (ring full).
    taken: u64,
    no_room: u64,
    lost: u64,
}

/// perf's callchain context markers are the top 4095 values.
const PERF_CONTEXT_MAX: u64 = u64::MAX - 4094;

impl Samples {
    fn on_record(&mut self, rec: &[u8]) {
        let u64_at = |o: usize| rec.get(o..).and_then(pod::read::<u64>);
        let Some(h) = rec.get(..4) else {
            return;
        };
        match u32::from_ne_bytes([h[0], h[1], h[2], h[3]]) {
            libbpf_sys::PERF_RECORD_SAMPLE => {
                // u64 ip; u32 pid, tid; u32 cpu, res; u64 nr; u64 ips[nr]
                // (sample_type IP | TID | CPU | CALLCHAIN, in that order).
                self.taken += 1;
                let (Some(ip), Some(pids), Some(cpu), Some(nr)) =
                    (u64_at(8), u64_at(16), u64_at(24), u64_at(32))
                else {
                    return;
                };
                // User-mode samples never are inside a BPF program.
                if ip < 0xffff_8000_0000_0000 {
                    return;
                }
                let chain: Vec<u64> = (0..nr.min(256) as usize)
                    .filter_map(|i| u64_at(40 + 8 * i))
                    .filter(|&a| a < PERF_CONTEXT_MAX)
                    .collect();
                if self.frames + chain.len() > MAX_FRAMES {
                    self.no_room += 1;
                    return;
                }
                self.frames += chain.len();
                self.kept.push((pids as u32, cpu as u32, chain));
            }
            libbpf_sys::PERF_RECORD_LOST => {
                // u64 id; u64 lost.
                self.lost += u64_at(16).unwrap_or(0);
            }
            _ => {}
        }
    }
}

/// What the second sampler saw.
#[derive(Debug, Default)]
pub struct Guarded {
    /// Kernel-mode samples: pid, CPU and kernel call chain, innermost first.
    pub samples: Vec<(u32, u32, Vec<u64>)>,
    pub taken: u64,
    /// Kernel-mode samples not kept (room) or dropped by the kernel.
    pub no_room: u64,
    pub lost: u64,
}

pub struct GuardedSampler {
    state: Arc<Mutex<Samples>>,
    reader: Reader,
}

impl GuardedSampler {
    /// Starts a cpu-clock sampler on every CPU at `hz` (a fixed period, as
    /// the main sampler's), kernel call chains only.
    pub fn start(hz: u64) -> Result<GuardedSampler> {
        let mut attr = libbpf_sys::perf_event_attr {
            type_: libbpf_sys::PERF_TYPE_SOFTWARE,
            size: std::mem::size_of::<libbpf_sys::perf_event_attr>() as u32,
            config: u64::from(libbpf_sys::PERF_COUNT_SW_CPU_CLOCK),
            sample_type: u64::from(
                libbpf_sys::PERF_SAMPLE_IP
                    | libbpf_sys::PERF_SAMPLE_TID
                    | libbpf_sys::PERF_SAMPLE_CPU
                    | libbpf_sys::PERF_SAMPLE_CALLCHAIN,
            ),
            ..Default::default()
        };
        // The main sampler's fixed period, not a frequency the kernel
        // adapts per tick: each sample then stands for the same time as
        // one of the main sampler's, whatever the CPU did before.
        attr.__bindgen_anon_1.sample_period = crate::attach::clock::cpu_clock_period(hz);
        attr.set_exclude_callchain_user(1);
        // Wake the reader every 256 samples, not each one.
        attr.__bindgen_anon_2.wakeup_events = 256;
        let state = Arc::new(Mutex::new(Samples::default()));
        let reader = Reader::spawn(
            "second sampler",
            attr,
            PAGES,
            state.clone(),
            Handlers {
                record: Samples::on_record,
                after_poll: |_| 100,
                finish: |_| {},
            },
        )?;
        Ok(GuardedSampler { state, reader })
    }

    /// The samples kept since the last drain, for a sampler that runs on
    /// (the agent's, read out every second); counts are since the start.
    pub fn drain(&self) -> Guarded {
        let Ok(mut s) = self.state.lock() else {
            return Guarded::default();
        };
        s.frames = 0;
        Guarded {
            samples: std::mem::take(&mut s.kept),
            taken: s.taken,
            no_room: s.no_room,
            lost: s.lost,
        }
    }

    pub fn finish(mut self) -> Guarded {
        self.reader.stop();
        let Ok(mut s) = self.state.lock() else {
            return Guarded::default();
        };
        Guarded {
            samples: std::mem::take(&mut s.kept),
            taken: s.taken,
            no_room: s.no_room,
            lost: s.lost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ip: u64, pid: u32, chain: &[u64]) -> Vec<u8> {
        let mut r = libbpf_sys::PERF_RECORD_SAMPLE.to_ne_bytes().to_vec();
        r.extend([0u8; 4]);
        r.extend(ip.to_ne_bytes());
        r.extend(pid.to_ne_bytes());
        r.extend(pid.to_ne_bytes());
        r.extend(1u32.to_ne_bytes());
        r.extend(0u32.to_ne_bytes());
        r.extend((chain.len() as u64).to_ne_bytes());
        for a in chain {
            r.extend(a.to_ne_bytes());
        }
        r
    }

    #[test]
    fn keeps_kernel_chains_without_context_markers() {
        let mut s = Samples::default();
        let k = 0xffff_ffff_8100_0000u64;
        s.on_record(&sample(k, 7, &[u64::MAX - 127, k, k + 16]));
        s.on_record(&sample(0x40_1000, 8, &[]));
        assert_eq!(s.taken, 2);
        assert_eq!(s.kept, vec![(7, 1, vec![k, k + 16])]);
    }
}
