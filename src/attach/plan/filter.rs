//! Pass 6, filter: the `--filter` expression compiled for each probe that
//! evaluates it, its names resolved to where that probe reads them. String
//! constants of all probes share one table.

use bpfscope_bpf::abi::bs_filter_op;

use super::sides::Side;
use super::source::name_src;
use super::{Path, Role, ValueKind};
use crate::error::Error;
use crate::filter::{self, Expr, Operand, StrTable};
use crate::probe::Probe;
use crate::usage;

/// The filter pass, per probe: its postfix program (empty: no filter here).
pub(super) fn compile(
    expr: Option<&Expr>,
    side: Side,
    probe: &Probe,
    role: Role,
    path: &Path,
    strs: &mut StrTable,
) -> Result<Vec<bs_filter_op>, Error> {
    let Some(expr) = expr.filter(|_| side.includes(role)) else {
        return Ok(Vec::new());
    };
    let mut resolve = |name: &str, column: usize| -> Result<Operand, Error> {
        let (src, kind, _) =
            name_src(probe, path, name).map_err(|e| usage!("filter: {e} (column {column})"))?;
        Ok(Operand {
            src,
            is_str: kind == ValueKind::Str,
        })
    };
    filter::compile(expr, &mut resolve, strs)
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use bpfscope_bpf::abi::bs_op;

    fn classic() -> Path {
        Path::Tracepoint {
            subsys: "sched".into(),
            event: "sched_switch".into(),
        }
    }

    fn ops(
        f: &str,
        side: Side,
        role: Role,
        strs: &mut StrTable,
    ) -> Result<Vec<bs_filter_op>, Error> {
        let e = filter::parse(f).unwrap();
        compile(Some(&e), side, &sched_switch(), role, &classic(), strs)
    }

    #[test]
    fn names_resolve_to_the_probes_record() {
        let mut strs = StrTable::default();
        let o = ops(
            r#"next_comm == "a*" && next_pid != 3"#,
            Side::All,
            Role::Plain,
            &mut strs,
        )
        .unwrap();
        let codes: Vec<u32> = o.iter().map(|o| u32::from(o.op)).collect();
        assert_eq!(
            codes,
            [bs_op::BS_OP_GLOB.0, bs_op::BS_OP_NE.0, bs_op::BS_OP_AND.0]
        );
        assert_eq!((o[0].src.off, o[1].src.off, o[1].imm), (40, 56, 3));
        assert_eq!(strs.strs, ["a*"]);
    }

    #[test]
    fn strings_are_shared_between_probes() {
        let mut strs = StrTable::default();
        ops(r#"prev_comm == "x""#, Side::All, Role::Plain, &mut strs).unwrap();
        ops(
            r#"next_comm != "y" || prev_comm == "x""#,
            Side::All,
            Role::Plain,
            &mut strs,
        )
        .unwrap();
        assert_eq!(strs.strs, ["x", "y"]);
    }

    #[test]
    fn only_the_side_that_evaluates_it() {
        let mut strs = StrTable::default();
        assert!(ops("next_pid > 1", Side::Start, Role::End(0), &mut strs)
            .unwrap()
            .is_empty());
        assert_eq!(
            ops("next_pid > 1", Side::End, Role::End(0), &mut strs)
                .unwrap()
                .len(),
            1
        );
        assert!(compile(
            None,
            Side::All,
            &sched_switch(),
            Role::Plain,
            &classic(),
            &mut strs
        )
        .unwrap()
        .is_empty());
    }

    #[test]
    fn unknown_names_say_where() {
        let mut strs = StrTable::default();
        let e = ops("next_pid > 1 && nope", Side::All, Role::Plain, &mut strs).unwrap_err();
        let e = e.to_string();
        assert!(
            e.starts_with("filter: tracepoint:sched:sched_switch has no field 'nope'"),
            "{e}"
        );
        assert!(e.ends_with("(column 17)"), "{e}");
    }
}
