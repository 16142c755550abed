//! The work [`vectorized`](super::vectorized) compiles for the CPU's vectors.

/// Plain f32 loops to compile for wide vectors: [`vectorized`] runs them inside a function
/// built for AVX-512 or AVX2, into which `run` (mark it `#[inline(always)]`, and what it
/// calls) is inlined. A closure would not do: it is not reliably inlined, and then runs at
/// baseline x86-64's width, which the build targets so that one binary runs everywhere.
pub trait Wide {
    fn run(self);
}
