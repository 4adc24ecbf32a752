//! How a kernel function probe is attached: fentry/fexit when the kernel
//! allows it and BTF describes the function (cheaper per event), kprobes
//! otherwise, each the fallback of the other; kprobe_multi for many
//! functions. Part of the paths pass.

use super::{KfuncPath, Mech, Path, Role};
use crate::attach::features::Features;
use crate::error::Error;
use crate::probe::{KfuncKind, Probe, ProbeKind};
use crate::usage;

/// Above this many kernel functions, `kprobe:` prefers kprobes (one
/// kprobe_multi link, or a perf link each) to fentry, whose programs are
/// loaded and verified once per function.
const FENTRY_MAX: usize = 8;

/// Return probes share one kprobe_multi link from this many functions on
/// (see `kprobe_mech`).
const RET_MULTI_MIN: usize = 5;

/// How many kprobe:/kretprobe: functions a plan has, and of them returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct KfuncCount {
    pub all: usize,
    pub rets: usize,
}

impl KfuncCount {
    pub(super) fn of(probes: &[(Probe, Role)]) -> KfuncCount {
        let mut n = KfuncCount::default();
        for (p, _) in probes {
            if let ProbeKind::Kfunc {
                kind: kind @ (KfuncKind::Kprobe | KfuncKind::Kretprobe),
                ..
            } = p.kind
            {
                n.all += 1;
                n.rets += usize::from(kind.is_ret());
            }
        }
        n
    }
}

/// The path of a kernel function probe; `n` counts the plan's
/// kprobe:/kretprobe: functions.
pub(super) fn kfunc_path(probe: &Probe, features: &Features, n: KfuncCount) -> Result<Path, Error> {
    let ProbeKind::Kfunc {
        func,
        offset,
        kind,
        sig,
        kprobe_ok,
        ..
    } = &probe.kind
    else {
        return Err(usage!("{}: not a kernel function", probe.name));
    };
    let ret = kind.is_ret();
    let mut path = KfuncPath {
        func: func.clone(),
        offset: *offset,
        ret,
        mech: Mech::Fentry,
        fallback: None,
        btf_id: sig.as_ref().map(|s| s.func_id),
        unavailable: None,
    };
    let fentry = features.fentry().map(|_| ());
    let kprobe = features.kprobe();
    if kind.is_fentry() {
        path.unavailable = fentry_only(probe, &path, fentry, kprobe)?;
        return Ok(Path::Kfunc(path));
    }
    if let (Err(k), Err(f)) = (kprobe, fentry) {
        return Err(Error::Environment(format!(
            "{}: this kernel refuses both kprobes ({k}) and fentry ({f}); trace tracepoints instead ('bpfscope list')",
            probe.name
        )));
    }
    let can_fentry = fentry.is_ok() && path.btf_id.is_some() && *offset == 0;
    let can_kprobe = kprobe.is_ok() && *kprobe_ok;
    let kprobe_mech = kprobe_mech(ret, *offset, n, features);
    match mechs(can_fentry, can_kprobe, kprobe_mech, n.all) {
        Some((mech, fallback)) => (path.mech, path.fallback) = (mech, fallback),
        None => {
            path.mech = Mech::Kprobe;
            path.unavailable = Some(unavailable(*kprobe_ok, *offset));
        }
    }
    Ok(Path::Kfunc(path))
}

/// `fentry:`/`fexit:` take nothing else: an error when the kernel refuses
/// them, a reason to skip the function when BTF does not describe it.
fn fentry_only(
    probe: &Probe,
    path: &KfuncPath,
    fentry: Result<(), &str>,
    kprobe: Result<(), &str>,
) -> Result<Option<String>, Error> {
    if let Err(why) = fentry {
        let alt = match kprobe {
            Ok(()) => format!(
                "use {}:{} instead",
                if path.ret { "kretprobe" } else { "kprobe" },
                path.func
            ),
            Err(_) => "kprobes are refused too: trace tracepoints instead ('bpfscope list')".into(),
        };
        return Err(Error::Environment(format!(
            "{}: this kernel refuses fentry/fexit programs ({why}); {alt}",
            probe.name
        )));
    }
    Ok(path
        .btf_id
        .is_none()
        .then(|| "fentry needs the function's prototype in vmlinux BTF, which lacks it".into()))
}

/// The kprobe mechanism for a function: kprobe_multi when there are
/// several and the kernel has it, a kprobe each otherwise (and always at
/// an offset).
///
/// Before 6.14 the kernel gives a kprobe_multi return link 2 x CPUs x
/// functions return instances in all, while a lone kretprobe gets at
/// least 10: a return link of a few functions (vfs_read with a few
/// threads blocked in it) would run out and miss returns. Such few
/// returns take one kretprobe each instead.
fn kprobe_mech(ret: bool, offset: u64, n: KfuncCount, features: &Features) -> Mech {
    let multi_ok = if ret {
        n.rets >= RET_MULTI_MIN
    } else {
        n.all > 1
    };
    if offset == 0 && multi_ok && features.kprobe_multi() {
        Mech::KprobeMulti
    } else {
        Mech::Kprobe
    }
}

/// What is tried first and what after, given what can work for this
/// function; None when nothing can.
fn mechs(
    can_fentry: bool,
    can_kprobe: bool,
    kprobe: Mech,
    nkfuncs: usize,
) -> Option<(Mech, Option<Mech>)> {
    match (can_fentry, can_kprobe) {
        (true, true) if nkfuncs > FENTRY_MAX => Some((kprobe, Some(Mech::Fentry))),
        (true, true) => Some((Mech::Fentry, Some(kprobe))),
        (true, false) => Some((Mech::Fentry, None)),
        (false, true) => Some((kprobe, None)),
        (false, false) => None,
    }
}

/// Why neither fentry nor kprobes can attach a function.
fn unavailable(kprobe_ok: bool, offset: u64) -> String {
    if !kprobe_ok {
        "in the kprobe blacklist, and fentry cannot be used".into()
    } else if offset > 0 {
        "kprobes are refused, and fentry has no offsets".into()
    } else {
        "kprobes are refused, and fentry needs a vmlinux BTF prototype, which it lacks".into()
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use crate::attach::features::Template;

    fn count(all: usize, rets: usize) -> KfuncCount {
        KfuncCount { all, rets }
    }

    fn kpath(p: &Probe, f: &Features, n: KfuncCount) -> KfuncPath {
        match kfunc_path(p, f, n).unwrap() {
            Path::Kfunc(k) => k,
            other => panic!("{other:?}"),
        }
    }

    /// Fentry works, kprobes refused (as under some lockdowns).
    fn fentry_only_kernel() -> Features {
        Features::assumed(
            &[],
            Ok(Template {
                func: "vfs_read".into(),
                btf_id: 1000,
            }),
            Err("refused".into()),
            false,
            false,
        )
    }

    #[test]
    fn counts_kprobe_and_kretprobe_functions_only() {
        let probes = plain(vec![
            kfunc("a", KfuncKind::Kprobe, None, true),
            kfunc("b", KfuncKind::Kretprobe, None, true),
            kfunc("c", KfuncKind::Fentry, None, true),
            sched_switch(),
        ]);
        assert_eq!(KfuncCount::of(&probes), count(2, 1));
    }

    #[test]
    fn fentry_first_for_a_few_functions_kprobes_for_many() {
        let p = kfunc("vfs_read", KfuncKind::Kprobe, Some(1), true);
        let k = kpath(&p, &features(), count(2, 0));
        assert_eq!(
            (k.mech, k.fallback),
            (Mech::Fentry, Some(Mech::KprobeMulti))
        );
        assert_eq!(k.btf_id, Some(1));
        let k = kpath(&p, &features(), count(9, 0));
        assert_eq!(
            (k.mech, k.fallback),
            (Mech::KprobeMulti, Some(Mech::Fentry))
        );
        // One function: a kprobe of its own, no multi link.
        let k = kpath(&p, &features(), count(1, 0));
        assert_eq!((k.mech, k.fallback), (Mech::Fentry, Some(Mech::Kprobe)));
    }

    #[test]
    fn few_returns_take_a_kretprobe_each() {
        let p = kfunc("vfs_read", KfuncKind::Kretprobe, None, true);
        assert_eq!(kpath(&p, &features(), count(9, 4)).mech, Mech::Kprobe);
        assert_eq!(kpath(&p, &features(), count(9, 5)).mech, Mech::KprobeMulti);
    }

    #[test]
    fn without_btf_or_kprobes() {
        // No prototype: kprobes only.
        let p = kfunc("f", KfuncKind::Kprobe, None, true);
        let k = kpath(&p, &features(), count(1, 0));
        assert_eq!((k.mech, k.fallback), (Mech::Kprobe, None));
        // Blacklisted, with fentry working: fentry only.
        let p = kfunc("f", KfuncKind::Kprobe, Some(3), false);
        let k = kpath(&p, &features(), count(1, 0));
        assert_eq!(
            (k.mech, k.fallback, k.unavailable),
            (Mech::Fentry, None, None)
        );
        // Neither: skipped, with the reason.
        let p = kfunc("f", KfuncKind::Kprobe, None, true);
        let k = kpath(&p, &fentry_only_kernel(), count(1, 0));
        assert_eq!(
            k.unavailable.as_deref(),
            Some("kprobes are refused, and fentry needs a vmlinux BTF prototype, which it lacks")
        );
        let p = kfunc("f", KfuncKind::Kprobe, None, false);
        let k = kpath(&p, &fentry_only_kernel(), count(1, 0));
        assert_eq!(
            k.unavailable.as_deref(),
            Some("in the kprobe blacklist, and fentry cannot be used")
        );
    }

    #[test]
    fn fentry_and_fexit_take_nothing_else() {
        let p = kfunc("vfs_read", KfuncKind::Fexit, Some(7), true);
        let k = kpath(&p, &features(), count(0, 0));
        assert_eq!((k.mech, k.fallback, k.ret), (Mech::Fentry, None, true));
        let p = kfunc("vfs_read", KfuncKind::Fentry, None, true);
        let k = kpath(&p, &features(), count(0, 0));
        assert!(k.unavailable.is_some());
        let kprobes_only = Features::assumed(&[], Err("no".into()), Ok(()), true, true);
        let p = kfunc("vfs_read", KfuncKind::Fexit, Some(7), true);
        let e = kfunc_path(&p, &kprobes_only, count(0, 0)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "fexit:vfs_read: this kernel refuses fentry/fexit programs (no); use kretprobe:vfs_read instead"
        );
    }

    #[test]
    fn mechanism_table() {
        let m = Mech::KprobeMulti;
        assert_eq!(mechs(true, true, m, 8), Some((Mech::Fentry, Some(m))));
        assert_eq!(mechs(true, true, m, 9), Some((m, Some(Mech::Fentry))));
        assert_eq!(mechs(true, false, m, 9), Some((Mech::Fentry, None)));
        assert_eq!(mechs(false, true, m, 1), Some((m, None)));
        assert_eq!(mechs(false, false, m, 1), None);
        assert_eq!(
            unavailable(true, 8),
            "kprobes are refused, and fentry has no offsets"
        );
    }

    #[test]
    fn not_a_kernel_function() {
        let e = kfunc_path(&sched_switch(), &features(), count(0, 0)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "tracepoint:sched:sched_switch: not a kernel function"
        );
    }
}
