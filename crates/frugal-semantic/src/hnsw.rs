//! A hierarchical navigable small-world graph (HNSW, Malkov & Yashunin 2016) over unit
//! vectors, for caches too large to scan.
//!
//! Written here rather than taken from `hnsw_rs` or `instant-distance` because a cache
//! deletes as often as it inserts (every insert past the cap evicts, and entries expire), and
//! neither crate deletes: `instant-distance` builds once, `hnsw_rs` only filters at query
//! time, so under churn their graphs fill with dead nodes. Here a removal takes the node out
//! of the graph at once: each node that linked to it is relinked, by the same neighbour
//! heuristic, among its remaining neighbours and the removed node's (FreshDiskANN's local
//! repair). For that every node keeps its in-links. No tombstones then: results need no
//! filtering, the freed slot is reused by the next insert, and memory follows the live count
//! under any add/remove churn, with no rebuild pause under the cache's lock. The price is a
//! removal costing about two inserts (~0.7 ms at 100k entries) and the in-links' memory,
//! part of the ~330 bytes an entry the graph adds to a 384-dim vector's 1,536.
//!
//! Similarity is the dot product (cosine on unit vectors), computed with the engine's SIMD
//! dot as `FlatIndex` computes it, so the scores returned are exact and equal to a flat
//! scan's; only which entries are found is approximate. Levels come from a seeded generator:
//! the same operations build the same graph.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Mutex, PoisonError};

use frugal_engine::quant::{Wide, dot_f32, vectorized};

use crate::flat::Neighbour;

/// The graph's knobs.
#[derive(Debug, Clone, Copy)]
pub struct HnswParams {
    /// Links per node on the upper layers (twice this on the bottom layer).
    pub m: usize,
    /// Candidates kept while linking a new node: build time against graph quality.
    pub ef_construction: usize,
    /// Candidates kept while searching (at least `k`): latency against recall.
    pub ef_search: usize,
    /// Seeds the level draw.
    pub seed: u64,
}

impl Default for HnswParams {
    /// M = 16 and ef_construction = 100, the paper's and hnswlib's usual middle ground.
    /// ef_search = 128: recall@1 0.95 at 300k clustered entries, 1.0 at 100k, for ~0.1 ms
    /// more than 64, which finds only 0.89 at 300k (BENCHMARKS.md); a missed neighbour is a
    /// lost cache hit, an upstream call.
    fn default() -> HnswParams {
        HnswParams {
            m: 16,
            ef_construction: 100,
            ef_search: 128,
            seed: 0x5EED_F00D,
        }
    }
}

/// Marks a slot that holds no entry (and is on the free list).
const FREE: u8 = u8::MAX;
/// Levels are capped well above what a billion entries would draw at M = 16.
const MAX_LEVEL: usize = 16;

/// Vectors with caller-chosen ids (one vector per id), linked as an HNSW graph.
#[derive(Debug)]
pub struct Hnsw {
    dim: usize,
    params: HnswParams,
    /// Slot s's vector at `s * dim`.
    data: Vec<f32>,
    ids: Vec<u64>,
    /// Each slot's top layer, or `FREE`.
    levels: Vec<u8>,
    /// Bottom-layer links, `m0 + 1` words a slot: the count, then the neighbours. Kept flat
    /// because the search reads them for every node it expands.
    links0: Vec<u32>,
    nodes: Vec<Node>,
    slots: HashMap<u64, u32>,
    free: Vec<u32>,
    entry: Option<u32>,
    rng: u64,
    /// Reused visited marks; a search that finds them busy makes its own.
    visited: Mutex<Visited>,
}

/// What a slot holds besides its vector and bottom-layer links.
#[derive(Debug, Default)]
struct Node {
    /// Nodes linking here on the bottom layer.
    rev0: Vec<u32>,
    /// Layers 1..=level, for the ~1/M of nodes above the bottom.
    up: Option<Box<Upper>>,
}

#[derive(Debug)]
struct Upper {
    /// `m + 1` words a layer, as `links0`.
    links: Vec<u32>,
    rev: Vec<Vec<u32>>,
}

/// A slot and its similarity to whatever is being searched for.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Cand {
    sim: f32,
    slot: u32,
}

impl Eq for Cand {}

impl Ord for Cand {
    fn cmp(&self, other: &Cand) -> Ordering {
        self.sim
            .total_cmp(&other.sim)
            .then(other.slot.cmp(&self.slot))
    }
}

impl PartialOrd for Cand {
    fn partial_cmp(&self, other: &Cand) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Visited marks by epoch, so a search clears nothing.
#[derive(Debug, Default)]
struct Visited {
    marks: Vec<u32>,
    epoch: u32,
}

impl Visited {
    fn start(&mut self, slots: usize) {
        if self.marks.len() < slots {
            self.marks.resize(slots, 0);
        }
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.marks.fill(0);
            self.epoch = 1;
        }
    }

    /// True the first time `slot` is seen in this search.
    #[inline(always)]
    fn insert(&mut self, slot: u32) -> bool {
        let m = &mut self.marks[slot as usize];
        let new = *m != self.epoch;
        *m = self.epoch;
        new
    }
}

impl Hnsw {
    pub fn new(dim: usize) -> Hnsw {
        Hnsw::with_params(dim, HnswParams::default())
    }

    pub fn with_params(dim: usize, params: HnswParams) -> Hnsw {
        let params = HnswParams {
            m: params.m.max(2),
            ef_construction: params.ef_construction.max(params.m),
            ..params
        };
        Hnsw {
            dim,
            params,
            data: Vec::new(),
            ids: Vec::new(),
            levels: Vec::new(),
            links0: Vec::new(),
            nodes: Vec::new(),
            slots: HashMap::new(),
            free: Vec::new(),
            entry: None,
            rng: params.seed,
            visited: Mutex::default(),
        }
    }

    /// Candidates kept while searching from now on (see `HnswParams::ef_search`).
    pub fn set_ef_search(&mut self, ef: usize) {
        self.params.ef_search = ef;
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn contains(&self, id: u64) -> bool {
        self.slots.contains_key(&id)
    }

    /// Every entry as (id, vector), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &[f32])> {
        self.slots.iter().map(|(&id, &s)| (id, self.vector(s)))
    }

    /// Add a unit vector of this index's width, replacing any under the same id (other widths
    /// are ignored: they cannot be compared).
    pub fn add(&mut self, id: u64, v: &[f32]) {
        if v.len() != self.dim {
            return;
        }
        self.remove(id);
        let level = self.draw_level();
        let slot = match self.free.pop() {
            Some(s) => {
                let at = s as usize;
                self.data[at * self.dim..(at + 1) * self.dim].copy_from_slice(v);
                self.ids[at] = id;
                self.levels[at] = level as u8;
                s
            }
            None => {
                let s = self.ids.len() as u32;
                self.data.extend_from_slice(v);
                self.ids.push(id);
                self.levels.push(level as u8);
                self.links0.resize(self.links0.len() + self.m0() + 1, 0);
                self.nodes.push(Node::default());
                s
            }
        };
        let stride = self.m0() + 1;
        self.links0[slot as usize * stride] = 0;
        self.nodes[slot as usize] = Node {
            rev0: Vec::new(),
            up: (level > 0).then(|| {
                Box::new(Upper {
                    links: vec![0; level * (self.params.m + 1)],
                    rev: vec![Vec::new(); level],
                })
            }),
        };
        self.slots.insert(id, slot);
        let mut visited = self.take_visited();
        vectorized(Insert {
            g: self,
            slot,
            visited: &mut visited,
        });
        *self
            .visited
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner) = visited;
    }

    /// Remove the vector under `id`; true if there was one.
    pub fn remove(&mut self, id: u64) -> bool {
        let Some(slot) = self.slots.remove(&id) else {
            return false;
        };
        vectorized(Unlink { g: self, slot });
        self.levels[slot as usize] = FREE;
        self.nodes[slot as usize] = Node::default();
        self.free.push(slot);
        if self.entry == Some(slot) {
            // The highest node left enters the graph (the first one, for determinism).
            self.entry = self
                .levels
                .iter()
                .enumerate()
                .filter(|&(_, &l)| l != FREE)
                .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0)))
                .map(|(s, _)| s as u32);
        }
        true
    }

    /// The `k` entries most similar to `q`, best first, with exact similarities; the graph
    /// search may miss some of the true `k` (see the recall tests).
    pub fn search(&self, q: &[f32], k: usize) -> Vec<Neighbour> {
        let Some(entry) = self.entry else {
            return Vec::new();
        };
        if q.len() != self.dim || k == 0 {
            return Vec::new();
        }
        let mut own = Visited::default();
        let mut guard = self.visited.try_lock().ok();
        let visited = match guard.as_deref_mut() {
            Some(v) => v,
            None => &mut own,
        };
        let mut found = Vec::new();
        vectorized(Search {
            g: self,
            q,
            entry,
            ef: self.params.ef_search.max(k),
            visited,
            out: &mut found,
        });
        found.sort_unstable_by(|a, b| b.cmp(a));
        found
            .into_iter()
            .take(k)
            .map(|c| Neighbour {
                id: self.ids[c.slot as usize],
                score: c.sim,
            })
            .collect()
    }

    /// Bytes held per entry: vectors, links both ways and the id map, over the live count
    /// (walks every node).
    pub fn bytes_per_entry(&self) -> usize {
        let u32s = size_of::<u32>();
        let per_slot = self.dim * size_of::<f32>()
            + size_of::<u64>()
            + 1
            + (self.m0() + 1) * u32s
            + size_of::<Node>()
            + u32s; // a visited mark
        let lists: usize = self
            .nodes
            .iter()
            .map(|n| {
                n.rev0.capacity() * u32s
                    + n.up.as_ref().map_or(0, |u| {
                        size_of::<Upper>()
                            + u.links.capacity() * u32s
                            + u.rev
                                .iter()
                                .map(|r| size_of::<Vec<u32>>() + r.capacity() * u32s)
                                .sum::<usize>()
                    })
            })
            .sum();
        let held = self.ids.len() * per_slot
            + lists
            + self.free.len() * u32s
            + self.slots.capacity() * (size_of::<(u64, u32)>() + 1);
        held / self.len().max(1)
    }

    fn m0(&self) -> usize {
        2 * self.params.m
    }

    /// Most links a node keeps on `layer`.
    fn cap(&self, layer: usize) -> usize {
        if layer == 0 { self.m0() } else { self.params.m }
    }

    /// floor(-ln(u) / ln(M)), u uniform in (0, 1]: each layer holds ~1/M of the one below.
    fn draw_level(&mut self) -> usize {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let u = ((z >> 11) + 1) as f64 / (1u64 << 53) as f64;
        ((-u.ln() / (self.params.m as f64).ln()) as usize).min(MAX_LEVEL)
    }

    fn take_visited(&mut self) -> Visited {
        std::mem::take(
            self.visited
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    #[inline(always)]
    fn vector(&self, slot: u32) -> &[f32] {
        let at = slot as usize * self.dim;
        &self.data[at..at + self.dim]
    }

    #[inline(always)]
    fn level(&self, slot: u32) -> usize {
        self.levels[slot as usize] as usize
    }

    #[inline(always)]
    fn links(&self, slot: u32, layer: usize) -> &[u32] {
        let (buf, at) = if layer == 0 {
            (&self.links0, slot as usize * (self.m0() + 1))
        } else {
            match &self.nodes[slot as usize].up {
                Some(up) => (&up.links, (layer - 1) * (self.params.m + 1)),
                None => return &[],
            }
        };
        &buf[at + 1..at + 1 + buf[at] as usize]
    }

    fn rev(&self, slot: u32, layer: usize) -> &[u32] {
        let node = &self.nodes[slot as usize];
        match (layer, &node.up) {
            (0, _) => &node.rev0,
            (l, Some(up)) => &up.rev[l - 1],
            (_, None) => &[],
        }
    }

    fn rev_mut(&mut self, slot: u32, layer: usize) -> Option<&mut Vec<u32>> {
        let node = &mut self.nodes[slot as usize];
        match (layer, &mut node.up) {
            (0, _) => Some(&mut node.rev0),
            (l, Some(up)) => Some(&mut up.rev[l - 1]),
            (_, None) => None,
        }
    }

    /// Replace `slot`'s links on `layer`, keeping the in-links in step.
    fn set_links(&mut self, slot: u32, layer: usize, new: &[u32]) {
        let old = self.links(slot, layer).to_vec();
        for &o in old.iter().filter(|o| !new.contains(o)) {
            if let Some(rev) = self.rev_mut(o, layer)
                && let Some(i) = rev.iter().position(|&r| r == slot)
            {
                rev.swap_remove(i);
            }
        }
        for &n in new.iter().filter(|n| !old.contains(n)) {
            if let Some(rev) = self.rev_mut(n, layer) {
                rev.push(slot);
            }
        }
        let (m, m0) = (self.params.m, self.m0());
        let (buf, at) = if layer == 0 {
            (&mut self.links0, slot as usize * (m0 + 1))
        } else {
            match &mut self.nodes[slot as usize].up {
                Some(up) => (&mut up.links, (layer - 1) * (m + 1)),
                None => return,
            }
        };
        buf[at] = new.len() as u32;
        buf[at + 1..at + 1 + new.len()].copy_from_slice(new);
    }

    /// Greedy walk on `layer` from `cur` to the node nearest `q` (ef = 1).
    #[inline(always)]
    fn greedy(&self, q: &[f32], mut cur: Cand, layer: usize) -> Cand {
        loop {
            let mut moved = false;
            for &n in self.links(cur.slot, layer) {
                let sim = dot_f32(q, self.vector(n));
                if sim > cur.sim {
                    cur = Cand { sim, slot: n };
                    moved = true;
                }
            }
            if !moved {
                return cur;
            }
        }
    }

    /// The paper's SEARCH-LAYER: the `ef` nodes nearest `q` on `layer` reachable from
    /// `entries`, unordered.
    #[inline(always)]
    fn search_layer(
        &self,
        q: &[f32],
        entries: &[Cand],
        ef: usize,
        layer: usize,
        visited: &mut Visited,
    ) -> Vec<Cand> {
        visited.start(self.ids.len());
        let mut todo: BinaryHeap<Cand> = BinaryHeap::with_capacity(ef * 2);
        let mut best: BinaryHeap<Reverse<Cand>> = BinaryHeap::with_capacity(ef + 1);
        for &e in entries {
            if visited.insert(e.slot) {
                todo.push(e);
                best.push(Reverse(e));
            }
        }
        while best.len() > ef {
            best.pop();
        }
        while let Some(c) = todo.pop() {
            if best.len() >= ef && best.peek().is_some_and(|w| c.sim < w.0.sim) {
                break;
            }
            for &n in self.links(c.slot, layer) {
                if !visited.insert(n) {
                    continue;
                }
                let sim = dot_f32(q, self.vector(n));
                if best.len() < ef || best.peek().is_some_and(|w| sim > w.0.sim) {
                    let cand = Cand { sim, slot: n };
                    todo.push(cand);
                    best.push(Reverse(cand));
                    if best.len() > ef {
                        best.pop();
                    }
                }
            }
        }
        best.into_iter().map(|r| r.0).collect()
    }

    /// The paper's neighbour heuristic: from `cands` (sorted best first by similarity to the
    /// node being linked) keep each that is nearer that node than any already kept, up to
    /// `m`. Links then reach out in several directions instead of into one cluster, which is
    /// what keeps clustered data navigable.
    #[inline(always)]
    fn select(&self, cands: &[Cand], m: usize) -> Vec<u32> {
        let mut kept: Vec<u32> = Vec::with_capacity(m);
        for c in cands {
            if kept.len() == m {
                break;
            }
            // Plain loops, not iterator closures: those may not be inlined into the wide
            // function, and their dots would then run at baseline width.
            let v = self.vector(c.slot);
            let mut diverse = true;
            for &s in &kept {
                if dot_f32(v, self.vector(s)) >= c.sim {
                    diverse = false;
                    break;
                }
            }
            if diverse {
                kept.push(c.slot);
            }
        }
        kept
    }

    /// `slot`'s links on `layer` chosen afresh from `cands` (its neighbours and any new).
    #[inline(always)]
    fn relink(&mut self, slot: u32, layer: usize, cands: &[u32]) {
        let v = self.vector(slot);
        let mut scored = Vec::with_capacity(cands.len());
        for &c in cands {
            scored.push(Cand {
                sim: dot_f32(v, self.vector(c)),
                slot: c,
            });
        }
        scored.sort_unstable_by(|a, b| b.cmp(a));
        let kept = self.select(&scored, self.cap(layer));
        self.set_links(slot, layer, &kept);
    }

    /// The paper's INSERT for a vector already in `slot`.
    #[inline(always)]
    fn insert(&mut self, slot: u32, visited: &mut Visited) {
        let level = self.level(slot);
        let Some(entry) = self.entry else {
            self.entry = Some(slot);
            return;
        };
        let top = self.level(entry);
        let q = self.vector(slot).to_vec();
        let mut near = vec![Cand {
            sim: dot_f32(&q, self.vector(entry)),
            slot: entry,
        }];
        for layer in (level + 1..=top).rev() {
            near = vec![self.greedy(&q, near[0], layer)];
        }
        for layer in (0..=level.min(top)).rev() {
            near = self.search_layer(&q, &near, self.params.ef_construction, layer, visited);
            near.sort_unstable_by(|a, b| b.cmp(a));
            let chosen = self.select(&near, self.params.m);
            self.set_links(slot, layer, &chosen);
            for n in chosen {
                let mut theirs = self.links(n, layer).to_vec();
                theirs.push(slot);
                if theirs.len() <= self.cap(layer) {
                    self.set_links(n, layer, &theirs);
                } else {
                    self.relink(n, layer, &theirs);
                }
            }
        }
        if level > top {
            self.entry = Some(slot);
        }
    }

    /// Take `slot` out of the graph: every node that linked to it is relinked among its other
    /// neighbours and `slot`'s, so paths that went through `slot` go around it.
    #[inline(always)]
    fn unlink(&mut self, slot: u32) {
        for layer in 0..=self.level(slot) {
            let out = self.links(slot, layer).to_vec();
            let inn = self.rev(slot, layer).to_vec();
            self.set_links(slot, layer, &[]);
            for p in inn {
                let mut cands: Vec<u32> = self
                    .links(p, layer)
                    .iter()
                    .copied()
                    .filter(|&c| c != slot)
                    .collect();
                for &o in &out {
                    if o != p && !cands.contains(&o) {
                        cands.push(o);
                    }
                }
                self.relink(p, layer, &cands);
            }
        }
    }
}

struct Insert<'a> {
    g: &'a mut Hnsw,
    slot: u32,
    visited: &'a mut Visited,
}

impl Wide for Insert<'_> {
    #[inline(always)]
    fn run(self) {
        self.g.insert(self.slot, self.visited);
    }
}

struct Unlink<'a> {
    g: &'a mut Hnsw,
    slot: u32,
}

impl Wide for Unlink<'_> {
    #[inline(always)]
    fn run(self) {
        self.g.unlink(self.slot);
    }
}

struct Search<'a> {
    g: &'a Hnsw,
    q: &'a [f32],
    entry: u32,
    ef: usize,
    visited: &'a mut Visited,
    out: &'a mut Vec<Cand>,
}

impl Wide for Search<'_> {
    #[inline(always)]
    fn run(self) {
        let g = self.g;
        let mut cur = Cand {
            sim: dot_f32(self.q, g.vector(self.entry)),
            slot: self.entry,
        };
        for layer in (1..=g.level(self.entry)).rev() {
            cur = g.greedy(self.q, cur, layer);
        }
        *self.out = g.search_layer(self.q, &[cur], self.ef, 0, self.visited);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::flat::FlatIndex;
    use crate::synthetic::{DIM, Rng, Topics};

    /// Recall@1 and @10 of the graph on 200 queries about the same topics.
    fn assert_topic_recall(g: &Hnsw, flat: &FlatIndex, topics: &Topics, rng: &mut Rng) {
        let queries: Vec<Vec<f32>> = (0..200).map(|_| topics.point(rng)).collect();
        let (r1, r10) = (recall(g, flat, &queries, 1), recall(g, flat, &queries, 10));
        assert!(r1 >= 0.95 && r10 >= 0.9, "recall@1 {r1}, recall@10 {r10}");
    }

    /// Mean recall@k of the graph against a flat scan of the same entries.
    fn recall(g: &Hnsw, flat: &FlatIndex, queries: &[Vec<f32>], k: usize) -> f64 {
        let mut hits = 0;
        for q in queries {
            let want = flat.search(q, k);
            let got = g.search(q, k);
            hits += want
                .iter()
                .filter(|w| got.iter().any(|n| n.id == w.id))
                .count();
        }
        hits as f64 / (queries.len() * k) as f64
    }

    fn build(points: &[Vec<f32>]) -> (Hnsw, FlatIndex) {
        let mut g = Hnsw::new(DIM);
        let mut flat = FlatIndex::new(DIM);
        for (i, v) in points.iter().enumerate() {
            g.add(i as u64, v);
            flat.add(i as u64, v);
        }
        (g, flat)
    }

    #[test]
    fn recall_on_clustered_vectors() {
        let mut rng = Rng(1);
        let topics = Topics::new(&mut rng, 300);
        let points: Vec<Vec<f32>> = (0..20_000).map(|_| topics.point(&mut rng)).collect();
        let (g, flat) = build(&points);
        assert_topic_recall(&g, &flat, &topics, &mut rng);
    }

    /// Isotropic random vectors are the worst case: a random query's nearest entries are
    /// barely nearer than the rest (cosine ~0.2 against ~0.15), and at the default ef the
    /// graph misses many of them. The cache only serves neighbours at cosine >= ~0.95, and
    /// those it finds; a wider search finds the rest.
    #[test]
    fn recall_on_random_vectors() {
        let mut rng = Rng(2);
        let points: Vec<Vec<f32>> = (0..5_000).map(|_| rng.unit()).collect();
        let (mut g, flat) = build(&points);
        let reworded: Vec<Vec<f32>> = (0..200).map(|i| rng.jitter(&points[i * 7], 0.3)).collect();
        let r1 = recall(&g, &flat, &reworded, 1);
        assert!(r1 >= 0.99, "recall@1 {r1} near a stored vector");
        let queries: Vec<Vec<f32>> = (0..200).map(|_| rng.unit()).collect();
        g.params.ef_search = 600;
        let (r1, r10) = (
            recall(&g, &flat, &queries, 1),
            recall(&g, &flat, &queries, 10),
        );
        assert!(r1 >= 0.95 && r10 >= 0.9, "recall@1 {r1}, recall@10 {r10}");
    }

    #[test]
    fn removed_ids_are_never_returned() {
        let mut rng = Rng(3);
        let topics = Topics::new(&mut rng, 20);
        let points: Vec<Vec<f32>> = (0..2_000).map(|_| topics.point(&mut rng)).collect();
        let (mut g, mut flat) = build(&points);
        for i in (0..2_000).step_by(3) {
            assert!(g.remove(i));
            flat.remove(i);
        }
        assert!(!g.remove(0));
        assert_eq!(g.len(), flat.len());
        for (i, p) in points.iter().enumerate() {
            let got = g.search(p, 20);
            assert_eq!(got.len(), 20);
            assert!(got.iter().all(|n| n.id % 3 != 0), "a removed id came back");
            if i % 3 != 0 {
                assert_eq!(got[0].id, i as u64);
            }
        }
        let queries: Vec<Vec<f32>> = (0..100).map(|_| topics.point(&mut rng)).collect();
        assert!(recall(&g, &flat, &queries, 10) >= 0.9);
    }

    /// A full cache: the oldest entry out, a new one in, five times over. Freed slots are
    /// reused, so the graph holds no more than the live entries, and relinking keeps it
    /// searchable.
    #[test]
    fn churn_keeps_size_memory_and_recall() {
        let mut rng = Rng(4);
        let topics = Topics::new(&mut rng, 50);
        let n = 2_000u64;
        let (mut g, mut flat) = (Hnsw::new(DIM), FlatIndex::new(DIM));
        for i in 0..n {
            let v = topics.point(&mut rng);
            g.add(i, &v);
            flat.add(i, &v);
        }
        let bytes = g.bytes_per_entry();
        for i in n..6 * n {
            g.remove(i - n);
            flat.remove(i - n);
            let v = topics.point(&mut rng);
            g.add(i, &v);
            flat.add(i, &v);
        }
        assert_eq!(g.len(), n as usize);
        assert_eq!(g.ids.len(), n as usize, "slots are reused");
        assert!(
            g.bytes_per_entry() < bytes * 11 / 10,
            "{bytes} -> {}",
            g.bytes_per_entry()
        );
        assert_topic_recall(&g, &flat, &topics, &mut rng);
    }

    #[test]
    fn ids_come_back_after_removal_and_adds_replace() {
        let mut rng = Rng(5);
        let (a, b) = (rng.unit(), rng.unit());
        let mut g = Hnsw::new(DIM);
        for i in 0..50 {
            g.add(i, &rng.unit());
        }
        g.add(7, &a);
        assert!(g.remove(7));
        assert!(g.search(&a, 50).iter().all(|n| n.id != 7));
        g.add(7, &a);
        assert_eq!(g.search(&a, 1)[0].id, 7);
        g.add(7, &b);
        assert_eq!(g.len(), 50);
        assert_eq!(g.search(&b, 1)[0].id, 7);
        assert!(g.search(&a, 1)[0].score < 0.5);
    }

    #[test]
    fn empty_small_and_wrong_width() {
        let mut rng = Rng(6);
        let mut g = Hnsw::new(DIM);
        let q = rng.unit();
        assert!(g.is_empty() && g.search(&q, 4).is_empty());
        let points: Vec<Vec<f32>> = (0..5).map(|_| rng.unit()).collect();
        for (i, p) in points.iter().enumerate() {
            g.add(i as u64, p);
        }
        g.add(9, &[1.0, 0.0]);
        let got = g.search(&q, 10);
        assert_eq!(got.len(), 5, "k beyond len gives every entry");
        assert!(got.windows(2).all(|w| w[0].score >= w[1].score));
        assert!(g.search(&q, 0).is_empty() && g.search(&[1.0, 0.0], 3).is_empty());
        for i in 0..5 {
            assert!(g.remove(i));
        }
        assert!(g.is_empty() && g.entry.is_none() && g.search(&q, 4).is_empty());
        g.add(1, &points[1]);
        assert_eq!(g.search(&q, 4).len(), 1);
    }
}
