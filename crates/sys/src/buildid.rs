//! ELF build ids as the kernel stores them and as people read them.

/// Build id as lowercase hex.
pub fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// Build ids are 20 bytes in the kernel's records; shorter ones (MD5
/// style, 16 bytes) are zero-padded there.
pub fn trim(id: &[u8; 20]) -> &[u8] {
    let n = id.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    if n <= 16 {
        &id[..16]
    } else {
        &id[..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_trim() {
        assert_eq!(hex(&[0x0a, 0xff]), "0aff");
        let mut id = [0u8; 20];
        id[..16].copy_from_slice(&[7; 16]);
        assert_eq!(trim(&id).len(), 16);
        id[19] = 1;
        assert_eq!(trim(&id).len(), 20);
    }
}
