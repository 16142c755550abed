//! The prefix cache: the KV blocks of contexts already computed, found by their tokens.
//!
//! A radix tree whose edges are blocks, as SGLang's RadixAttention keeps it: each node holds
//! one [`BLOCK`] of a context's positions and the tokens that produced them, under the node
//! of the block before it, so a path from the root spells a context. A full block's children
//! are found by their tokens in one hash lookup; a block a context ended inside (a partial
//! one, always a leaf) is matched token by token, so a prompt reuses a cached context up to
//! its last common token, not only to a block boundary.
//!
//! Nodes are evicted least recently used, leaves first (a leaf's parent becomes a leaf), and
//! only when no sequence holds the block: a running request's prefix never goes.

use std::collections::HashMap;

use crate::kv::{BLOCK, BlockRef, KvCache, Shape};

type NodeId = usize;

/// A node's full children, by their tokens.
type Full = HashMap<Box<[u32]>, NodeId>;

struct Node {
    block: BlockRef,
    tokens: Box<[u32]>,
    parent: Option<NodeId>,
    /// Full children by their tokens.
    full: Full,
    /// Partial children (leaves).
    partial: Vec<NodeId>,
    last_used: u64,
}

impl Node {
    fn is_leaf(&self) -> bool {
        self.full.is_empty() && self.partial.is_empty()
    }
}

#[derive(Default)]
pub struct PrefixCache {
    nodes: Vec<Option<Node>>,
    free: Vec<NodeId>,
    /// The first blocks of contexts, full and partial.
    roots_full: Full,
    roots_partial: Vec<NodeId>,
    clock: u64,
    len: usize,
}

/// Tokens two slices share from their start.
fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    /// Blocks the index holds.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Blocks held by the index alone: what eviction can free.
    pub fn evictable(&self) -> usize {
        self.nodes
            .iter()
            .flatten()
            .filter(|n| n.block.holders() == 1)
            .count()
    }

    fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id).and_then(Option::as_ref)
    }

    fn node_mut(&mut self, id: NodeId) -> Option<&mut Node> {
        self.nodes.get_mut(id).and_then(Option::as_mut)
    }

    /// The children maps under `parent` (the roots when `None`).
    fn children(&self, parent: Option<NodeId>) -> Option<(&Full, &[NodeId])> {
        match parent {
            None => Some((&self.roots_full, &self.roots_partial)),
            Some(p) => self.node(p).map(|n| (&n.full, &n.partial[..])),
        }
    }

    /// The nodes spelling the longest cached prefix of `tokens`, and its length.
    fn walk(&self, tokens: &[u32]) -> (Vec<NodeId>, usize) {
        let mut path = Vec::new();
        let mut matched = 0;
        let mut parent = None;
        while let Some((full, partial)) = self.children(parent) {
            let rest = &tokens[matched..];
            if let Some(&id) = rest.get(..BLOCK).and_then(|b| full.get(b)) {
                path.push(id);
                parent = Some(id);
                matched += BLOCK;
                continue;
            }
            // The child sharing the most tokens with the rest, full or partial.
            let best = full
                .values()
                .chain(partial)
                .filter_map(|&id| self.node(id).map(|n| (id, common(&n.tokens, rest))))
                .max_by_key(|&(_, n)| n)
                .filter(|&(_, n)| n > 0);
            if let Some((id, n)) = best {
                path.push(id);
                matched += n;
            }
            break;
        }
        (path, matched)
    }

    /// Positions of `tokens` (at most `limit`) a lookup would find cached.
    pub fn peek(&self, tokens: &[u32], limit: usize) -> usize {
        self.walk(&tokens[..limit.min(tokens.len())]).1
    }

    /// The longest cached prefix of `tokens`, at most `limit` positions, as a cache sharing
    /// its blocks (empty when nothing matches; its whole blocks are never written again, a
    /// last partial one is copied when written). Every node on the way is touched.
    pub fn lookup(&mut self, shape: Shape, tokens: &[u32], limit: usize) -> KvCache {
        let (path, matched) = self.walk(&tokens[..limit.min(tokens.len())]);
        self.clock += 1;
        let clock = self.clock;
        let mut blocks = Vec::with_capacity(path.len());
        for id in path {
            if let Some(n) = self.node_mut(id) {
                n.last_used = clock;
                blocks.push(n.block.clone());
            }
        }
        KvCache::from_blocks(shape, blocks, matched)
    }

    /// Keeps the blocks of `cache` for its first `positions` positions, whose tokens are
    /// `tokens`: from block `from` on, the earlier ones being in the index already (a
    /// lookup finds them). A block the index has already (another sequence computed the
    /// same tokens) stays the index's; a partial block that a new one extends is replaced
    /// when no one holds it. Returns the blocks added.
    pub fn insert(&mut self, tokens: &[u32], cache: &KvCache, positions: usize) -> usize {
        let positions = positions.min(cache.len()).min(tokens.len());
        self.clock += 1;
        let mut parent = None;
        let mut added = 0;
        for (b, block) in cache.blocks().iter().enumerate() {
            let from = b * BLOCK;
            if from >= positions {
                break;
            }
            let chunk = &tokens[from..positions.min(from + BLOCK)];
            let Some((full, partial)) = self.children(parent) else {
                break;
            };
            if let Some(&id) = full.get(chunk) {
                self.touch(id);
                parent = Some(id);
                continue;
            }
            let known = full
                .values()
                .chain(partial)
                .filter_map(|&id| self.node(id))
                .any(|n| n.tokens.starts_with(chunk));
            if known {
                break;
            }
            // Partial siblings the new block covers go, unless a sequence holds them.
            let covered: Vec<NodeId> = partial
                .iter()
                .copied()
                .filter(|&id| {
                    self.node(id)
                        .is_some_and(|n| chunk.starts_with(&n.tokens) && n.block.holders() == 1)
                })
                .collect();
            for id in covered {
                self.remove(id);
            }
            let id = self.add(parent, chunk, block.clone());
            added += 1;
            if chunk.len() < BLOCK {
                break;
            }
            parent = Some(id);
        }
        added
    }

    fn touch(&mut self, id: NodeId) {
        let clock = self.clock;
        if let Some(n) = self.node_mut(id) {
            n.last_used = clock;
        }
    }

    fn add(&mut self, parent: Option<NodeId>, tokens: &[u32], block: BlockRef) -> NodeId {
        let node = Node {
            block,
            tokens: tokens.into(),
            parent,
            full: Full::new(),
            partial: Vec::new(),
            last_used: self.clock,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        };
        let full = tokens.len() == BLOCK;
        let (map, list) = match parent.and_then(|p| self.node_mut(p)) {
            Some(p) => (&mut p.full, &mut p.partial),
            None => (&mut self.roots_full, &mut self.roots_partial),
        };
        if full {
            map.insert(tokens.into(), id);
        } else {
            list.push(id);
        }
        self.len += 1;
        id
    }

    /// Removes leaf `id`.
    fn remove(&mut self, id: NodeId) {
        let Some(node) = self.nodes.get_mut(id).and_then(Option::take) else {
            return;
        };
        let (map, list) = match node.parent.and_then(|p| self.node_mut(p)) {
            Some(p) => (&mut p.full, &mut p.partial),
            None => (&mut self.roots_full, &mut self.roots_partial),
        };
        if node.tokens.len() == BLOCK {
            map.remove(&node.tokens);
        } else {
            list.retain(|&c| c != id);
        }
        self.free.push(id);
        self.len -= 1;
    }

    /// Evicts up to `n` blocks no sequence holds, least recently used leaves first.
    /// Returns how many went.
    pub fn evict(&mut self, n: usize) -> usize {
        let mut gone = 0;
        while gone < n {
            let oldest = self
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(id, n)| n.as_ref().map(|n| (id, n)))
                .filter(|(_, n)| n.is_leaf() && n.block.holders() == 1)
                .min_by_key(|(_, n)| n.last_used)
                .map(|(id, _)| id);
            let Some(id) = oldest else { break };
            self.remove(id);
            gone += 1;
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvType;

    const SHAPE: Shape = Shape {
        layers: 1,
        rows: 2,
        heads: 1,
        head_dim: 2,
        kv: KvType::F32,
    };

    /// A cache that has "computed" `tokens` (the values do not matter to the index).
    fn computed(tokens: &[u32]) -> KvCache {
        let mut c = KvCache::new(SHAPE);
        c.reserve(tokens.len());
        c.advance(tokens.len());
        c
    }

    fn seq(from: u32, n: usize) -> Vec<u32> {
        (from..from + n as u32).collect()
    }

    #[test]
    fn a_lookup_finds_whole_blocks_then_the_longest_common_part_of_one() {
        let mut p = PrefixCache::default();
        let a = seq(0, 150);
        assert_eq!(
            p.insert(&a, &computed(&a), 150),
            3,
            "two full blocks, one partial"
        );
        // The same start, diverging at 100: two blocks' worth... one whole, 36 of the next.
        let mut b = seq(0, 100);
        b.extend(seq(5000, 40));
        assert_eq!(p.peek(&b, b.len()), 100);
        let hit = p.lookup(SHAPE, &b, b.len());
        assert_eq!(hit.len(), 100);
        // A limit caps the match, inside a whole block too.
        assert_eq!(p.peek(&a, 149), 149);
        assert_eq!(p.peek(&a, 64), 64);
        assert_eq!(p.peek(&seq(1, 10), 10), 0);
        // B's own blocks: its first is known, its second diverges: one new full block and
        // the partial tail.
        assert_eq!(p.insert(&b, &computed(&b), b.len()), 2);
        assert_eq!(p.len(), 5);
    }

    #[test]
    fn a_block_that_extends_a_cached_partial_one_replaces_it() {
        let mut p = PrefixCache::default();
        let short = seq(0, 80);
        p.insert(&short, &computed(&short), 80);
        let long = seq(0, 128);
        assert_eq!(
            p.insert(&long, &computed(&long), 128),
            1,
            "the second block, full"
        );
        assert_eq!(p.len(), 2, "the 16-token partial block is gone");
        assert_eq!(p.peek(&seq(0, 200), 200), 128);
    }

    #[test]
    fn eviction_takes_unheld_leaves_least_recently_used_first() {
        let mut p = PrefixCache::default();
        let (a, b) = (seq(0, 128), seq(1000, 128));
        p.insert(&a, &computed(&a), 128);
        p.insert(&b, &computed(&b), 128);
        // A used last: B's blocks go first, its leaf before its root.
        let _ = p.lookup(SHAPE, &a, 128);
        assert_eq!(p.evict(1), 1);
        assert_eq!(p.peek(&b, 128), 64);
        assert_eq!(p.peek(&a, 128), 128);
        // A held by a running sequence: only B's last block can go.
        let held = p.lookup(SHAPE, &a, 128);
        assert_eq!(p.evictable(), 1);
        assert_eq!(p.evict(10), 1);
        assert_eq!((p.len(), p.peek(&a, 128)), (2, 128));
        drop(held);
        assert_eq!(p.evict(10), 2);
        assert!(p.is_empty());
    }
}
