//! The sched tracepoints' record fields as their arguments give them. The
//! classic tracepoint copies these fields from the tasks its arguments
//! point to (each event's TP_fast_assign) into a record built before any
//! program runs; a program on the raw or typed tracepoint gets the
//! pointers and reads the same members itself, without the record.

/// A task_struct member a record field copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Member {
    Pid,
    Prio,
    /// The 16 bytes of `comm`.
    Comm,
}

impl Member {
    /// Its name in task_struct.
    pub fn name(self) -> &'static str {
        match self {
            Member::Pid => "pid",
            Member::Prio => "prio",
            Member::Comm => "comm",
        }
    }
}

/// The argument whose task record field `field` of `event` is copied
/// from, and the member copied; None for the fields computed otherwise
/// (sched_switch's `prev_state`, sched_wakeup's `target_cpu`) and for
/// other events.
pub fn task_field(event: &str, field: &str) -> Option<(u8, Member)> {
    use Member::*;
    Some(match (event, field) {
        // TP_PROTO(struct task_struct *p)
        ("sched_wakeup" | "sched_wakeup_new" | "sched_waking", f) => match f {
            "pid" => (0, Pid),
            "prio" => (0, Prio),
            "comm" => (0, Comm),
            _ => return None,
        },
        // TP_PROTO(bool preempt, struct task_struct *prev,
        //          struct task_struct *next, unsigned int prev_state)
        ("sched_switch", f) => match f {
            "prev_pid" => (1, Pid),
            "prev_prio" => (1, Prio),
            "prev_comm" => (1, Comm),
            "next_pid" => (2, Pid),
            "next_prio" => (2, Prio),
            "next_comm" => (2, Comm),
            _ => return None,
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_copied_from_tasks() {
        assert_eq!(
            task_field("sched_switch", "next_comm"),
            Some((2, Member::Comm))
        );
        assert_eq!(
            task_field("sched_switch", "prev_pid"),
            Some((1, Member::Pid))
        );
        assert_eq!(task_field("sched_waking", "prio"), Some((0, Member::Prio)));
        // Computed, not copied.
        assert_eq!(task_field("sched_switch", "prev_state"), None);
        assert_eq!(task_field("sched_wakeup", "target_cpu"), None);
        // Another event's names.
        assert_eq!(task_field("sched_switch", "pid"), None);
        assert_eq!(task_field("sched_process_exit", "pid"), None);
    }
}
