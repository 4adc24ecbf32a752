//! Rendering symbolized profiles: folded stacks, SVG flame graphs
//! (inferno), JSON and the top-functions table.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, Write};

use super::record::{FrameFunction, ProfileDocument, ProfileFrame, ProfileStack, TopFunction};
use crate::report::{FrameKind, Location, Profile, Sample};

impl Profile {
    pub fn off_cpu(&self) -> bool {
        self.mode == "offcpu"
    }

    /// The thread's name, or the process's where the recording has none.
    pub fn thread_name(s: &Sample) -> &str {
        if s.thread.is_empty() {
            &s.comm
        } else {
            &s.thread
        }
    }

    /// What a sample's weight counts, for people.
    pub fn unit(&self) -> &'static str {
        if self.off_cpu() {
            "us off-CPU"
        } else {
            "samples"
        }
    }

    /// A sample's weight in the unit above (off-CPU nanoseconds as microseconds).
    pub fn weight(&self, s: &Sample) -> u64 {
        if self.off_cpu() {
            s.value / 1000
        } else {
            s.value
        }
    }

    /// Frame names of one location, outer function first.
    fn names(&self, loc: &Location) -> Vec<String> {
        let kernel = self.mappings.get(loc.mapping).is_some_and(|m| m.kernel);
        let python = self
            .mappings
            .get(loc.mapping)
            .is_some_and(|m| m.name == crate::report::PYTHON_MAPPING);
        if let (true, Some(l)) = (python, loc.lines.first()) {
            // As Python tracebacks and py-spy name them: the function, then
            // where in which file.
            let file = l.file.as_deref().unwrap_or("?");
            let base = file.rsplit('/').next().unwrap_or(file);
            return vec![format!("{} ({base}:{})", l.function, l.line)];
        }
        if loc.lines.is_empty() {
            let n = loc.fallback_name(&self.mappings);
            return vec![if kernel { format!("{n}_[k]") } else { n }];
        }
        let mut names: Vec<String> = loc
            .lines
            .iter()
            .map(|l| {
                if kernel {
                    format!("{}_[k]", l.function)
                } else {
                    l.function.clone()
                }
            })
            .collect();
        // A BPF program's source line becomes a frame under the program, so
        // the program's box stays whole and its lines show beneath it.
        if let (true, Some(l)) = (kernel, loc.lines.first()) {
            if let (true, Some(f)) = (l.function.starts_with("bpf_prog_"), &l.file) {
                let file = f.rsplit('/').next().unwrap_or(f);
                names.push(format!("{file}:{}_[k]", l.line));
            }
        }
        names
    }

    /// One line per unique stack: frames root first separated by `;`
    /// (the process name is the root), a space, the weight. Sorted.
    pub fn folded(&self) -> Vec<String> {
        self.folded_kinds(None)
    }

    /// `folded`, noting each frame name's kind in `kinds` (a name two
    /// kinds share keeps the first).
    fn folded_kinds(&self, mut kinds: Option<&mut HashMap<String, FrameKind>>) -> Vec<String> {
        let mut agg: BTreeMap<String, u64> = BTreeMap::new();
        let mut note = |name: &str, k: FrameKind| {
            if let Some(m) = kinds.as_deref_mut() {
                if !m.contains_key(name) {
                    m.insert(name.to_string(), k);
                }
            }
        };
        for s in &self.samples {
            let w = self.weight(s);
            if w == 0 {
                continue;
            }
            let mut frames = vec![sanitize(&s.comm)];
            if self.by_thread {
                frames.push(sanitize(Self::thread_name(s)));
            }
            for f in &frames {
                note(f, FrameKind::Process);
            }
            for &l in s.locations.iter().rev() {
                if let Some(loc) = self.locations.get(l) {
                    let k = self.kind(loc);
                    for n in self.names(loc) {
                        let n = sanitize(&n);
                        note(&n, k);
                        frames.push(n);
                    }
                }
            }
            *agg.entry(frames.join(";")).or_default() += w;
        }
        agg.into_iter().map(|(k, v)| format!("{k} {v}")).collect()
    }

    pub fn write_folded(&self, w: &mut dyn Write) -> io::Result<()> {
        for l in self.folded() {
            writeln!(w, "{l}")?;
        }
        Ok(())
    }

    pub fn write_svg(&self, w: &mut dyn Write) -> io::Result<()> {
        let title = if self.off_cpu() {
            "bpfscope off-CPU time".to_string()
        } else {
            format!("bpfscope CPU profile ({} Hz)", self.frequency_hz)
        };
        let count = if self.off_cpu() { "us" } else { "samples" };
        let mut kinds = HashMap::new();
        let lines = self.folded_kinds(Some(&mut kinds));
        super::flame::svg_by_kind(&lines, &title, count, &kinds, w)
    }

    /// Self and total weight per function, heaviest self first.
    pub fn top(&self) -> Vec<TopFunction> {
        let mut selfw: HashMap<String, u64> = HashMap::new();
        let mut total: HashMap<String, u64> = HashMap::new();
        for s in &self.samples {
            let w = self.weight(s);
            let mut seen: HashSet<String> = HashSet::new();
            for (i, &l) in s.locations.iter().enumerate() {
                let Some(loc) = self.locations.get(l) else {
                    continue;
                };
                let names = self.names(loc);
                if i == 0 {
                    if let Some(leaf) = names.last() {
                        *selfw.entry(leaf.clone()).or_default() += w;
                    }
                }
                for n in names {
                    if seen.insert(n.clone()) {
                        *total.entry(n).or_default() += w;
                    }
                }
            }
        }
        let mut rows: Vec<TopFunction> = total
            .into_iter()
            .map(|(n, t)| TopFunction {
                self_weight: selfw.get(&n).copied().unwrap_or(0),
                function: n,
                total: t,
            })
            .collect();
        rows.sort_by(|a, b| {
            b.self_weight
                .cmp(&a.self_weight)
                .then(b.total.cmp(&a.total))
                .then(a.function.cmp(&b.function))
        });
        rows
    }

    pub fn total_weight(&self) -> u64 {
        self.samples.iter().map(|s| self.weight(s)).sum()
    }

    pub fn write_top(&self, w: &mut dyn Write, limit: usize) -> io::Result<()> {
        let mut rows = self.top();
        rows.truncate(limit);
        super::printer::top_functions(w, self.unit(), self.total_weight(), &rows)
    }

    /// The JSON document of `-o FILE.json`.
    pub fn document(&self) -> ProfileDocument {
        let stacks = self
            .samples
            .iter()
            .map(|s| {
                let frames = s
                    .locations
                    .iter()
                    .filter_map(|&l| self.locations.get(l))
                    .map(|loc| {
                        let m = self.mappings.get(loc.mapping);
                        ProfileFrame {
                            kind: self.kind(loc).as_str(),
                            address: format!("{:#x}", loc.address),
                            module: m.map(|m| m.name.clone()),
                            build_id: m.map(|m| m.build_id.clone()),
                            kernel: m.is_some_and(|m| m.kernel),
                            functions: loc
                                .lines
                                .iter()
                                .map(|l| FrameFunction {
                                    name: l.function.clone(),
                                    file: l.file.clone(),
                                    line: l.line,
                                })
                                .collect(),
                        }
                    })
                    .collect();
                ProfileStack {
                    pid: s.pid,
                    comm: s.comm.clone(),
                    thread: Self::thread_name(s).to_string(),
                    count: s.count,
                    value: s.value,
                    frames,
                }
            })
            .collect();
        let mut top = self.top();
        top.truncate(100);
        ProfileDocument {
            mode: self.mode.clone(),
            frequency_hz: self.frequency_hz,
            duration_ns: self.duration_ns,
            value_unit: if self.off_cpu() {
                "nanoseconds"
            } else {
                "samples"
            },
            stacks,
            top,
            notes: self.notes.clone(),
        }
    }
}

/// Folded lines use `;` between frames and a space before the count.
fn sanitize(s: &str) -> String {
    s.replace(';', ":").replace('\n', " ")
}
