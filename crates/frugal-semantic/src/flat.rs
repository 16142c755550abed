//! The exact index: every entry scanned, one dot product each, compiled for the CPU's widest
//! vectors. `VectorIndex` (see `index`) searches it while small, and the graph (`hnsw`)
//! returns scores computed the same way.

use frugal_engine::quant::{Wide, dot_f32, vectorized};

/// Vectors with caller-chosen ids; removal swaps the last entry in.
#[derive(Debug, Default)]
pub struct FlatIndex {
    dim: usize,
    ids: Vec<u64>,
    data: Vec<f32>,
}

/// One neighbour: the id it was added with and its cosine similarity to the query.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Neighbour {
    pub id: u64,
    pub score: f32,
}

impl FlatIndex {
    pub fn new(dim: usize) -> FlatIndex {
        FlatIndex {
            dim,
            ids: Vec::new(),
            data: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Add a unit vector of this index's width (other widths are ignored: they cannot be
    /// compared).
    pub fn add(&mut self, id: u64, v: &[f32]) {
        if v.len() == self.dim {
            self.ids.push(id);
            self.data.extend_from_slice(v);
        }
    }

    /// Remove every vector added under `id`; true if there was one.
    pub fn remove(&mut self, id: u64) -> bool {
        let mut found = false;
        let mut i = 0;
        while i < self.ids.len() {
            if self.ids[i] == id {
                let last = self.ids.len() - 1;
                self.ids.swap_remove(i);
                if i != last {
                    let (head, tail) = self.data.split_at_mut(last * self.dim);
                    head[i * self.dim..(i + 1) * self.dim].copy_from_slice(&tail[..self.dim]);
                }
                self.data.truncate(last * self.dim);
                found = true;
            } else {
                i += 1;
            }
        }
        found
    }

    /// The `k` most similar entries, best first.
    pub fn search(&self, q: &[f32], k: usize) -> Vec<Neighbour> {
        let mut best: Vec<Neighbour> = Vec::with_capacity(k + 1);
        if q.len() != self.dim || k == 0 {
            return best;
        }
        let mut scores = vec![0f32; self.ids.len()];
        vectorized(Scan {
            q,
            data: &self.data,
            scores: &mut scores,
        });
        for (&id, &score) in self.ids.iter().zip(&scores) {
            if best.len() == k && best[k - 1].score >= score {
                continue;
            }
            let at = best.partition_point(|n| n.score >= score);
            best.insert(at, Neighbour { id, score });
            best.truncate(k);
        }
        best
    }

    /// The `i`th entry, in the order of adding (a removal moves the last entry into its
    /// place): its id and vector.
    pub(crate) fn entry(&self, i: usize) -> Option<(u64, &[f32])> {
        let id = *self.ids.get(i)?;
        Some((id, self.data.get(i * self.dim..(i + 1) * self.dim)?))
    }

    /// Bytes held per entry (vector and id).
    pub fn bytes_per_entry(&self) -> usize {
        self.dim * size_of::<f32>() + size_of::<u64>()
    }
}

/// Every entry's similarity to the query, compiled for the CPU's widest vectors (the build
/// targets baseline x86-64: 4 lanes, where this runs at a quarter of the speed).
struct Scan<'a> {
    q: &'a [f32],
    data: &'a [f32],
    scores: &'a mut [f32],
}

impl Wide for Scan<'_> {
    #[inline(always)]
    fn run(self) {
        for (s, v) in self
            .scores
            .iter_mut()
            .zip(self.data.chunks_exact(self.q.len()))
        {
            *s = dot_f32(self.q, v);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::synthetic::seeded_unit as unit;

    #[test]
    fn search_matches_brute_force_order() {
        let dim = 37; // not a multiple of 8: exercises the tail
        let mut idx = FlatIndex::new(dim);
        let vs: Vec<Vec<f32>> = (0..500).map(|i| unit(i, dim)).collect();
        for (i, v) in vs.iter().enumerate() {
            idx.add(i as u64, v);
        }
        let q = unit(9999, dim);
        let mut want: Vec<(u64, f32)> = vs
            .iter()
            .enumerate()
            .map(|(i, v)| (i as u64, v.iter().zip(&q).map(|(a, b)| a * b).sum()))
            .collect();
        want.sort_by(|a, b| b.1.total_cmp(&a.1));
        let got = idx.search(&q, 5);
        assert_eq!(got.len(), 5);
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.id, w.0);
            assert!((g.score - w.1).abs() < 1e-5);
        }
        assert_eq!(idx.search(&vs[42], 1)[0].id, 42);
    }

    #[test]
    fn remove_keeps_the_others_findable() {
        let dim = 16;
        let mut idx = FlatIndex::new(dim);
        for i in 0..10 {
            idx.add(i, &unit(i, dim));
        }
        assert!(idx.remove(0));
        assert!(idx.remove(9));
        assert!(!idx.remove(9));
        assert_eq!(idx.len(), 8);
        for i in 1..9 {
            assert_eq!(idx.search(&unit(i, dim), 1)[0].id, i);
        }
        assert!(idx.search(&unit(0, dim), 10).iter().all(|n| n.id != 0));
    }

    #[test]
    fn wrong_width_and_empty_index() {
        let mut idx = FlatIndex::new(4);
        idx.add(1, &[1.0, 0.0]);
        assert!(idx.is_empty());
        assert!(idx.search(&[1.0, 0.0, 0.0, 0.0], 3).is_empty());
        idx.add(1, &[1.0, 0.0, 0.0, 0.0]);
        assert!(idx.search(&[1.0, 0.0], 3).is_empty());
        assert_eq!(idx.search(&[1.0, 0.0, 0.0, 0.0], 3).len(), 1);
    }
}
