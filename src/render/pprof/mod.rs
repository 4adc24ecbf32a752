//! pprof output: the messages of pprof's profile.proto (`proto`), filled
//! from a symbolized profile and gzipped. `go tool pprof`, Pyroscope and
//! Parca read it.

use std::collections::HashMap;
use std::io::{self, Write};

use prost::Message;

pub mod proto;

use crate::report::Profile as Symbolized;
use proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};

/// The string table: index 0 is always "".
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn id(&mut self, s: &str) -> i64 {
        if self.table.is_empty() {
            self.table.push(String::new());
            self.index.insert(String::new(), 0);
        }
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// Builds the pprof message. User locations are file offsets in mappings
/// that start at 0, so `address - memory_start + file_offset` is the file
/// offset, as pprof's own symbolizer expects.
pub fn build(p: &Symbolized) -> Profile {
    let mut st = Strings::default();
    st.id("");
    let (sample_type, period_type, period) = if p.off_cpu() {
        (
            vec![
                ValueType {
                    r#type: st.id("offcpu"),
                    unit: st.id("count"),
                },
                ValueType {
                    r#type: st.id("offcpu_time"),
                    unit: st.id("nanoseconds"),
                },
            ],
            ValueType {
                r#type: st.id("offcpu_time"),
                unit: st.id("nanoseconds"),
            },
            1,
        )
    } else {
        let period = 1_000_000_000 / p.frequency_hz.max(1) as i64;
        (
            vec![
                ValueType {
                    r#type: st.id("samples"),
                    unit: st.id("count"),
                },
                ValueType {
                    r#type: st.id("cpu"),
                    unit: st.id("nanoseconds"),
                },
            ],
            ValueType {
                r#type: st.id("cpu"),
                unit: st.id("nanoseconds"),
            },
            period,
        )
    };
    // pprof takes the first mapping for the main binary: the profiled
    // program's executable, not whichever mapping came first.
    let order = main_first(p);
    let mut new_id = vec![0u64; p.mappings.len()];
    for (pos, &old) in order.iter().enumerate() {
        new_id[old] = pos as u64 + 1;
    }
    let mappings: Vec<Mapping> = order
        .iter()
        .filter_map(|&i| p.mappings.get(i).map(|m| (i, m)))
        .map(|(i, m)| Mapping {
            id: new_id[i],
            memory_start: 0,
            memory_limit: if m.kernel { u64::MAX } else { 1 << 48 },
            file_offset: 0,
            filename: st.id(&m.name),
            build_id: st.id(&m.build_id),
            has_functions: true,
            has_filenames: !m.kernel,
            has_line_numbers: !m.kernel,
            has_inline_frames: !m.kernel,
        })
        .collect();
    let mut functions: Vec<Function> = Vec::new();
    let mut fn_index: HashMap<(String, String), u64> = HashMap::new();
    let mut func = |st: &mut Strings, name: &str, file: &str| -> u64 {
        if let Some(&id) = fn_index.get(&(name.to_string(), file.to_string())) {
            return id;
        }
        let id = functions.len() as u64 + 1;
        functions.push(Function {
            id,
            name: st.id(name),
            system_name: st.id(name),
            filename: st.id(file),
            start_line: 0,
        });
        fn_index.insert((name.to_string(), file.to_string()), id);
        id
    };
    let locations: Vec<Location> = p
        .locations
        .iter()
        .enumerate()
        .map(|(i, loc)| {
            let line: Vec<Line> = if loc.lines.is_empty() {
                let name = loc.fallback_name(&p.mappings);
                vec![Line {
                    function_id: func(&mut st, &name, ""),
                    line: 0,
                    column: 0,
                }]
            } else {
                loc.lines
                    .iter()
                    .rev()
                    .map(|l| Line {
                        function_id: func(&mut st, &l.function, l.file.as_deref().unwrap_or("")),
                        line: i64::from(l.line),
                        column: 0,
                    })
                    .collect()
            };
            Location {
                id: i as u64 + 1,
                mapping_id: new_id.get(loc.mapping).copied().unwrap_or(0),
                address: loc.address,
                line,
                is_folded: false,
            }
        })
        .collect();
    // `comm` is the thread's name, as in perf, bpftrace and the tracing
    // verbs' `--by comm`; `process` is the process's.
    let (k_pid, k_comm, k_process) = (st.id("pid"), st.id("comm"), st.id("process"));
    let samples: Vec<Sample> = p
        .samples
        .iter()
        .map(|s| {
            let values = if p.off_cpu() {
                vec![s.count as i64, s.value as i64]
            } else {
                vec![s.count as i64, s.count as i64 * period]
            };
            let mut label = vec![
                Label {
                    key: k_pid,
                    str: 0,
                    num: i64::from(s.pid),
                    num_unit: 0,
                },
                Label {
                    key: k_comm,
                    str: st.id(if s.thread.is_empty() {
                        &s.comm
                    } else {
                        &s.thread
                    }),
                    num: 0,
                    num_unit: 0,
                },
                Label {
                    key: k_process,
                    str: st.id(&s.comm),
                    num: 0,
                    num_unit: 0,
                },
            ];
            // The process's name where the thread's was not read, as the
            // other outputs name it: every sample names its thread.
            let thread = Symbolized::thread_name(s);
            let extra = (!thread.is_empty())
                .then_some(("thread_name", thread))
                .into_iter()
                .chain(s.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            for (k, v) in extra {
                label.push(Label {
                    key: st.id(k),
                    str: st.id(v),
                    num: 0,
                    num_unit: 0,
                });
            }
            Sample {
                location_id: s.locations.iter().map(|&l| l as u64 + 1).collect(),
                value: values,
                label,
            }
        })
        .collect();
    let comment = p.notes.iter().map(|n| st.id(n)).collect();
    Profile {
        sample_type,
        sample: samples,
        mapping: mappings,
        location: locations,
        function: functions,
        string_table: st.table,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos: p.start_unix_ns as i64,
        duration_nanos: p.duration_ns as i64,
        period_type: Some(period_type),
        period,
        comment,
        default_sample_type: 1,
    }
}

/// Mapping indices with the main executable first. Stacks begin in the
/// executable (`main`; with frame pointers the walk often ends in libc's
/// start code, so shared libraries, `*.so*`, do not count): the mapping of
/// the outermost such frame, by sample weight. Kernel and unknown mappings
/// never lead when a user mapping exists.
fn main_first(p: &Symbolized) -> Vec<usize> {
    let user = |i: usize| {
        p.mappings
            .get(i)
            .is_some_and(|m| !m.kernel && m.name != "[unknown]")
    };
    let program = |i: usize| {
        user(i)
            && p.mappings.get(i).is_some_and(|m| {
                let file = m.name.rsplit('/').next().unwrap_or(&m.name);
                !file.contains(".so")
            })
    };
    let mut votes: HashMap<usize, u64> = HashMap::new();
    for s in &p.samples {
        // Locations are leaf first: the last one is the outermost.
        let outer = s
            .locations
            .iter()
            .rev()
            .filter_map(|&l| p.locations.get(l))
            .map(|l| l.mapping)
            .find(|&m| program(m));
        if let Some(m) = outer {
            *votes.entry(m).or_default() += s.count.max(1);
        }
    }
    let main = votes
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(m, _)| m)
        .or_else(|| (0..p.mappings.len()).find(|&i| program(i)))
        .or_else(|| (0..p.mappings.len()).find(|&i| user(i)));
    let mut order: Vec<usize> = main.into_iter().collect();
    order.extend((0..p.mappings.len()).filter(|&i| Some(i) != main));
    order
}

/// Gzipped protobuf, as pprof files are.
pub fn write(p: &Symbolized, w: &mut dyn Write) -> io::Result<()> {
    let bytes = build(p).encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(w, flate2::Compression::default());
    gz.write_all(&bytes)?;
    gz.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Location as Loc, Mapping as Map, Sample as Smp};

    fn mapping(name: &str, kernel: bool) -> Map {
        Map {
            name: name.into(),
            build_id: String::new(),
            kernel,
        }
    }

    #[test]
    fn the_profiled_executable_is_the_first_mapping() {
        let loc = |mapping: usize, address: u64| Loc {
            mapping,
            address,
            lines: Vec::new(),
        };
        let p = Symbolized {
            by_thread: false,
            mode: "cpu".into(),
            frequency_hz: 99,
            start_unix_ns: 0,
            duration_ns: 0,
            mappings: vec![
                mapping("[kernel.kallsyms]", true),
                mapping("/usr/lib/libc.so.6", false),
                mapping("/opt/app", false),
            ],
            // A kernel leaf, libc, the executable's main, libc's start code.
            locations: vec![
                loc(0, 0xffff_ffff_8100_0000),
                loc(1, 0x1000),
                loc(2, 0x2000),
                loc(1, 0x3000),
            ],
            samples: vec![Smp {
                pid: 1,
                comm: "app".into(),
                count: 5,
                value: 5,
                locations: vec![0, 1, 2, 3],
                kernel_frames: 1,
                thread: "worker".into(),
                labels: vec![("container_id".into(), "abc".into())],
                ..Default::default()
            }],
            notes: Vec::new(),
        };
        let pb = build(&p);
        let label = |k: &str| {
            let s = &pb.sample[0];
            s.label
                .iter()
                .find(|l| pb.string_table[l.key as usize] == k)
                .map(|l| pb.string_table[l.str as usize].clone())
        };
        assert_eq!(label("thread_name").as_deref(), Some("worker"));
        assert_eq!(label("container_id").as_deref(), Some("abc"));
        assert_eq!(label("comm").as_deref(), Some("worker"));
        assert_eq!(label("process").as_deref(), Some("app"));
        let name = |i: usize| pb.string_table[pb.mapping[i].filename as usize].as_str();
        assert_eq!(
            (0..3).map(name).collect::<Vec<_>>(),
            ["/opt/app", "[kernel.kallsyms]", "/usr/lib/libc.so.6"]
        );
        let ids: Vec<u64> = pb.mapping.iter().map(|m| m.id).collect();
        assert_eq!(ids, [1, 2, 3]);
        // Each location still points at its own file.
        let of = |loc: usize| {
            let id = pb.location[loc].mapping_id;
            let m = pb.mapping.iter().find(|m| m.id == id).unwrap();
            pb.string_table[m.filename as usize].clone()
        };
        assert_eq!(of(0), "[kernel.kallsyms]");
        assert_eq!(of(1), "/usr/lib/libc.so.6");
        assert_eq!(of(2), "/opt/app");
    }
}
