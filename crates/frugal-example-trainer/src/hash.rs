//! The checksum of checkpoints, model files and the data file.

/// FNV-1a, 64-bit: a few lines, and plenty to catch torn or flipped bytes.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
