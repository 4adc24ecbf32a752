//! Plain-old-data reads and writes of the structs shared with BPF
//! programs (map keys and values, ring-buffer records).

/// A `#[repr(C)]` type made only of integers and arrays of them, with no
/// implicit padding, so every bit pattern is a valid value and every byte
/// of a value is initialized.
///
/// # Safety
/// Implement it only for types that satisfy the above; the BPF crate does
/// so for the types generated from its headers (which pad explicitly).
pub unsafe trait Pod: Copy + Default {}

// SAFETY: integers have no padding and every bit pattern is valid.
unsafe impl Pod for u64 {}
// SAFETY: as above.
unsafe impl Pod for u32 {}
// SAFETY: as above.
unsafe impl Pod for i64 {}

/// The bytes of a value, for writing it into a map.
pub fn bytes<T: Pod>(v: &T) -> &[u8] {
    // SAFETY: Pod guarantees that every byte of T is initialized; the
    // slice borrows v and has its size.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

/// Reads a value from the front of `b`; None when `b` is too short.
pub fn read<T: Pod>(b: &[u8]) -> Option<T> {
    if b.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: the length was checked; Pod guarantees that every bit
    // pattern is valid; read_unaligned needs no alignment.
    Some(unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<T>()) })
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip() {
        let v = 0x0102_0304_0506_0708u64;
        assert_eq!(super::read::<u64>(super::bytes(&v)), Some(v));
        assert_eq!(super::read::<u64>(&[1, 2, 3]), None);
    }
}
