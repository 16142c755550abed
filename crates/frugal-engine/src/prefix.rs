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

/// What a lookup found: a cache holding the longest cached prefix of the tokens.
pub struct Hit {
    pub cache: KvCache,
    /// Blocks of `cache` no other write will copy: whole blocks inside the prefix.
    pub whole_blocks: usize,
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
    /// its blocks (empty when nothing matches). Every node on the way is touched.
    pub fn lookup(&mut self, shape: Shape, tokens: &[u32], limit: usize) -> Hit {
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
        Hit {
            cache: KvCache::from_blocks(shape, blocks, matched),
            whole_blocks: matched / BLOCK,
        }
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
