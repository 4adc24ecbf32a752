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

/// Marks a synthetic id: bpfscope's name for a file that has no build id
/// (Go's linker, some toolchains), so that it can be recorded and
/// symbolized like the rest. Real build ids are hashes; one starting with
/// these five bytes is not expected.
const SYNTHETIC: &[u8; 5] = b"\0bsf:";

/// A synthetic id for a file with no build id, from its identity on disk
/// (device, inode, size, modification time): the same file gives the same
/// id for as long as it is unchanged.
pub fn synthetic(meta: &std::fs::Metadata) -> Vec<u8> {
    use std::os::unix::fs::MetadataExt;
    let mut h1: u64 = 0xcbf2_9ce4_8422_2325;
    let mut h2: u64 = 0x8422_2325_cbf2_9ce4;
    for v in [
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime() as u64,
        meta.mtime_nsec() as u64,
    ] {
        for b in v.to_le_bytes() {
            h1 = (h1 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            h2 = (h2 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3 ^ 0x9e37);
        }
    }
    let mut id = SYNTHETIC.to_vec();
    id.extend(&h1.to_le_bytes());
    id.extend(&h2.to_le_bytes()[..7]);
    id
}

/// Whether an id is one `synthetic` made.
pub fn is_synthetic(id: &[u8]) -> bool {
    id.len() == 20 && id.starts_with(SYNTHETIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_ids_follow_the_file() {
        let dir = std::env::temp_dir().join(format!("bpfscope-synth-{}", std::process::id()));
        std::fs::write(&dir, b"one").unwrap();
        let a = synthetic(&std::fs::metadata(&dir).unwrap());
        assert!(is_synthetic(&a));
        assert_eq!(a, synthetic(&std::fs::metadata(&dir).unwrap()));
        std::fs::write(&dir, b"other content").unwrap();
        assert_ne!(a, synthetic(&std::fs::metadata(&dir).unwrap()));
        let _ = std::fs::remove_file(&dir);
        assert!(!is_synthetic(&[7; 20]));
    }

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
