//! The emitted programs, checked without root: golden listings of the BPF
//! instructions for the script shapes under tests/golden/run/jit/ (each
//! probe taken as a sys_enter probe of umask), and the probes that must
//! stay on the machine, with the reason named.

use super::*;
use crate::attach::features::Features;
use crate::attach::plan::Path;
use crate::probe::SyscallTp;
use crate::script::{compile, Options};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/run/jit");

/// A script's lowered code, its interval probes taken as syscall probes
/// (the code is the same; the script reads nothing of this machine).
fn lowered(src: &str) -> Lowered {
    lowered_with(src, &Features::default())
}

/// `lowered`, on a kernel with these features.
fn lowered_with(src: &str, features: &Features) -> Lowered {
    let opts = Options {
        params: Vec::new(),
        pid: None,
        keys_max: 4096,
        allow_unsafe: false,
    };
    let mut low = compile(src, &opts, features).unwrap().lowered;
    for (i, p) in low.probes.iter_mut().enumerate() {
        if p.probe.name.starts_with("interval") {
            p.trigger = None;
            p.path = Path::Syscall(SyscallTp {
                nr: 95,
                exit: i % 2 == 1,
            });
        }
    }
    low
}

const ENV: Env = Env {
    self_tgid: 4242,
    comm_off: Some(1752),
    // A kernel with bpf_rdonly_cast; `without_the_kfunc` has none.
    regs_cast: Some(RegsCast {
        kfunc: 65477,
        pt_regs: 162,
    }),
    sched: None,
    task_keys: 0,
};

fn listing_of(low: &Lowered) -> String {
    let mut out = String::new();
    for (p, c) in low.probes.iter().zip(choose(low, &ENV)) {
        match c {
            Ok(prog) => {
                out += &format!("{}:\n{}\n", p.probe.name, listing(low, &prog));
            }
            Err(why) => out += &format!("{}: script machine: {why}\n\n", p.probe.name),
        }
    }
    out
}

#[test]
fn listings_match_the_golden_files() {
    crate::script::golden::check_dir(DIR, "bpf", 4, |name, src| {
        let got = listing_of(&lowered(src));
        // Every shape here is one the emitter translates whole (END
        // aside, which bpfscope runs itself).
        let machine = got.lines().filter(|l| l.contains("script machine"));
        assert!(
            machine.clone().all(|l| l.starts_with("END:")),
            "{name}.bt:\n{got}"
        );
        got
    });
}

fn why(src: &str) -> String {
    let low = lowered(src);
    match emit(&low, 0, &ENV) {
        Ok(p) => panic!("compiled:\n{}", listing(&low, &p)),
        Err(e) => e,
    }
}

#[test]
fn what_stays_on_the_machine_is_named() {
    assert_eq!(
        why(r#"interval:ms:1 { printf("%d\n", tid); }"#),
        "`evnum` runs on the machine"
    );
    assert_eq!(
        why("interval:ms:1 { $i = 0; while ($i < 3) { $i++; } @ = $i; }"),
        "a backward jump (a loop)"
    );
    assert_eq!(why("interval:ms:1 { @ = bswap(tid); }"), "ALU operation 20");
    assert_eq!(
        why("interval:ms:1 { @[kstack] = count(); }"),
        "source kind 10 on this probe's path"
    );
    // BEGIN, END and intervals run in bpfscope itself.
    let low = compile(
        "BEGIN { @ = 1; }",
        &Options {
            params: Vec::new(),
            pid: None,
            keys_max: 4096,
            allow_unsafe: false,
        },
        &Features::default(),
    )
    .unwrap()
    .lowered;
    assert_eq!(emit(&low, 0, &ENV).unwrap_err(), "run by bpfscope itself");
}

#[test]
fn comm_without_btf_stays_on_the_machine() {
    let low = lowered(r#"interval:ms:1 { @[comm] = count(); }"#);
    let env = Env {
        comm_off: None,
        ..ENV
    };
    assert_eq!(
        emit(&low, 0, &env).unwrap_err(),
        "task_struct.comm not found in the kernel's BTF"
    );
}

#[test]
fn every_jump_lands_inside_the_program_and_maps_are_loads() {
    for name in ["filtered_count", "latency_pair", "syscount", "arith"] {
        let src = std::fs::read_to_string(format!("{DIR}/{name}.bt")).unwrap();
        let low = lowered(&src);
        for i in 0..low.probes.len() {
            let p = emit(&low, i, &ENV).unwrap();
            let n = p.insns.len() as i64;
            for (k, x) in p.insns.iter().enumerate() {
                let class = x.code & 7;
                let op = x.code & 0xf0;
                // Jumps (not calls or exit) stay inside the program.
                if class == 5 && op != 0x80 && op != 0x90 {
                    let to = k as i64 + 1 + i64::from(x.off);
                    assert!((0..n).contains(&to), "{name}: {k} jumps to {to}");
                }
            }
            for (at, _) in &p.maps {
                assert!(insn::is_ld64(&p.insns[*at]), "{name}: map at {at}");
            }
            // The last instruction returns.
            assert_eq!(p.insns[p.insns.len() - 1], insn::exit());
        }
    }
}

#[test]
fn comm_offset_comes_from_btf() {
    // Where the kernel has BTF (CI and this machine), comm is found, and
    // inside task_struct past its first fields; a script without comm
    // does not read the BTF.
    if std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        let off = env(&lowered("interval:ms:1 { @[comm] = count(); }"))
            .comm_off
            .unwrap();
        assert!(off > 64 && off < 16384, "{off}");
        // libbpf's parser finds what bpfscope's BTF index finds.
        let btf = crate::probe::btf::vmlinux().unwrap();
        let task = btf.struct_id("task_struct").unwrap();
        let step = crate::probe::btf::Step {
            arrow: false,
            member: "comm".into(),
        };
        let w = btf.walk_in_memory("comm", task, &[step]).unwrap();
        assert_eq!(u32::from(w.leaf_off), off);
        // bpf_rdonly_cast's id and pt_regs' are the ones the index has
        // (6.2+; none before), for a sys_exit probe (the second).
        let cast = env(&lowered(
            "interval:ms:1 { @[tid] = count(); } interval:ms:2 { @[tid] = count(); }",
        ))
        .regs_cast;
        let want = btf.func("bpf_rdonly_cast").map(|f| RegsCast {
            kfunc: f.func_id,
            pt_regs: btf.struct_id("pt_regs").unwrap(),
        });
        assert_eq!(cast, want);
    }
    assert_eq!(
        env(&lowered("interval:ms:1 { @[tid] = count(); }")).comm_off,
        None
    );
    // A sys_enter probe that reads no argument reads no register: no BTF.
    assert_eq!(
        env(&lowered("interval:ms:1 { @[tid] = count(); }")).regs_cast,
        None
    );
}

#[test]
fn many_syscall_probes_leave_the_rest_to_the_shared_program() {
    let blocks: String = (0..12)
        .map(|i| format!("interval:ms:{} {{ @[{i}] = count(); }}\n", i + 1))
        .collect();
    let mut low = lowered(&blocks);
    for p in &mut low.probes {
        p.path = Path::Syscall(SyscallTp {
            nr: 95,
            exit: false,
        });
    }
    let c = choose(&low, &ENV);
    assert_eq!(c.iter().filter(|c| c.is_ok()).count(), SYSCALL_MAX);
    assert_eq!(
        c[SYSCALL_MAX].as_ref().unwrap_err(),
        "over 8 syscall probes: the shared program serves the rest"
    );
}

#[test]
fn a_value_read_again_for_the_same_key_is_not_looked_up_twice() {
    // The predicate's @s[tid] and the body's: one lookup of @s, then the
    // histogram's (its miss path looks up once more after the insert).
    let low = lowered(
        "interval:ms:1 /@s[tid]/ { @h = hist(nsecs - @s[tid]); delete(@s[tid]); @s[tid] = 1; $x = @s[tid]; @y = $x; }",
    );
    let text = listing(&low, &emit(&low, 0, &ENV).unwrap());
    // @s: the predicate's lookup, the delete, the write, and the lookup
    // after the write (the body's first read is the predicate's value).
    assert_eq!(text.matches("r1 = map @s").count(), 4, "{text}");
    assert_eq!(text.matches("*(u64 *)(fp-96)").count(), 3, "{text}");
}

/// sys_exit's number is a load through the typed registers where the
/// kernel has bpf_rdonly_cast, a helper's copy where it has not.
#[test]
fn registers_are_read_in_place_where_the_kernel_has_the_kfunc() {
    let low = lowered("interval:ms:1 { @a = count(); } interval:ms:2 { @b = count(); }");
    let exit = |env: &Env| listing(&low, &emit(&low, 1, env).unwrap());
    let typed = exit(&ENV);
    assert!(typed.contains("call kfunc#65477"), "{typed}");
    assert!(typed.contains("r2 = 162"), "{typed}");
    assert!(!typed.contains("probe_read_kernel"), "{typed}");
    let without_the_kfunc = Env {
        regs_cast: None,
        ..ENV
    };
    let copied = exit(&without_the_kfunc);
    assert!(copied.contains("call probe_read_kernel"), "{copied}");
    assert!(!copied.contains("kfunc"), "{copied}");
}

/// The maps `-v` names with `suffix` (a line `@m<suffix>` each).
fn said(src: &str, suffix: &str) -> Vec<String> {
    let low = lowered(src);
    describe(&low, &choose(&low, &ENV))
        .into_iter()
        .filter_map(|l| l.strip_suffix(suffix).map(str::to_string))
        .collect()
}

/// Which maps live in the threads' own storage: numbers keyed by tid
/// alone, cleared at END and named whole nowhere else; their reads,
/// writes and deletes are storage lookups in compiled code.
#[test]
fn tid_keyed_maps_live_in_thread_storage_only_where_nothing_else_sees_them() {
    let thread = |src: &str| said(src, ": in each thread's own storage (keyed by tid)");
    let pair = "interval:ms:1 { @s[tid] = nsecs; } interval:ms:2 /@s[tid]/ { @h = hist(nsecs - @s[tid]); delete(@s[tid]); }";
    assert_eq!(thread(&format!("{pair} END {{ clear(@s); }}")), ["@s"]);
    // Printed at the end with what exited threads left: a hash map where
    // the threads' storage cannot be read from user space (before 6.9)...
    assert!(thread(pair).is_empty());
    // ... else in their storage, handed to the hash map as each exits.
    let mut features = Features::default();
    features.thread_pidfd = true;
    let low = lowered_with(pair, &features);
    assert!(low
        .maps
        .iter()
        .any(|m| m.name == "@s" && m.thread && m.thread_print));
    let plan = crate::script::compile(
        pair,
        &Options {
            params: Vec::new(),
            pid: None,
            keys_max: 4096,
            allow_unsafe: false,
        },
        &features,
    )
    .unwrap()
    .plan;
    assert_eq!(plan.vm.as_ref().unwrap().task_print, [(0, 0)]);
    let cleared = lowered_with(&format!("{pair} END {{ clear(@s); }}"), &features);
    assert!(cleared
        .maps
        .iter()
        .any(|m| m.name == "@s" && m.thread && !m.thread_print));
    for other in [
        "END { clear(@s); print(@s); }",
        "END { clear(@s); } interval:ms:3 { print(@s); }",
        "END { clear(@s); } interval:ms:3 { @s[pid] = 1; }",
        "END { clear(@s); } interval:ms:3 { for ($kv : @s) { @x = $kv.1; } }",
        "END { if (1) { clear(@s); } }",
        "END { clear(@s); } interval:ms:3 { zero(@s); }",
        "#define S @s[tid]\nEND { clear(@s); } interval:ms:3 { @y = S; }",
        "#define tid 5\nEND { clear(@s); }",
    ] {
        assert!(thread(&format!("{pair} {other}")).is_empty(), "{other}");
    }
    // Strings are not numbers.
    assert!(thread("interval:ms:1 { @s[tid] = comm; } END { clear(@s); }").is_empty());
    // At most BS_VM_TASK_MAPS (8): the ninth is a hash map.
    let nine: String = (0..9)
        .map(|i| format!("interval:ms:{} {{ @m{i}[tid] = {i}; }} ", i + 1))
        .chain(std::iter::once(
            (0..9)
                .map(|i| format!("clear(@m{i}); "))
                .collect::<String>(),
        ))
        .collect::<Vec<_>>()
        .join("");
    let nine = nine.replacen("clear(@m0)", "END { clear(@m0)", 1) + "}";
    assert_eq!(thread(&nine).len(), 8, "{nine}");
    // Compiled: storage lookups, no hash map operation on @s.
    let low = lowered(&format!("{pair} END {{ clear(@s); }}"));
    let chosen = choose(&low, &ENV);
    for c in chosen.iter().take(2) {
        let text = listing(&low, c.as_ref().unwrap());
        assert!(!text.contains("r1 = map @s"), "{text}");
        assert!(text.contains("r1 = map task"), "{text}");
    }
    // At exit, the predicate's lookup serves the body's read and the
    // delete, and tid is made once (and once for the self check): both
    // are kept in the frame for the rest of the straight code.
    let exit = listing(&low, chosen[1].as_ref().unwrap());
    assert_eq!(exit.matches("call task_storage_get").count(), 1, "{exit}");
    assert_eq!(
        exit.matches("call get_current_pid_tgid").count(),
        2,
        "{exit}"
    );
}

/// Aggregations the code only adds to, keyed by one or two words, add
/// through the per-CPU cache in compiled code; a map the kernel side
/// also reads, deletes from or loops over, a longer key, a stack key or a
/// keyless one does not, nor the ninth.
#[test]
fn aggregations_only_added_to_take_the_cache() {
    let cached = |src: &str| said(src, ": added through a per-CPU cache by compiled probes");
    assert_eq!(
        cached("interval:ms:1 { @c[comm] = count(); @s[pid, tid] = sum(1); @h[cpu] = hist(5); @l[1] = lhist(3, 0, 10, 1); @m[2] = max(4); }"),
        ["@c", "@s", "@h", "@l", "@m"]
    );
    for other in [
        "interval:ms:1 { @c[1] = count(); } interval:ms:2 { delete(@c[1]); }",
        "interval:ms:1 { @c[1, 2, 3] = count(); }",
        "interval:ms:1 { @c[\"a string literal longer than two words\"] = count(); }",
        "interval:ms:1 { @c[kstack] = count(); }",
        "interval:ms:1 { @c = count(); }",
        "interval:ms:1 { @c[1] = 5; }",
    ] {
        assert!(cached(other).is_empty(), "{other}");
    }
    // print(), clear() and zero() are user space's: they read the cache too.
    assert_eq!(
        cached(
            "interval:ms:1 { @c[1] = count(); } interval:ms:2 { print(@c); clear(@c); zero(@c); }"
        ),
        ["@c"]
    );
    // At most BS_VM_CACHE_MAPS (8).
    let nine: String = (0..9).map(|i| format!("@m{i}[{i}] = count(); ")).collect();
    assert_eq!(cached(&format!("interval:ms:1 {{ {nine} }}")).len(), 8);
    // A hit is the cache's: an index, compares and adds; the hash map's
    // code follows for the rest.
    let low = lowered("interval:ms:1 { @c[comm] = count(); }");
    let text = listing(&low, choose(&low, &ENV)[0].as_ref().unwrap());
    assert!(text.contains("r1 = map cache"), "{text}");
    assert!(text.contains("cmpxchg"), "{text}");
    assert!(text.contains("r1 = map @"), "{text}");
}

/// A probe that can fire in an interrupt looks at the kernel stack on
/// bpfscope's own task for the interrupt code (`irq_text`) before it
/// drops the event; a syscall probe, always its task's own, only compares.
#[test]
#[cfg(target_arch = "x86_64")]
fn probes_that_can_fire_in_an_interrupt_look_for_it_on_bpfscopes_task() {
    let mut low = lowered("interval:ms:1 { @a = count(); }");
    let syscall = listing(&low, &emit(&low, 0, &ENV).unwrap());
    assert!(syscall.contains("if r0 == 4242 goto"), "{syscall}");
    assert!(!syscall.contains("get_stack"), "{syscall}");
    for path in [
        Path::RawTp {
            name: "softirq_entry".into(),
        },
        Path::Tracepoint {
            subsys: "irq".into(),
            event: "softirq_entry".into(),
        },
    ] {
        low.probes[0].path = path;
        let prog = emit(&low, 0, &ENV).unwrap();
        let text = listing(&low, &prog);
        assert!(text.contains("if r0 != 4242 goto"), "{text}");
        assert!(text.contains("call get_stack"), "{text}");
        assert!(text.contains("&bss (.bss+"), "{text}");
        // The loop over the frames jumps back once.
        let back = prog
            .insns
            .iter()
            .filter(|x| x.code == 0x05 && x.off < 0)
            .count();
        assert_eq!(back, 1, "{text}");
    }
}
