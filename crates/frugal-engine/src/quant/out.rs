//! A batch x rows output filled by several threads in disjoint row ranges.
//!
//! Each parallel task owns a range of output rows but writes them for every activation row, so
//! its share of `out` is `batch` separate strips, which `chunks_mut` cannot hand out without
//! collecting sub-slices per call. [`StripedOut::run_parts`] does it without allocating: it
//! checks that the parts' column ranges are ascending and disjoint, then gives each task a
//! [`Part`] whose writes are bounds-checked against its own range. A `Part` is not `Sync`, so
//! a task cannot share its part with a second thread.
#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::ops::Range;

use rayon::prelude::*;

pub(crate) struct StripedOut<'a> {
    ptr: *mut f32,
    len: usize,
    /// Distance between the starts of consecutive activation rows' outputs (= columns).
    stride: usize,
    _borrow: PhantomData<&'a mut [f32]>,
}

/// Shared view used only inside `run_parts`, where every thread writes through its own `Part`.
struct Shared<'s, 'a>(&'s StripedOut<'a>);
// SAFETY: `run_parts` hands each index a `Part` with a column range disjoint from all others
// (checked before any task starts), and `Part::write` stays inside its range, so concurrent
// tasks never touch the same element.
unsafe impl Sync for Shared<'_, '_> {}

pub(crate) struct Part<'s> {
    base: *mut f32,
    len: usize,
    stride: usize,
    cols: Range<usize>,
    /// Raw pointers make `Part` neither `Send` nor `Sync`: it stays on the thread it was
    /// given to, so its range has one writer.
    _borrow: PhantomData<&'s mut [f32]>,
}

impl<'a> StripedOut<'a> {
    pub(crate) fn new(out: &'a mut [f32], stride: usize) -> StripedOut<'a> {
        StripedOut {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            stride,
            _borrow: PhantomData,
        }
    }

    /// Run `f(i, part)` for `i in 0..n`, part `i` covering columns `cols(i)`, in parallel on
    /// `pool` when given. Returns false, running nothing, unless the ranges are ascending,
    /// disjoint and within the stride.
    pub(crate) fn run_parts<C, F>(
        &mut self,
        n: usize,
        cols: C,
        pool: Option<&rayon::ThreadPool>,
        f: F,
    ) -> bool
    where
        C: Fn(usize) -> Range<usize> + Sync,
        F: Fn(usize, &Part<'_>) + Sync,
    {
        let mut prev_end = 0;
        for i in 0..n {
            let c = cols(i);
            if c.start < prev_end || c.start > c.end || c.end > self.stride {
                return false;
            }
            prev_end = c.end;
        }
        let shared = Shared(self);
        let task = |i: usize| {
            let s = &shared;
            let part = Part {
                base: s.0.ptr,
                len: s.0.len,
                stride: s.0.stride,
                cols: cols(i),
                _borrow: PhantomData,
            };
            f(i, &part);
        };
        match pool {
            Some(pool) if n > 1 => pool.install(|| (0..n).into_par_iter().for_each(task)),
            _ => (0..n).for_each(task),
        }
        true
    }
}

impl Part<'_> {
    /// Copy `vals` to columns `col..col + vals.len()` of activation row `b`. Writes nothing
    /// (and returns false) outside this part's columns or past the end of the output.
    pub(crate) fn write(&self, b: usize, col: usize, vals: &[f32]) -> bool {
        let end = col + vals.len();
        let Some(start) = b.checked_mul(self.stride).and_then(|s| s.checked_add(col)) else {
            return false;
        };
        if col < self.cols.start || end > self.cols.end || start + vals.len() > self.len {
            return false;
        }
        // SAFETY: start..start + len lies inside the borrowed output (checked), inside this
        // part's columns, which no other part overlaps (checked by `run_parts`), and this part
        // is used by one thread only (it is not Sync/Send). `vals` is a different slice.
        unsafe {
            std::ptr::copy_nonoverlapping(vals.as_ptr(), self.base.add(start), vals.len());
        }
        true
    }
}
