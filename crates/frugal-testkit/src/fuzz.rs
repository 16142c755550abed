//! Support for the fuzz targets (`cargo test --release fuzz_`): how many cases a target
//! runs, and an allocator that turns a parser's huge allocation into a named failure.
//!
//! Each target is a proptest property run [`cases`] times: few in CI, where all of them
//! together stay within a minute, and `FUZZ_SCALE` times as many from `scripts/fuzz.sh`.
//! `PROPTEST_CASES`, proptest's own variable, sets an exact count instead.
//!
//! A crate whose targets bound what a parser allocates installs [`Capped`] as its test
//! binary's global allocator and runs the parser inside [`capped`]. Outside `capped` it
//! only forwards to the system allocator.

// Implementing `GlobalAlloc` takes `unsafe`; this one forwards every call to `System` and
// reads the bytes of the input it was given only while `capped` borrows them.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;

/// Cases a target runs: `ci` in CI, `ci * FUZZ_SCALE` when that is set, or exactly
/// `PROPTEST_CASES`. Says how many on stderr when either variable is set (the script's
/// report; `cargo test` shows it with `--nocapture`).
pub fn cases(target: &str, ci: u32) -> u32 {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok());
    let n = match (var("PROPTEST_CASES"), var("FUZZ_SCALE")) {
        (Some(n), _) => n,
        (None, Some(scale)) => ci.saturating_mul(scale),
        (None, None) => return ci,
    };
    #[allow(clippy::print_stderr)]
    {
        eprintln!("fuzz: {target}: {n} cases");
    }
    n
}

/// One mutation of a seed, as a property generates it: `(kind, at, len, pick)`, each read
/// modulo what it indexes, so any four numbers are a valid mutation and shrink toward the
/// seed itself.
pub type Mutation = (u8, u32, u32, u32);

/// Integers a length or count field is worth replacing with (little-endian, 8 bytes).
const INTERESTING: [u64; 9] = [
    0,
    1,
    0x7f,
    0xffff_ffff,
    0x1_0000_0000,
    1 << 40,
    i64::MAX as u64,
    u64::MAX - 7,
    u64::MAX,
];

/// `seed` with `mutations` applied in order, as a byte fuzzer mutates a real input: bit
/// flips, bytes set, ranges deleted or repeated, `dict`'s tokens inserted (the format's
/// separators and keywords), huge integers written over a field, a cut.
pub fn mutate(seed: &[u8], mutations: &[Mutation], dict: &[&[u8]]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for &(kind, at, len, pick) in mutations {
        let at = at as usize % (b.len() + 1);
        let len = (len as usize % 64).min(b.len() - at);
        match kind % 8 {
            0 if at < b.len() => b[at] ^= 1 << (pick % 8),
            1 if at < b.len() => b[at] = pick as u8,
            2 => {
                b.drain(at..at + len);
            }
            3 => {
                let copy = b[at..at + len].to_vec();
                let to = pick as usize % (b.len() + 1);
                b.splice(to..to, copy);
            }
            4 if !dict.is_empty() => {
                let token = dict[pick as usize % dict.len()];
                b.splice(at..at, token.iter().copied());
            }
            5 => b.truncate(at),
            6 => {
                let v = INTERESTING[pick as usize % INTERESTING.len()].to_le_bytes();
                let end = (at + 8).min(b.len());
                b[at..end].copy_from_slice(&v[..end - at]);
            }
            _ => {
                // A decimal number written over the bytes: huge, negative or odd.
                let n = INTERESTING[pick as usize % INTERESTING.len()] as i64;
                let text = if len.is_multiple_of(2) {
                    n.to_string()
                } else {
                    n.wrapping_neg().to_string()
                };
                b.splice(at..at + len, text.into_bytes());
            }
        }
    }
    b
}

thread_local! {
    /// The largest single allocation allowed on this thread (usize::MAX: no cap).
    static CAP: Cell<usize> = const { Cell::new(usize::MAX) };
    /// Bytes allocated minus bytes freed on this thread since `capped` began, and the most.
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    /// The input being parsed, printed when the cap is hit.
    static INPUT: Cell<(*const u8, usize)> = const { Cell::new((std::ptr::null(), 0)) };
}

/// A global allocator for test binaries: the system's, plus the cap and the count of
/// [`capped`].
pub struct Capped;

/// Runs `f` (a parser reading `input`) with single allocations on this thread capped at
/// `cap` bytes; returns what `f` returned and the most bytes `f` held at once on this
/// thread (allocated minus freed, from the start).
///
/// An allocation past the cap prints `input` and aborts the test binary ("memory allocation
/// of N bytes failed"): a parser that asks for gigabytes for a small input would otherwise
/// take the machine's memory before any assertion could run.
pub fn capped<T>(cap: usize, input: &[u8], f: impl FnOnce() -> T) -> (T, usize) {
    /// Lifts the cap and forgets the input however `f` ends (proptest catches panics).
    struct Lift;
    impl Drop for Lift {
        fn drop(&mut self) {
            CAP.set(usize::MAX);
            INPUT.set((std::ptr::null(), 0));
        }
    }
    LIVE.set(0);
    PEAK.set(0);
    INPUT.set((input.as_ptr(), input.len()));
    CAP.set(cap);
    let lift = Lift;
    let out = f();
    drop(lift);
    (out, PEAK.get().max(0) as usize)
}

/// Whether this thread may allocate `size` bytes; counts them if so.
fn admit(size: usize) -> bool {
    // `try_with`: a thread's locals may be gone while it exits (these have no destructor,
    // so they never are, but an allocator must not panic).
    let cap = CAP.try_with(Cell::get).unwrap_or(usize::MAX);
    if size > cap {
        refused(size, cap);
        return false;
    }
    let _ = LIVE.try_with(|live| {
        let now = live.get().saturating_add(size as isize);
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
    true
}

fn freed(size: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(size as isize)));
}

/// Names the input before the abort; writes without allocating.
fn refused(size: usize, cap: usize) {
    let (ptr, len) = INPUT.try_with(Cell::get).unwrap_or((std::ptr::null(), 0));
    let input: &[u8] = if ptr.is_null() {
        &[]
    } else {
        // SAFETY: `capped` set these from a slice that outlives its call to `f`, and clears
        // them before returning; this runs only within that call (the cap is set).
        unsafe { std::slice::from_raw_parts(ptr, len.min(4096)) }
    };
    let _ = writeln!(
        std::io::stderr(),
        "fuzz: an allocation of {size} bytes, past the cap of {cap}, from an input of {len} bytes: \"{}\"",
        input.escape_ascii()
    );
}

// SAFETY: every call forwards to `System` with the caller's layout and pointer; refusing
// (returning null) is allowed to any allocator.
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !admit(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as given.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !admit(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as given.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        freed(layout.size());
        // SAFETY: forwarded as given.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !admit(new_size) {
            return std::ptr::null_mut();
        }
        freed(layout.size());
        // SAFETY: forwarded as given.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
