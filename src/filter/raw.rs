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

/// Bytes `s` stands for.
pub fn len(s: &str) -> usize {
    encode(s).len()
}

fn is_raw(c: char) -> bool {
    (BASE + 0x80..=BASE + 0xff).contains(&(c as u32))
}

#[cfg(test)]
mod tests {
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
