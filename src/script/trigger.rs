//! Which of a script's blocks bpfscope runs itself, and when: BEGIN before
//! the other probes are attached, each interval on its period, END after
//! the others are detached. They run in the kernel like every other block
//! (`Session::fire`, BPF_PROG_TEST_RUN of the trigger program with the
//! probe's index), so their effects on maps and records are exactly those
//! of the same code anywhere else.

use std::time::{Duration, Instant};

use super::ir::{Lowered, Trigger};

/// Probe indexes of the triggers of one kind, in script order.
pub fn of(low: &Lowered, which: Trigger) -> Vec<usize> {
    low.probes
        .iter()
        .enumerate()
        .filter(|(_, p)| p.trigger == Some(which))
        .map(|(i, _)| i)
        .collect()
}

/// The intervals of a script and when each is next due.
pub struct Intervals {
    due: Vec<(usize, Duration, Instant)>,
}

impl Intervals {
    pub fn new(low: &Lowered, start: Instant) -> Intervals {
        let due = low
            .probes
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match p.trigger {
                Some(Trigger::Interval { ms }) => {
                    let every = Duration::from_millis(ms);
                    Some((i, every, start + every))
                }
                _ => None,
            })
            .collect();
        Intervals { due }
    }

    /// The probes due at `now`; each is then due a period later (a run
    /// that fell behind skips the periods it missed).
    pub fn take_due(&mut self, now: Instant) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, every, next) in &mut self.due {
            if now >= *next {
                out.push(*i);
                *next += *every;
                if *next < now {
                    *next = now + *every;
                }
            }
        }
        out
    }

    /// How long until the next is due (None: no intervals).
    pub fn wait(&self, now: Instant) -> Option<Duration> {
        self.due
            .iter()
            .map(|(_, _, n)| n.saturating_duration_since(now))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_fire_on_their_periods_and_skip_missed_ones() {
        let t0 = Instant::now();
        let mut iv = Intervals {
            due: vec![
                (
                    3,
                    Duration::from_millis(100),
                    t0 + Duration::from_millis(100),
                ),
                (
                    5,
                    Duration::from_millis(250),
                    t0 + Duration::from_millis(250),
                ),
            ],
        };
        assert!(iv.take_due(t0).is_empty());
        assert_eq!(iv.wait(t0), Some(Duration::from_millis(100)));
        assert_eq!(iv.take_due(t0 + Duration::from_millis(100)), vec![3]);
        // Far behind: both fire once, then are due a period from now.
        let late = t0 + Duration::from_millis(1000);
        assert_eq!(iv.take_due(late), vec![3, 5]);
        assert_eq!(iv.wait(late), Some(Duration::from_millis(100)));
    }
}
