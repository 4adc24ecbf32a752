//! Reading the per-CPU aggregation map and merging CPUs.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags};

use crate::attach::session::Session;
use bpfscope_bpf::abi::{bs_agg_val, bs_cache_ent};
use bpfscope_sys::pod;

/// Merged value of one key (and bucket) over all CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AggVal {
    pub count: u64,
    pub sum: i64,
    /// Meaningful when count > 0; raw bits, compared per the value's signedness.
    pub min: i64,
    pub max: i64,
}

impl AggVal {
    /// Adds another CPU's (or key's) value.
    pub fn merge(&mut self, o: AggVal, signed: bool) {
        if o.count == 0 {
            return;
        }
        let less = |a: i64, b: i64| {
            if signed {
                a < b
            } else {
                (a as u64) < (b as u64)
            }
        };
        if self.count == 0 || less(o.min, self.min) {
            self.min = o.min;
        }
        if self.count == 0 || less(self.max, o.max) {
            self.max = o.max;
        }
        self.count += o.count;
        self.sum = self.sum.wrapping_add(o.sum);
    }

    /// One CPU's value as the map holds it.
    pub fn from_bytes(b: &[u8]) -> AggVal {
        AggVal::from(pod::read::<bs_agg_val>(b).unwrap_or_default())
    }
}

impl From<bs_agg_val> for AggVal {
    fn from(v: bs_agg_val) -> AggVal {
        AggVal {
            count: v.count,
            sum: v.sum,
            min: v.min,
            max: v.max,
        }
    }
}

/// The halves of a per-CPU array of two epoch halves to read: the
/// epoch's, or both.
fn halves(epoch: Option<u32>) -> &'static [u32] {
    match epoch {
        Some(e) if e & 1 == 1 => &[1],
        Some(_) => &[0],
        None => &[0, 1],
    }
}

/// Zeroes one element of a per-CPU array on every CPU.
fn clear_percpu(map: &dyn MapCore, key: &[u8], percpu: &[Vec<u8>], what: &str) -> Result<()> {
    let zero: Vec<Vec<u8>> = percpu.iter().map(|c| vec![0u8; c.len()]).collect();
    map.update_percpu(key, &zero, MapFlags::ANY)
        .with_context(|| format!("clearing {what}"))
}

/// Aggregates of one key: per-bucket values (a single bucket 0 for counts and stats).
#[derive(Debug, Clone, Default)]
pub struct KeyAgg {
    pub buckets: BTreeMap<u32, AggVal>,
}

impl KeyAgg {
    pub fn total(&self, signed: bool) -> AggVal {
        let mut t = AggVal::default();
        for v in self.buckets.values() {
            t.merge(*v, signed);
        }
        t
    }
}

/// Adds one readout into a running total.
pub fn merge_into(
    total: &mut BTreeMap<Vec<u8>, KeyAgg>,
    data: &BTreeMap<Vec<u8>, KeyAgg>,
    signed: bool,
) {
    for (k, agg) in data {
        let t = total.entry(k.clone()).or_default();
        for (b, v) in &agg.buckets {
            t.buckets.entry(*b).or_default().merge(*v, signed);
        }
    }
}

/// Reads a session's aggregates, wherever its programs keep them (see
/// `read` and `read_slots`).
pub fn read_session(
    session: &Session<'_>,
    epoch: Option<u32>,
    signed: bool,
    delete: bool,
) -> Result<BTreeMap<Vec<u8>, KeyAgg>> {
    let maps = &session.skel.maps;
    if let Some(n) = session.shape.slot_buckets {
        return read_slots(&maps.slots, n, epoch, signed, delete);
    }
    let mut out = read(&maps.aggs, epoch, signed, delete)?;
    if let Some(key_bytes) = session.shape.cache_key {
        let cached = read_cache(&maps.kcache, key_bytes as usize, epoch, signed, delete)?;
        merge_into(&mut out, &cached, signed);
    }
    Ok(out)
}

/// Reads the keyed path's per-CPU cache (fast.bpf.h): the entries of the
/// epoch's half (both when None), by key data and bucket as `read` gives
/// them; with `delete`, clears the half. A key's aggregate can be in both
/// (a nested run goes to the hash map): `read_session` merges them.
pub fn read_cache(
    map: &dyn MapCore,
    key_bytes: usize,
    epoch: Option<u32>,
    signed: bool,
    delete: bool,
) -> Result<BTreeMap<Vec<u8>, KeyAgg>> {
    let mut out: BTreeMap<Vec<u8>, KeyAgg> = BTreeMap::new();
    let ent = std::mem::size_of::<bs_cache_ent>();
    for half in halves(epoch) {
        let key = half.to_ne_bytes();
        let Some(percpu) = map
            .lookup_percpu(&key, MapFlags::ANY)
            .context("reading the key cache")?
        else {
            continue;
        };
        for cpu in &percpu {
            for raw in cpu.chunks_exact(ent) {
                let Some(e) = pod::read::<bs_cache_ent>(raw) else {
                    continue;
                };
                if e.used == 0 || e.val.count == 0 {
                    continue;
                }
                let mut data: Vec<u8> = e.k.iter().flat_map(|w| w.to_ne_bytes()).collect();
                data.truncate(key_bytes);
                out.entry(data)
                    .or_default()
                    .buckets
                    .entry(e.bucket)
                    .or_default()
                    .merge(AggVal::from(e.val), signed);
            }
        }
        if delete {
            clear_percpu(map, &key, &percpu, "the key cache")?;
        }
    }
    Ok(out)
}

/// Reads keyless aggregates from their per-CPU array (fast.bpf.h): the
/// buckets of the epoch's half (both halves when None), as `read` gives
/// them (one key, no key data); with `delete`, clears what it read.
pub fn read_slots(
    map: &dyn MapCore,
    buckets: u32,
    epoch: Option<u32>,
    signed: bool,
    delete: bool,
) -> Result<BTreeMap<Vec<u8>, KeyAgg>> {
    let mut agg = KeyAgg::default();
    for half in halves(epoch) {
        for bucket in 0..buckets {
            let key = (half * buckets + bucket).to_ne_bytes();
            let Some(percpu) = map
                .lookup_percpu(&key, MapFlags::ANY)
                .context("reading aggregates")?
            else {
                continue;
            };
            let mut v = AggVal::default();
            for cpu in &percpu {
                v.merge(AggVal::from_bytes(cpu), signed);
            }
            if delete && v.count > 0 {
                clear_percpu(map, &key, &percpu, "aggregates")?;
            }
            if v.count > 0 {
                agg.buckets.entry(bucket).or_default().merge(v, signed);
            }
        }
    }
    let mut out = BTreeMap::new();
    if !agg.buckets.is_empty() {
        out.insert(Vec::new(), agg);
    }
    Ok(out)
}

/// Reads every key of the given epoch (all when None), merged over CPUs and
/// grouped by key data; with `delete`, removes what it read.
pub fn read(
    map: &dyn MapCore,
    epoch: Option<u32>,
    signed: bool,
    delete: bool,
) -> Result<BTreeMap<Vec<u8>, KeyAgg>> {
    let mut out: BTreeMap<Vec<u8>, KeyAgg> = BTreeMap::new();
    let keys: Vec<Vec<u8>> = map.keys().collect();
    for key in keys {
        if key.len() < 8 {
            continue;
        }
        let bucket = u32::from_ne_bytes([key[0], key[1], key[2], key[3]]);
        let key_epoch = u32::from_ne_bytes([key[4], key[5], key[6], key[7]]);
        if epoch.is_some_and(|e| e != key_epoch) {
            continue;
        }
        let Some(percpu) = map
            .lookup_percpu(&key, MapFlags::ANY)
            .context("reading aggregates")?
        else {
            continue;
        };
        let mut v = AggVal::default();
        for cpu in &percpu {
            v.merge(AggVal::from_bytes(cpu), signed);
        }
        if delete {
            // Already gone is fine: the entry was read.
            let _ = map.delete(&key);
        }
        if v.count == 0 {
            continue;
        }
        let agg = out.entry(key[8..].to_vec()).or_default();
        agg.buckets.entry(bucket).or_default().merge(v, signed);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_ignores_empty_slots() {
        let mut t = AggVal::default();
        t.merge(
            AggVal {
                count: 0,
                sum: 0,
                min: 0,
                max: 0,
            },
            true,
        );
        t.merge(
            AggVal {
                count: 2,
                sum: 10,
                min: 3,
                max: 7,
            },
            true,
        );
        t.merge(
            AggVal {
                count: 1,
                sum: -5,
                min: -5,
                max: -5,
            },
            true,
        );
        assert_eq!(
            t,
            AggVal {
                count: 3,
                sum: 5,
                min: -5,
                max: 7
            }
        );
        let mut u = AggVal::default();
        u.merge(
            AggVal {
                count: 1,
                sum: -1,
                min: -1,
                max: -1,
            },
            false,
        );
        u.merge(
            AggVal {
                count: 1,
                sum: 1,
                min: 1,
                max: 1,
            },
            false,
        );
        assert_eq!((u.min, u.max), (1, -1));
    }
}
