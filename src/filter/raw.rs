//! Text that is not all UTF-8. A script's comments and strings may hold
//! any bytes (bpftrace reads them as bytes), while its tree holds Rust
//! strings: each byte that is not part of valid UTF-8 becomes one
//! character of a private-use block (U+10FE80..U+10FEFF), and is turned
//! back into that byte where text leaves the program (string constants to
//! the kernel, output).

use std::borrow::Cow;

/// Byte b >= 0x80 of invalid UTF-8 is the character BASE + b.
const BASE: u32 = 0x10_FE00;

/// The text of `bytes`, each byte of invalid UTF-8 kept as its character.
pub fn decode(bytes: &[u8]) -> Cow<'_, str> {
    if let Ok(s) = std::str::from_utf8(bytes) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for &b in chunk.invalid() {
            out.push(char::from_u32(BASE + u32::from(b)).unwrap_or('\u{fffd}'));
        }
    }
    Cow::Owned(out)
}

/// The bytes `s` stands for: [`decode`] undone.
pub fn encode(s: &str) -> Cow<'_, [u8]> {
    if !s.chars().any(is_raw) {
        return Cow::Borrowed(s.as_bytes());
    }
    let mut out = Vec::with_capacity(s.len());
    for c in s.chars() {
        if is_raw(c) {
            out.push((c as u32 - BASE) as u8);
        } else {
            let mut b = [0; 4];
            out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
        }
    }
    Cow::Owned(out)
}

/// The first `n` bytes of `s` (NULs after its end) as 8-byte words with
/// masks, to compare a string with a constant a word at a time: the last
/// word's mask keeps only the bytes inside the `n`.
pub fn masked_words(s: &[u8], n: usize) -> Vec<(u64, u64)> {
    (0..n.div_ceil(8))
        .map(|w| {
            let mut word = [0u8; 8];
            for (i, b) in word.iter_mut().enumerate() {
                *b = s.get(8 * w + i).copied().unwrap_or(0);
            }
            let bytes = (n - 8 * w).min(8);
            let mask = if bytes == 8 {
                u64::MAX
            } else {
                (1u64 << (8 * bytes)) - 1
            };
            (u64::from_ne_bytes(word) & mask, mask)
        })
        .collect()
}

/// Bytes `s` stands for.
pub fn len(s: &str) -> usize {
    encode(s).len()
}

fn is_raw(c: char) -> bool {
    (BASE + 0x80..=BASE + 0xff).contains(&(c as u32))
}

#[cfg(test)]
mod tests {

    #[test]
    fn masked_words_cover_the_first_n_bytes() {
        let w = masked_words(b"umaskloop", 10);
        assert_eq!(w.len(), 2);
        assert_eq!(w[0], (u64::from_ne_bytes(*b"umaskloo"), u64::MAX));
        let m = u64::from_ne_bytes([0xff, 0xff, 0, 0, 0, 0, 0, 0]);
        assert_eq!(w[1], (u64::from_ne_bytes(*b"p\0\0\0\0\0\0\0"), m));
        assert_eq!(
            masked_words(b"ab", 8),
            vec![(u64::from_ne_bytes(*b"ab\0\0\0\0\0\0"), u64::MAX)]
        );
        assert!(masked_words(b"ab", 0).is_empty());
    }
    use super::*;

    #[test]
    fn invalid_bytes_round_trip() {
        let bytes = b"a\xe9b \xff\xfe // caf\xc3\xa9";
        let s = decode(bytes);
        assert!(s.starts_with('a') && s.ends_with("café"));
        assert_eq!(&*encode(&s), &bytes[..]);
        assert_eq!(len(&s), bytes.len());
        assert_eq!(&*encode("plain"), b"plain");
    }
}
