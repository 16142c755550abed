//! The KV cache in fixed-size blocks that sequences share.
//!
//! A sequence's cache is a table of [`BLOCK`]-position blocks, each holding those positions'
//! keys and values for every layer. Blocks are reference-counted: the prefix cache
//! (`crate::prefix`) keeps the blocks of prompts already computed, and a new sequence whose
//! prompt starts the same way takes them into its table instead of computing them again.
//! A shared block is never written: the first write into one (a partial block, extended by
//! another sequence) copies it first, so every sequence sees exactly the keys and values it
//! would have computed itself.
//!
//! Within a block, keys are transposed: each of the `kv_dim` rows (KV head by head,
//! dimension by dimension) holds that dimension for the block's positions, so a query's
//! scores are one multiply-add stream per dimension with no horizontal sum per position
//! (position-major keys made attention 3x slower). Values stay position-major, `kv_dim` per
//! position: the weighted sum of a head's values runs down the positions with the head's
//! output held in registers.

use std::sync::Arc;

/// Positions per block. Long enough that attention's inner loops run on whole vectors
/// (four AVX-512 registers of f32 per key row), short enough that a sequence wastes little
/// in its last block; a prefix that ends inside a block is still reused, up to its last
/// token, by copying that block.
pub const BLOCK: usize = 64;

/// How the KV cache stores keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    /// Exact.
    #[default]
    F32,
    /// Each position's key and value of each KV head as 8-bit integers with one f32 scale
    /// (amax / 127), as llama.cpp's q8_0 cache keeps them: a quarter of the bytes, so four
    /// times the positions (long contexts, many sequences) in the same memory.
    Q8_0,
}

impl KvType {
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Bytes one position takes in every layer's cache.
    pub fn bytes_per_position(self, shape: impl Into<Shape>) -> usize {
        let s = shape.into();
        let per_layer = match self {
            KvType::F32 => 2 * s.rows * 4,
            KvType::Q8_0 => 2 * s.rows + 2 * s.heads * 4,
        };
        per_layer * s.layers
    }
}

/// What a model's KV cache holds per position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub layers: usize,
    /// Keys (and values) per position and layer: KV heads x head dimension.
    pub rows: usize,
    /// KV heads.
    pub heads: usize,
    pub head_dim: usize,
    pub kv: KvType,
}

/// A KV cache element: f32, or an 8-bit integer its scale multiplies back.
pub(crate) trait Elem: Copy + Default + Send + Sync + 'static {
    fn f(self) -> f32;

    /// Stores `x` into `out`; the scale that multiplies it back, for 8-bit elements.
    fn store(x: &[f32], out: &mut [Self]) -> Option<f32>;
}

impl Elem for f32 {
    #[inline(always)]
    fn f(self) -> f32 {
        self
    }

    fn store(x: &[f32], out: &mut [f32]) -> Option<f32> {
        out.copy_from_slice(x);
        None
    }
}

impl Elem for i8 {
    #[inline(always)]
    fn f(self) -> f32 {
        f32::from(self)
    }

    fn store(x: &[f32], out: &mut [i8]) -> Option<f32> {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (o, v) in out.iter_mut().zip(x) {
            *o = (v * inv).round() as i8;
        }
        Some(d)
    }
}

/// [`BLOCK`] positions of every layer. Per layer: keys `rows x BLOCK` (transposed), values
/// `BLOCK x rows`; in 8 bits, each position's key (and value) scale per KV head,
/// `heads x BLOCK`, so that a head's scales over positions are one stream too.
#[derive(Clone)]
pub(crate) struct Block<T> {
    pub k: Vec<T>,
    pub v: Vec<T>,
    /// Empty for f32.
    pub k_scale: Vec<f32>,
    pub v_scale: Vec<f32>,
}

impl<T: Elem> Block<T> {
    /// Zeroed buffers are mapped lazily: a block's unused tail costs no memory.
    fn new(s: &Shape, scaled: bool) -> Block<T> {
        let n = s.layers * s.rows * BLOCK;
        let scales = if scaled {
            s.layers * s.heads * BLOCK
        } else {
            0
        };
        Block {
            k: vec![T::default(); n],
            v: vec![T::default(); n],
            k_scale: vec![0.0; scales],
            v_scale: vec![0.0; scales],
        }
    }

    /// Layer `layer`'s keys (`rows` rows of `BLOCK`), values (`BLOCK` rows of `rows`) and,
    /// in 8 bits, key and value scales (`heads` rows of `BLOCK`).
    #[inline(always)]
    pub fn layer(&self, s: &Shape, layer: usize) -> LayerView<'_, T> {
        let (n, m) = (s.rows * BLOCK, s.heads * BLOCK);
        LayerView {
            keys: &self.k[layer * n..(layer + 1) * n],
            values: &self.v[layer * n..(layer + 1) * n],
            k_scale: self.k_scale.get(layer * m..(layer + 1) * m),
            v_scale: self.v_scale.get(layer * m..(layer + 1) * m),
        }
    }

    fn write(&mut self, s: &Shape, layer: usize, at: usize, key: &[f32], value: &[f32]) {
        let (rows, hd, n) = (s.rows, s.head_dim, s.rows * BLOCK);
        // One head's stored key at a time: on the stack for every head size in use.
        let mut stack = [T::default(); 256];
        let mut heap = Vec::new();
        let q = if hd <= stack.len() {
            &mut stack[..hd]
        } else {
            heap.resize(hd, T::default());
            &mut heap[..]
        };
        let keys = &mut self.k[layer * n..(layer + 1) * n];
        let values = &mut self.v[layer * n..(layer + 1) * n];
        let scales = s.heads * BLOCK * layer;
        for (h, head) in key.chunks_exact(hd).enumerate() {
            if let Some(d) = T::store(head, q) {
                self.k_scale[scales + h * BLOCK + at] = d;
            }
            for (j, &x) in q.iter().enumerate() {
                keys[(h * hd + j) * BLOCK + at] = x;
            }
        }
        let row = &mut values[at * rows..(at + 1) * rows];
        for (h, (head, out)) in value
            .chunks_exact(hd)
            .zip(row.chunks_exact_mut(hd))
            .enumerate()
        {
            if let Some(d) = T::store(head, out) {
                self.v_scale[scales + h * BLOCK + at] = d;
            }
        }
    }
}

/// One layer of one block, as attention reads it.
pub(crate) struct LayerView<'a, T> {
    pub keys: &'a [T],
    pub values: &'a [T],
    pub k_scale: Option<&'a [f32]>,
    pub v_scale: Option<&'a [f32]>,
}

/// A block of either element type, shared by reference count.
#[derive(Clone)]
pub(crate) enum BlockRef {
    F32(Arc<Block<f32>>),
    Q8(Arc<Block<i8>>),
}

impl BlockRef {
    fn new(s: &Shape) -> BlockRef {
        match s.kv {
            KvType::F32 => BlockRef::F32(Arc::new(Block::new(s, false))),
            KvType::Q8_0 => BlockRef::Q8(Arc::new(Block::new(s, true))),
        }
    }

    /// Holders of this block: caches and the prefix index.
    pub fn holders(&self) -> usize {
        match self {
            BlockRef::F32(b) => Arc::strong_count(b),
            BlockRef::Q8(b) => Arc::strong_count(b),
        }
    }

    /// This holder's own block: copied first if another holds it too.
    fn own(&mut self) {
        match self {
            BlockRef::F32(b) => {
                Arc::make_mut(b);
            }
            BlockRef::Q8(b) => {
                Arc::make_mut(b);
            }
        }
    }

    fn write(&mut self, s: &Shape, layer: usize, at: usize, key: &[f32], value: &[f32]) {
        match self {
            BlockRef::F32(b) => Arc::make_mut(b).write(s, layer, at, key, value),
            BlockRef::Q8(b) => Arc::make_mut(b).write(s, layer, at, key, value),
        }
    }
}

/// One sequence's keys and values for every layer: its table of blocks.
#[derive(Clone)]
pub struct KvCache {
    shape: Shape,
    blocks: Vec<BlockRef>,
    len: usize,
}

impl KvCache {
    pub fn new(shape: impl Into<Shape>) -> KvCache {
        KvCache::with_capacity(shape, 0)
    }

    /// A cache whose table has room for `positions` before it grows (the blocks themselves
    /// are allocated as positions are written).
    pub fn with_capacity(shape: impl Into<Shape>, positions: usize) -> KvCache {
        KvCache {
            shape: shape.into(),
            blocks: Vec::with_capacity(positions.div_ceil(BLOCK)),
            len: 0,
        }
    }

    /// A cache of the first `positions` of `blocks` (clamped to what they hold).
    pub(crate) fn from_blocks(shape: Shape, blocks: Vec<BlockRef>, positions: usize) -> KvCache {
        let len = positions.min(blocks.len() * BLOCK);
        KvCache { shape, blocks, len }
    }

    /// A cache of this one's first `positions` (at most its length), sharing its blocks:
    /// what the prefix cache gives a sequence whose prompt starts as this one's context.
    pub fn prefix(&self, positions: usize) -> KvCache {
        let len = positions.min(self.len);
        KvCache {
            shape: self.shape,
            blocks: self.blocks[..len.div_ceil(BLOCK)].to_vec(),
            len,
        }
    }

    /// Positions stored.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn shape(&self) -> &Shape {
        &self.shape
    }

    pub(crate) fn blocks(&self) -> &[BlockRef] {
        &self.blocks
    }

    /// Room for `positions`: new blocks at the end, and the blocks from the current length
    /// on made this cache's own (copied if shared) before anything is written into them.
    pub(crate) fn reserve(&mut self, positions: usize) {
        while self.blocks.len() * BLOCK < positions {
            self.blocks.push(BlockRef::new(&self.shape));
        }
        let first = self.len / BLOCK;
        let last = positions.div_ceil(BLOCK).min(self.blocks.len());
        for b in self.blocks.get_mut(first..last).into_iter().flatten() {
            b.own();
        }
    }

    /// Stores position `pos` of `layer` (within the reserved room).
    pub(crate) fn write(&mut self, layer: usize, pos: usize, key: &[f32], value: &[f32]) {
        let shape = self.shape;
        if let Some(b) = self.blocks.get_mut(pos / BLOCK) {
            b.write(&shape, layer, pos % BLOCK, key, value);
        }
    }

    /// The cache now holds `n` more positions (written by a forward step).
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Forgets every position from `positions` on (drafted tokens that were not accepted),
    /// and lets go of the blocks that held only those. Nothing is written: a block kept and
    /// shared with another holder is copied before the next write into it, as always.
    pub fn truncate(&mut self, positions: usize) {
        if positions < self.len {
            self.len = positions;
            self.blocks.truncate(positions.div_ceil(BLOCK));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: Shape = Shape {
        layers: 2,
        rows: 4,
        heads: 2,
        head_dim: 2,
        kv: KvType::F32,
    };

    /// Writes positions `from..to` of every layer: each key and value `tag + position`, plus
    /// 1000 per layer.
    fn fill(c: &mut KvCache, from: usize, to: usize, tag: f32) {
        c.reserve(to);
        for layer in 0..SHAPE.layers {
            for p in from..to {
                let v = [tag + p as f32 + 1000.0 * layer as f32; 4];
                c.write(layer, p, &v, &v);
            }
        }
        c.advance(to - from);
    }

    /// The first key row and value of every layer at each stored position, less each
    /// layer's 1000s: the tags written.
    fn read(c: &KvCache) -> Vec<f32> {
        let mut out = Vec::new();
        for p in 0..c.len() {
            let BlockRef::F32(b) = &c.blocks()[p / BLOCK] else {
                panic!("an f32 cache");
            };
            for layer in 0..SHAPE.layers {
                let view = b.layer(&SHAPE, layer);
                let base = 1000.0 * layer as f32;
                let (k, v) = (view.keys[p % BLOCK], view.values[(p % BLOCK) * SHAPE.rows]);
                assert_eq!(k, v, "position {p}, layer {layer}");
                out.push(k - base);
            }
        }
        out
    }

    fn tags(parts: &[(std::ops::Range<usize>, f32)]) -> Vec<f32> {
        parts
            .iter()
            .flat_map(|(r, tag)| r.clone().flat_map(move |p| [tag + p as f32; 2]))
            .collect()
    }

    /// Drafted positions written past a shared prefix, then cut back and written again,
    /// never reach the blocks the cache shares: the other holder reads what it wrote.
    #[test]
    fn truncating_a_cache_that_shares_blocks_leaves_them_as_they_were() {
        let mut original = KvCache::new(SHAPE);
        fill(&mut original, 0, 100, 0.0);
        let want = read(&original);
        // A sequence sharing 70 positions (a whole block and part of the next) drafts ten,
        // keeps two of them, and goes on.
        let mut seq = original.prefix(70);
        fill(&mut seq, 70, 80, 5000.0);
        seq.truncate(72);
        assert_eq!(seq.len(), 72);
        fill(&mut seq, 72, 75, 9000.0);
        assert_eq!(read(&original), want);
        assert_eq!(
            read(&seq),
            tags(&[(0..70, 0.0), (70..72, 5000.0), (72..75, 9000.0)])
        );
        drop(seq);
        // Cut back to a block boundary: the blocks past it go, the shared one stays shared.
        let mut seq = original.prefix(64);
        fill(&mut seq, 64, 150, 5000.0);
        assert_eq!(seq.blocks().len(), 3);
        seq.truncate(64);
        assert_eq!((seq.len(), seq.blocks().len()), (64, 1));
        assert_eq!(seq.blocks()[0].holders(), 2, "still the original's block");
        fill(&mut seq, 64, 66, 9000.0);
        assert_eq!(read(&original), want);
        assert_eq!(read(&seq), tags(&[(0..64, 0.0), (64..66, 9000.0)]));
        // Truncating past the end changes nothing.
        seq.truncate(1000);
        assert_eq!(seq.len(), 66);
    }
}
