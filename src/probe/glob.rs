//! Glob matching with `*` and `?`.
//!
//! Hand-rolled on purpose: the same algorithm (greedy with one backtrack
//! point) runs in the kernel for string filters (trace.bpf.c,
//! bs_glob_step), and user-space matching of probe names must agree with it.

/// True when `s` matches `pat`.
pub fn matches(pat: &str, s: &str) -> bool {
    let (p, s) = (pat.as_bytes(), s.as_bytes());
    let (mut i, mut j) = (0usize, 0usize);
    let mut star: Option<usize> = None;
    let mut mark = 0usize;
    while i < s.len() {
        if j < p.len() && p[j] == b'*' {
            star = Some(j);
            mark = i;
            j += 1;
        } else if j < p.len() && (p[j] == b'?' || p[j] == s[i]) {
            i += 1;
            j += 1;
        } else if let Some(st) = star {
            j = st + 1;
            mark += 1;
            i = mark;
        } else {
            return false;
        }
    }
    p[j..].iter().all(|&c| c == b'*')
}

/// True when the pattern has wildcards.
pub fn is_glob(pat: &str) -> bool {
    pat.contains(['*', '?'])
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn globs() {
        assert!(matches("sys_enter_*", "sys_enter_write"));
        assert!(matches("*open*", "sys_enter_openat"));
        assert!(!matches("*open*", "sys_enter_close"));
        assert!(matches("b?sh", "bash"));
        assert!(matches("*", ""));
        assert!(!matches("a", ""));
        assert!(matches("a*b*c", "aXbYbZc"));
        assert!(!matches("a*b*c", "aXbYbZ"));
        assert!(matches("bash", "bash"));
        assert!(!matches("bash", "bashx"));
    }
}
