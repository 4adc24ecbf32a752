// Allowed here: a failed check panics: that is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Tests against real runtimes on this machine (Node, OpenJDK). Each test
// prints a reason and returns if its runtime is missing.

use bpfscope_symbolize::jit::{find_files, load, JitSymbols};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Deletes a file or directory when dropped, so failed tests clean up too.
struct Cleanup(PathBuf);
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn have(cmd: &str) -> bool {
    let ok = Command::new(cmd)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        println!("SKIP: `{cmd}` not found");
    }
    ok
}

fn temp_dir(tag: &str) -> Cleanup {
    let d = std::env::temp_dir().join(format!("bpfscope-jit-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    Cleanup(d)
}

/// Line 2: hotFunction, line 7: otherHotFunction. MS = busy time.
fn node_script(ms: u32, linger: bool) -> String {
    format!(
        "'use strict';
function hotFunction(n) {{
  let s = 0;
  for (let i = 0; i < n; i++) s += Math.sqrt(i) * (i % 7);
  return s;
}}
function otherHotFunction(a) {{
  let h = 0;
  for (let i = 0; i < a.length; i++) h = (h * 31 + a.charCodeAt(i)) | 0;
  return h;
}}
const t0 = Date.now(); let x = 0; const str = 'abcdefghij'.repeat(50);
while (Date.now() - t0 < {ms}) {{ x += hotFunction(5000); x += otherHotFunction(str); }}
console.log('ready', process.pid, x !== 0);
{}",
        if linger {
            "setTimeout(() => {}, 60000);"
        } else {
            ""
        }
    )
}

/// Independent, simple reading of a perf map: (start, size, name) of lines
/// that are well-formed with a non-zero size.
fn reference_lines(text: &str) -> Vec<(u64, u64, String)> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ' ');
            let (a, s, n) = (hex(f.next()?)?, hex(f.next()?)?, f.next()?.trim());
            (s > 0 && !n.is_empty() && a.checked_add(s).is_some()).then(|| (a, s, n.to_string()))
        })
        .collect()
}

fn has_overlaps(v: &[(u64, u64, String)]) -> bool {
    let mut r: Vec<_> = v.iter().map(|x| (x.0, x.0 + x.1)).collect();
    r.sort();
    r.windows(2).any(|w| w[0].1 > w[1].0)
}

/// Checks the table against the reference reading of the same map.
fn check_map(text: &str, t: &JitSymbols) -> Vec<(u64, u64, String)> {
    let reference = reference_lines(text);
    let chunk = JitSymbols::from_perf_map_since(text.as_bytes(), 0);
    assert_eq!(chunk.lines - chunk.malformed - chunk.empty, reference.len());
    assert_eq!(chunk.symbols.len(), t.len());
    if has_overlaps(&reference) {
        println!("map has overlapping lines: len() counts pieces, not lines");
        assert!(!t.is_empty());
    } else {
        assert_eq!(t.len(), reference.len(), "one entry per well-formed line");
        for (a, s, n) in &reference {
            for addr in [*a, a + s / 2, a + s - 1] {
                let got = t.lookup(addr).unwrap();
                assert_eq!((got.name, got.start, got.size), (n.as_str(), *a, *s));
            }
        }
    }
    reference
}

fn is_optimized(name: &str, func: &str) -> bool {
    // V8 prefixes: '*' optimized (TurboFan), '^' baseline, '~' interpreted.
    [
        format!("JS:*{func} "),
        format!("LazyCompile:*{func} "),
        format!("JS:^{func} "),
    ]
    .iter()
    .any(|p| name.starts_with(p.as_str()))
}

#[test]
fn node_perf_basic_prof() {
    if !have("node") {
        return;
    }
    let out = Command::new("node")
        .args(["--perf-basic-prof", "-e", &node_script(1000, false)])
        // --perf-basic-prof also writes a V8 log to the working directory.
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid: u32 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    let _c = Cleanup(map.clone());
    let text = std::fs::read_to_string(&map).unwrap();
    let t = JitSymbols::from_perf_map(&text);
    let reference = check_map(&text, &t);
    println!(
        "node perf map: {} lines, {} entries",
        text.lines().count(),
        t.len()
    );
    for func in ["hotFunction", "otherHotFunction"] {
        let hits: Vec<_> = reference
            .iter()
            .filter(|r| is_optimized(&r.2, func))
            .collect();
        assert!(!hits.is_empty(), "{func} not compiled in map");
        for (a, s, n) in hits {
            assert_eq!(t.lookup(a + s / 2).map(|x| x.name), Some(n.as_str()));
        }
    }
}

#[test]
fn node_jitdump_agrees_with_map() {
    if !have("node") {
        return;
    }
    let dir = temp_dir("node-dump");
    let out = Command::new("node")
        .args([
            "--perf-basic-prof",
            "--perf-prof",
            "-e",
            &node_script(1000, false),
        ])
        .current_dir(&dir.0)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid: u32 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    let _c = Cleanup(map.clone());
    let bytes = std::fs::read(dir.0.join(format!("jit-{pid}.dump"))).unwrap();
    let d = JitSymbols::from_jitdump(&bytes).unwrap();
    let text = std::fs::read_to_string(&map).unwrap();
    let m = JitSymbols::from_perf_map(&text);
    println!(
        "node jitdump: {} bytes, {} entries; map {} entries",
        bytes.len(),
        d.len(),
        m.len()
    );

    // Every compiled JS function in the map is in the dump at the same
    // address and size. ("JS:~" interpreted entries name bytecode and are
    // logged to the perf map only.)
    let mut js = 0;
    for s in m
        .iter()
        .filter(|s| s.name.starts_with("JS:*") || s.name.starts_with("JS:^"))
    {
        let got = d
            .lookup(s.start)
            .unwrap_or_else(|| panic!("{} missing in dump", s.name));
        assert_eq!((got.name, got.start, got.size), (s.name, s.start, s.size));
        js += 1;
    }
    assert!(js > 0);

    for (func, decl_line) in [("hotFunction", 2), ("otherHotFunction", 7)] {
        let hits: Vec<_> = d.iter().filter(|s| is_optimized(s.name, func)).collect();
        assert!(!hits.is_empty(), "{func} not in jitdump");
        for s in hits {
            // The function entry has a line: proves the V8 0x40 bias is
            // undone (V8's first entry is always at start+0x40). Optimized
            // code's first position is the declaration itself.
            let src = d.lookup(s.start).and_then(|x| x.source).unwrap();
            if s.name.starts_with("JS:*") {
                assert_eq!(src.line, decl_line, "{}", s.name);
            }
            assert_eq!(src.file, "[eval]");
            // Everything inside stays within the function body's lines.
            for off in (0..s.size).step_by(7) {
                let l = d.lookup(s.start + off).and_then(|x| x.source).unwrap();
                assert!(
                    (decl_line..decl_line + 5).contains(&l.line),
                    "{} +{off:#x}: {l:?}",
                    s.name
                );
            }
        }
    }
    // Garbled copies of a real dump must not panic.
    for cut in (0..bytes.len()).step_by(997) {
        let _ = JitSymbols::from_jitdump(&bytes[..cut]);
    }
}

/// Spawns a lingering process and waits for its "ready PID" line.
fn spawn_ready(cmd: &mut Command) -> (std::process::Child, u32) {
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid = line.split_whitespace().nth(1).and_then(|p| p.parse().ok());
    let Some(pid) = pid else {
        let _ = child.kill();
        panic!("no ready line: {line:?}");
    };
    (child, pid)
}

#[test]
fn node_live_find_and_load() {
    if !have("node") {
        return;
    }
    let dir = temp_dir("node-live");
    let (mut child, pid) = spawn_ready(
        Command::new("node")
            .args([
                "--perf-basic-prof",
                "--perf-prof",
                "-e",
                &node_script(500, true),
            ])
            .current_dir(&dir.0),
    );
    let _c = Cleanup(PathBuf::from(format!("/tmp/perf-{pid}.map")));
    let files = find_files(pid);
    let table = load(pid);
    let _ = child.kill();
    let _ = child.wait();
    println!("found {files:?}");
    assert!(files.contains(&PathBuf::from(format!("/tmp/perf-{pid}.map"))));
    let dump_name = format!("jit-{pid}.dump");
    assert!(files
        .iter()
        .any(|f| f.file_name().is_some_and(|n| n == dump_name.as_str())));
    let t = table.unwrap().unwrap();
    let hot: Vec<_> = t
        .iter()
        .filter(|s| s.name.starts_with("JS:*hotFunction "))
        .collect();
    assert!(!hot.is_empty());
    // The jitdump was merged on top, so source lines are there.
    let src = t.lookup(hot[0].start).and_then(|s| s.source);
    assert_eq!(src.map(|s| s.line), Some(2));
    assert!(find_files(u32::MAX).is_empty());
    assert!(load(u32::MAX).unwrap().is_none());
}

const JAVA_SRC: &str = "public class Hot {
  static double hotMethod(int n) { double s = 0; for (int i = 0; i < n; i++) s += Math.sqrt(i) * (i % 7); return s; }
  public static void main(String[] a) throws Exception {
    double x = 0; long t = System.currentTimeMillis();
    while (System.currentTimeMillis() - t < 1000) x += hotMethod(10000);
    System.out.println(\"ready \" + ProcessHandle.current().pid() + \" \" + (x > 0));
    if (a.length > 0) Thread.sleep(60000);
  }
}
";

fn compile_java(dir: &Path) {
    std::fs::write(dir.join("Hot.java"), JAVA_SRC).unwrap();
    let st = Command::new("javac")
        .arg("Hot.java")
        .current_dir(dir)
        .status()
        .unwrap();
    assert!(st.success());
}

fn check_java_map(text: &str) {
    let t = JitSymbols::from_perf_map(text);
    let reference = check_map(text, &t);
    let hot: Vec<_> = reference
        .iter()
        .filter(|r| r.2.contains("Hot.hotMethod(int)"))
        .collect();
    assert!(!hot.is_empty(), "Hot.hotMethod not in map");
    for (a, s, n) in hot {
        assert_eq!(t.lookup(a + s / 2).map(|x| x.name), Some(n.as_str()));
    }
    println!(
        "java map: {} entries, e.g. {:?}",
        t.len(),
        t.iter().find(|s| s.name.contains("hotMethod"))
    );
}

#[test]
fn java_dump_perf_map_at_exit() {
    if !have("java") || !have("javac") {
        return;
    }
    let dir = temp_dir("java-exit");
    compile_java(&dir.0);
    let out = Command::new("java")
        .args([
            "-XX:+UnlockDiagnosticVMOptions",
            "-XX:+DumpPerfMapAtExit",
            "-cp",
            ".",
        ])
        .arg("Hot")
        .current_dir(&dir.0)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid: u32 = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    let _c = Cleanup(map.clone());
    check_java_map(&std::fs::read_to_string(&map).unwrap());
}

#[test]
fn java_live_jcmd_perfmap() {
    if !have("java") || !have("javac") || !have("jcmd") {
        return;
    }
    let dir = temp_dir("java-live");
    compile_java(&dir.0);
    let (mut child, pid) = spawn_ready(
        Command::new("java")
            .args(["-cp", ".", "Hot", "linger"])
            .current_dir(&dir.0),
    );
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    let _c = Cleanup(map.clone());
    let st = Command::new("jcmd")
        .args([&pid.to_string(), "Compiler.perfmap"])
        .stdout(Stdio::null())
        .status();
    let table = load(pid);
    let _ = child.kill();
    let _ = child.wait();
    assert!(st.unwrap().success());
    let t = table.unwrap().unwrap();
    assert!(t.iter().any(|s| s.name.contains("Hot.hotMethod(int)")));
    check_java_map(&std::fs::read_to_string(&map).unwrap());
}
