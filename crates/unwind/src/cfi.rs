//! Evaluating a CFI section (`.eh_frame` or `.debug_frame`) through gimli:
//! every FDE's rows, each turned into a `Rule` the table can store.

use std::collections::HashMap;

use gimli::{
    AArch64, BaseAddresses, CfaRule, CieOrFde, CommonInformationEntry, Encoding, Reader,
    RegisterRule, UnwindContext, UnwindExpression, UnwindOffset, UnwindSection, UnwindTableRow,
    X86_64,
};

use crate::expr;
use crate::rule::{
    Arch, Cfa, ReturnAddress, Rule, SavedRbp, REG_RBP, REG_RSP, REG_SP, REG_X29, SIGCONTEXT_RBP,
    SIGCONTEXT_RIP, SIGCONTEXT_RSP,
};
use crate::table::Rows;
use crate::Stats;

/// Why a row became `Cfa::Unsupported`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// A CFA expression none of the known patterns.
    CfaExpression,
    /// CFA = a register the table cannot name (above r15, or RIP).
    CfaRegister,
    /// CFA offset out of the range the entry holds.
    CfaOffset,
    /// The return address is neither at CFA - 8 nor undefined.
    ReturnAddress,
    /// gimli refused an instruction (say DW_CFA_def_cfa_register after a
    /// CFA expression): the rest of the FDE.
    InvalidCfi,
}

/// One evaluated CFI row.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Row {
    pub start: u64,
    pub end: u64,
    pub rule: Rule,
    pub unsupported: Option<Reason>,
    /// The RBP rule was known but does not fit: stored as `Lost`.
    pub rbp_dropped: bool,
}

/// Where an FDE's range is with respect to what was already collected.
pub(crate) enum Admit {
    Yes,
    /// Outside every executable segment (FDEs of discarded sections,
    /// left at address 0).
    OutsideCode,
    /// Already described by .eh_frame (for .debug_frame FDEs).
    Shadowed,
}

/// Collects the rows of every FDE of `section` that `admit` accepts, and
/// the FDEs' ranges.
#[allow(clippy::too_many_arguments)]
pub(crate) fn collect<R, S>(
    section: &S,
    arch: Arch,
    bases: &BaseAddresses,
    admit: &dyn Fn(u64, u64) -> Admit,
    stats: &mut Stats,
    rows: &mut Rows,
    ranges: &mut Vec<(u64, u64)>,
    failed: &mut Vec<(u64, u64)>,
) where
    R: Reader,
    S: UnwindSection<R>,
{
    let mut cies: HashMap<R::Offset, CommonInformationEntry<R>> = HashMap::new();
    let mut ctx: Box<UnwindContext<R::Offset>> = Box::default();
    let mut entries = section.entries(bases);
    let mut fde_rows = Vec::new();
    loop {
        let partial = match entries.next() {
            Ok(None) => break,
            // A broken entry length leaves nothing to resynchronise on.
            Err(_) => {
                stats.cfi_errors += 1;
                break;
            }
            Ok(Some(CieOrFde::Cie(cie))) => {
                stats.cies += 1;
                cies.insert(cie.offset(), cie);
                continue;
            }
            Ok(Some(CieOrFde::Fde(partial))) => partial,
        };
        let fde = partial.parse(|sec, b, off| match cies.get(&UnwindOffset::into(off)) {
            Some(cie) => Ok(cie.clone()),
            None => sec.cie_from_offset(b, off),
        });
        let Ok(fde) = fde else {
            stats.fde_errors += 1;
            continue;
        };
        let (start, end) = (fde.initial_address(), fde.end_address());
        if start >= end {
            stats.empty_fdes += 1;
            continue;
        }
        match admit(start, end) {
            Admit::Yes => {}
            Admit::OutsideCode => {
                stats.fdes_outside_code += 1;
                continue;
            }
            Admit::Shadowed => {
                stats.debug_frame_shadowed += 1;
                continue;
            }
        }
        let signal = fde.is_signal_trampoline();
        let encoding = fde.cie().encoding();
        fde_rows.clear();
        let ok = (|| -> gimli::Result<()> {
            let mut table = fde.rows(section, bases, &mut ctx)?;
            while let Some(row) = table.next_row()? {
                let (rs, re) = (row.start_address(), row.end_address().min(end));
                if rs < re {
                    fde_rows.push(match arch {
                        Arch::X86_64 => convert(row, rs, re, section, encoding, signal),
                        Arch::Aarch64 => convert_aarch64(row, rs, re, signal),
                    });
                }
            }
            Ok(())
        })();
        if ok.is_err() {
            // Keep the rows before the instruction gimli refused; the rest
            // of the function has CFI this table cannot follow.
            stats.fde_errors += 1;
            let from = fde_rows.last().map_or(start, |r| r.end);
            if from < end {
                failed.push((from, end));
                fde_rows.push(Row {
                    start: from,
                    end,
                    rule: Rule::unsupported(signal),
                    unsupported: Some(Reason::InvalidCfi),
                    rbp_dropped: false,
                });
            }
        }
        stats.fdes += 1;
        if signal {
            stats.signal_fdes += 1;
        }
        for r in &fde_rows {
            rows.push(r, stats);
        }
        ranges.push((start, end));
    }
}

fn expression<R: Reader, S: UnwindSection<R>>(
    e: &UnwindExpression<R::Offset>,
    section: &S,
    encoding: Encoding,
) -> Option<Vec<expr::Op>> {
    expr::ops(e.get(section).ok()?, encoding)
}

/// The rule of one row.
fn convert<R: Reader, S: UnwindSection<R>>(
    row: &UnwindTableRow<R::Offset>,
    start: u64,
    end: u64,
    section: &S,
    encoding: Encoding,
    signal: bool,
) -> Row {
    let ops = |e: &UnwindExpression<R::Offset>| expression(e, section, encoding);
    let reg_ops = |r: Option<RegisterRule<R::Offset>>| match r {
        Some(RegisterRule::Expression(e)) => ops(&e),
        _ => None,
    };
    let mut out = Row {
        start,
        end,
        rule: Rule::unsupported(signal),
        unsupported: None,
        rbp_dropped: false,
    };
    let unsupported = |mut out: Row, why: Reason| {
        out.unsupported = Some(why);
        out
    };

    // The CFA.
    let cfa_ops = match row.cfa() {
        CfaRule::Expression(e) => ops(e),
        CfaRule::RegisterAndOffset { .. } => None,
    };
    // glibc's __restore_rt (and any signal trampoline written the same
    // way): every register an expression into the ucontext at RSP.
    let is_sigcontext = cfa_ops.as_deref().and_then(expr::deref)
        == Some((REG_RSP, SIGCONTEXT_RSP.into(), 0))
        && reg_ops(row.register(X86_64::RA))
            .as_deref()
            .and_then(expr::reg_offset)
            == Some((REG_RSP, SIGCONTEXT_RIP.into()))
        && reg_ops(row.register(X86_64::RBP))
            .as_deref()
            .and_then(expr::reg_offset)
            == Some((REG_RSP, SIGCONTEXT_RBP.into()));
    if is_sigcontext {
        out.rule = Rule::sigcontext(signal);
        return out;
    }
    let cfa = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let off = *offset;
            match register.0 {
                REG_RSP => match u32::try_from(off) {
                    Ok(o) => Cfa::Rsp(o),
                    Err(_) => return unsupported(out, Reason::CfaOffset),
                },
                REG_RBP => match u16::try_from(off) {
                    Ok(o) => Cfa::Rbp(o),
                    Err(_) => return unsupported(out, Reason::CfaOffset),
                },
                r if r < 16 => match u16::try_from(off) {
                    Ok(o) => Cfa::Register {
                        reg: r as u8,
                        offset: o,
                    },
                    Err(_) => return unsupported(out, Reason::CfaOffset),
                },
                _ => return unsupported(out, Reason::CfaRegister),
            }
        }
        CfaRule::Expression(_) => {
            let Some(o) = cfa_ops else {
                return unsupported(out, Reason::CfaExpression);
            };
            if let Some((off, t)) = expr::plt(&o) {
                match (u16::try_from(off), u8::try_from(t)) {
                    (Ok(offset), Ok(threshold)) => Cfa::Plt { offset, threshold },
                    _ => return unsupported(out, Reason::CfaExpression),
                }
            } else if let Some((reg, off, add)) = expr::deref(&o) {
                let (Ok(offset), Ok(add)) = (i16::try_from(off), u16::try_from(add)) else {
                    return unsupported(out, Reason::CfaExpression);
                };
                match reg {
                    REG_RSP => Cfa::DerefRsp { offset, add },
                    REG_RBP => Cfa::DerefRbp { offset, add },
                    _ => return unsupported(out, Reason::CfaExpression),
                }
            } else {
                return unsupported(out, Reason::CfaExpression);
            }
        }
    };

    // The return address.
    let ra = match row.register(X86_64::RA) {
        Some(RegisterRule::Offset(-8)) => ReturnAddress::AtCfaMinus8,
        None | Some(RegisterRule::Undefined) => ReturnAddress::Undefined,
        Some(_) => return unsupported(out, Reason::ReturnAddress),
    };

    // The caller's RBP.
    let rbp_rule = row.register(X86_64::RBP);
    let rbp = match &rbp_rule {
        None | Some(RegisterRule::SameValue) => SavedRbp::Unchanged,
        Some(RegisterRule::Undefined) => SavedRbp::Lost,
        Some(RegisterRule::Offset(n)) => i16::try_from(*n).map_or(SavedRbp::Lost, SavedRbp::AtCfa),
        Some(RegisterRule::Expression(_)) => {
            match reg_ops(rbp_rule.clone())
                .as_deref()
                .and_then(expr::reg_offset)
            {
                Some((REG_RBP, n)) => i16::try_from(n).map_or(SavedRbp::Lost, SavedRbp::AtRbp),
                _ => SavedRbp::Lost,
            }
        }
        Some(_) => SavedRbp::Lost,
    };
    let known_rbp = !matches!(rbp_rule, None | Some(RegisterRule::Undefined));
    out.rbp_dropped = known_rbp && rbp == SavedRbp::Lost;

    let rule = Rule {
        cfa,
        rbp,
        ra,
        signal_frame: signal,
    };
    fit(out, rule, Arch::X86_64)
}

/// The row with `rule` if it encodes; else without the RBP rule (x29 on
/// AArch64), counted as dropped; else unsupported.
fn fit(mut out: Row, rule: Rule, arch: Arch) -> Row {
    if rule.encode(arch).is_some() {
        out.rule = rule;
        return out;
    }
    // A CFA that fits with an RBP rule that does not: keep unwinding
    // without RBP.
    let without_rbp = Rule {
        rbp: SavedRbp::Lost,
        ..rule
    };
    if rule.rbp != SavedRbp::Lost && without_rbp.encode(arch).is_some() {
        out.rule = without_rbp;
        out.rbp_dropped = true;
        return out;
    }
    out.unsupported = Some(match rule.ra {
        ReturnAddress::Lr => Reason::ReturnAddress,
        _ => Reason::CfaOffset,
    });
    out
}

/// The rule of one AArch64 row: CFA from SP, x29 or a lower register;
/// the return address in x30 (not yet saved) or saved in the frame; x29
/// unchanged or saved. The kernel's signal trampoline in the vDSO
/// (`__kernel_rt_sigreturn`, the only signal frame there is: the C library
/// has none of its own) describes only the frame record the kernel pushed,
/// whose return address is the interrupted code's x30, not its PC: it
/// becomes `Cfa::SigContext`, read from the signal frame itself.
fn convert_aarch64<T: gimli::ReaderOffset>(
    row: &UnwindTableRow<T>,
    start: u64,
    end: u64,
    signal: bool,
) -> Row {
    let mut out = Row {
        start,
        end,
        rule: Rule::unsupported(signal),
        unsupported: None,
        rbp_dropped: false,
    };
    let unsupported = |mut out: Row, why: Reason| {
        out.unsupported = Some(why);
        out
    };
    let (reg, off) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => (register.0, *offset),
        CfaRule::Expression(_) => return unsupported(out, Reason::CfaExpression),
    };
    let fp_rule = row.register(AArch64::X29);
    let ra_rule = row.register(AArch64::X30);
    if signal
        && reg == REG_X29
        && off == 0
        && matches!(fp_rule, Some(RegisterRule::Offset(0)))
        && matches!(ra_rule, Some(RegisterRule::Offset(8)))
    {
        out.rule = Rule::sigcontext(signal);
        return out;
    }
    let cfa = match reg {
        REG_SP => match u32::try_from(off) {
            Ok(o) => Cfa::Rsp(o),
            Err(_) => return unsupported(out, Reason::CfaOffset),
        },
        REG_X29 => match u16::try_from(off) {
            Ok(o) => Cfa::Rbp(o),
            Err(_) => return unsupported(out, Reason::CfaOffset),
        },
        r if r < REG_X29 => match u16::try_from(off) {
            Ok(o) => Cfa::Register {
                reg: r as u8,
                offset: o,
            },
            Err(_) => return unsupported(out, Reason::CfaOffset),
        },
        _ => return unsupported(out, Reason::CfaRegister),
    };
    let ra = match ra_rule {
        None | Some(RegisterRule::SameValue) => ReturnAddress::Lr,
        Some(RegisterRule::Undefined) => ReturnAddress::Undefined,
        Some(RegisterRule::Offset(n)) => match i16::try_from(n) {
            Ok(o) => ReturnAddress::AtCfa(o),
            Err(_) => return unsupported(out, Reason::ReturnAddress),
        },
        Some(_) => return unsupported(out, Reason::ReturnAddress),
    };
    let rbp = match &fp_rule {
        None | Some(RegisterRule::SameValue) => SavedRbp::Unchanged,
        Some(RegisterRule::Offset(n)) => i16::try_from(*n).map_or(SavedRbp::Lost, SavedRbp::AtCfa),
        Some(_) => SavedRbp::Lost,
    };
    let known_fp = !matches!(fp_rule, None | Some(RegisterRule::Undefined));
    out.rbp_dropped = known_fp && rbp == SavedRbp::Lost;
    // The outermost frame: x29 may be anything, nothing is read past it.
    let rbp = if ra == ReturnAddress::Undefined {
        SavedRbp::Unchanged
    } else {
        rbp
    };
    fit(
        out,
        Rule {
            cfa,
            rbp,
            ra,
            signal_frame: signal,
        },
        Arch::Aarch64,
    )
}
