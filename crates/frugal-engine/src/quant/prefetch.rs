//! Where the SIMD kernels prefetch the weights they will stream (see [`Prefetch`]).

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

/// Where the SIMD kernels prefetch the weights they will stream: the cache level, and so
/// how far ahead. Only a hint, so results never depend on it, only the speed: on the Intel
/// Xeon hosts measured `L1` streamed a decode step fastest, on AMD EPYC (Zen 4) `L2` decoded
/// 1.3x faster. `model::calibrate` measures both at start; `FRUGAL_PREFETCH=l1|l2` fixes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefetch {
    /// `prefetcht0` 32 blocks ahead (8 KiB of Q4, 16 KiB of Q8).
    L1,
    /// `prefetcht1` 16 KiB ahead.
    L2,
}

/// The prefetch in use: 0 unset (then [`Prefetch::L1`]), else 1 + the variant's index.
static PREFETCH: AtomicU8 = AtomicU8::new(0);

impl Prefetch {
    pub const ALL: [Prefetch; 2] = [Prefetch::L1, Prefetch::L2];

    /// The prefetch the kernels use now: the one last [set](Prefetch::set), else `L1`.
    #[inline]
    pub fn active() -> Prefetch {
        match PREFETCH.load(Ordering::Relaxed) {
            2 => Prefetch::L2,
            _ => Prefetch::L1,
        }
    }

    /// Use `self` from the next tile on. Unlike the kernel it may change at any time: it
    /// moves no result, only the speed.
    pub fn set(self) {
        PREFETCH.store(self as u8 + 1, Ordering::Relaxed);
    }

    /// Whether one was [set](Prefetch::set) (by `FRUGAL_PREFETCH` or a calibration).
    pub fn is_set() -> bool {
        PREFETCH.load(Ordering::Relaxed) != 0
    }

    /// The prefetch for a name as `FRUGAL_PREFETCH` spells it: `l1` or `l2`.
    pub fn from_name(name: &str) -> Option<Prefetch> {
        match name.to_ascii_lowercase().as_str() {
            "l1" => Some(Prefetch::L1),
            "l2" => Some(Prefetch::L2),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Prefetch::L1 => "l1",
            Prefetch::L2 => "l2",
        }
    }
}

impl fmt::Display for Prefetch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
