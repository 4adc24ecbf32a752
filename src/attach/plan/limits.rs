//! The limits of the BPF side, checked where each pass reaches them, and
//! the largest part counts of a finished plan, which specialize the
//! programs at load (loops bounded by what this plan needs).

use bpfscope_bpf::abi::bs_limits;

use super::PlannedProbe;
use crate::error::Error;
use crate::usage;

/// `--match` fields.
pub(super) fn match_fields(n: usize) -> Result<(), Error> {
    if n > bs_limits::BS_MAX_MATCH.0 as usize {
        return Err(usage!(
            "--match: at most {} fields",
            bs_limits::BS_MAX_MATCH.0
        ));
    }
    Ok(())
}

/// Bytes of key data after the key header.
pub(super) fn key_bytes(n: usize) -> Result<(), Error> {
    if n > bs_limits::BS_KEY_MAX.0 as usize {
        return Err(usage!(
            "--by: keys take {n} bytes, more than the {} bpfscope keeps; use fewer string keys",
            bs_limits::BS_KEY_MAX.0
        ));
    }
    Ok(())
}

/// Fields one probe's events carry.
pub(super) fn event_fields(probe: &str, n: usize) -> Result<(), Error> {
    let max = bs_limits::BS_MAX_EMIT.0 as usize;
    if n > max {
        return Err(usage!(
            "{probe}: {n} fields to print, at most {max}; name fewer with --fields"
        ));
    }
    Ok(())
}

/// Bytes of one probe's event data after the event header.
pub(super) fn event_bytes(probe: &str, n: usize) -> Result<(), Error> {
    if n >= bs_limits::BS_EVENT_DATA_MAX.0 as usize {
        return Err(usage!(
            "{probe}: the fields take {n} bytes per event, more than {}; name fewer with --fields",
            bs_limits::BS_EVENT_DATA_MAX.0 - 1
        ));
    }
    Ok(())
}

/// The largest filter, key and event part counts over a plan's probes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Maxima {
    pub filter: usize,
    pub keys: usize,
    pub emit: usize,
}

impl Maxima {
    pub(super) fn of(probes: &[PlannedProbe]) -> Maxima {
        let most = |n: fn(&PlannedProbe) -> u8| {
            probes.iter().map(|p| usize::from(n(p))).max().unwrap_or(0)
        };
        Maxima {
            filter: most(|p| p.cfg.nfilter),
            keys: most(|p| p.cfg.nkeys),
            emit: most(|p| p.cfg.nemit),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_and_past_each_limit() {
        assert!(match_fields(4).is_ok());
        assert_eq!(
            match_fields(5).unwrap_err().to_string(),
            "--match: at most 4 fields"
        );
        assert!(key_bytes(256).is_ok());
        assert!(key_bytes(257).is_err());
        assert!(event_fields("p", 16).is_ok());
        assert_eq!(
            event_fields("p", 17).unwrap_err().to_string(),
            "p: 17 fields to print, at most 16; name fewer with --fields"
        );
        assert!(event_bytes("p", 1023).is_ok());
        assert_eq!(
            event_bytes("p", 1024).unwrap_err().to_string(),
            "p: the fields take 1024 bytes per event, more than 1023; name fewer with --fields"
        );
    }

    #[test]
    fn maxima_of_no_probes() {
        assert_eq!(Maxima::of(&[]), Maxima::default());
    }
}
