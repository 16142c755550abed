//! Nearest cached prompts by cosine similarity.
//!
//! `FlatIndex` scans every entry: at 384 dimensions ~50-60 ns an entry on one core (0.5 ms at
//! 10k, 7 ms at 100k), exact, and adding or removing costs next to nothing. `Hnsw` (see
//! `hnsw`) searches a graph: 0.4-0.6 ms from 10k to 300k entries, but evicting an entry and
//! adding one costs ~1-1.4 ms of relinking. `VectorIndex` is flat while small and a graph from
//! `GRAPH_FROM` entries on (BENCHMARKS.md, "the vector index").

use crate::hnsw::Hnsw;

pub use crate::flat::{FlatIndex, Neighbour};

/// Entries from which `VectorIndex` searches a graph. Its search (ef 128) wins from ~10k,
/// but a cache also evicts and adds on every miss, ~1-1.4 ms of relinking: at 20k the scan
/// (1.3 ms) still costs less than a graph search (0.6 ms) plus that upkeep once over half
/// the requests miss; at 30k (~1.9 ms, the scan is linear) the graph wins at almost any miss
/// rate, and at 100k the scan takes 8 ms against 0.4.
pub const GRAPH_FROM: usize = 30_000;

/// The index the semantic cache uses: `FlatIndex`'s operations, one vector per id (adding a
/// present id replaces it), flat below `GRAPH_FROM` entries and an HNSW graph above.
///
/// The graph is built a step per add from `GRAPH_FROM / 2` entries on (each add links itself
/// and one older entry), so it is whole by about `GRAPH_FROM` with no pause under the
/// cache's lock; searches stay flat until then. Below `GRAPH_FROM / 4` it is flat again (a
/// cache that shrank, say after its entries expired, gets exact search and the links'
/// memory back); the gap keeps a cache near the size from rebuilding back and forth.
#[derive(Debug)]
pub struct VectorIndex {
    dim: usize,
    graph_from: usize,
    state: State,
}

#[derive(Debug)]
enum State {
    Flat(FlatIndex),
    /// Searched flat while `graph` is built; flat entries before `cursor` were linked (an
    /// entry a removal moved behind it is picked up at the end).
    Growing {
        flat: FlatIndex,
        graph: Hnsw,
        cursor: usize,
    },
    Graph(Hnsw),
}

impl VectorIndex {
    pub fn new(dim: usize) -> VectorIndex {
        VectorIndex::with_graph_from(dim, GRAPH_FROM)
    }

    /// As `new`, switching to a graph at `graph_from` entries instead.
    pub fn with_graph_from(dim: usize, graph_from: usize) -> VectorIndex {
        VectorIndex {
            dim,
            graph_from: graph_from.max(4),
            state: State::Flat(FlatIndex::new(dim)),
        }
    }

    pub fn len(&self) -> usize {
        match &self.state {
            State::Flat(flat) | State::Growing { flat, .. } => flat.len(),
            State::Graph(graph) => graph.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True while searches go to the graph.
    pub fn is_graph(&self) -> bool {
        matches!(self.state, State::Graph(_))
    }

    /// Add a unit vector of this index's width under `id`, replacing any there (other widths
    /// are ignored: they cannot be compared).
    pub fn add(&mut self, id: u64, v: &[f32]) {
        if v.len() != self.dim {
            return;
        }
        let dim = self.dim;
        self.state = match std::mem::replace(&mut self.state, State::Flat(FlatIndex::new(dim))) {
            State::Flat(mut flat) => {
                flat.remove(id);
                flat.add(id, v);
                if flat.len() >= self.graph_from / 2 {
                    State::Growing {
                        flat,
                        graph: Hnsw::new(dim),
                        cursor: 0,
                    }
                } else {
                    State::Flat(flat)
                }
            }
            State::Growing {
                mut flat,
                mut graph,
                mut cursor,
            } => {
                flat.remove(id);
                flat.add(id, v);
                graph.add(id, v);
                while let Some((old, v)) = flat.entry(cursor) {
                    cursor += 1;
                    if !graph.contains(old) {
                        graph.add(old, v);
                        break;
                    }
                }
                if cursor < flat.len() {
                    State::Growing {
                        flat,
                        graph,
                        cursor,
                    }
                } else {
                    for (old, v) in (0..flat.len()).filter_map(|i| flat.entry(i)) {
                        if !graph.contains(old) {
                            graph.add(old, v);
                        }
                    }
                    State::Graph(graph)
                }
            }
            State::Graph(mut graph) => {
                graph.add(id, v);
                State::Graph(graph)
            }
        };
    }

    /// Remove the vector under `id`; true if there was one.
    pub fn remove(&mut self, id: u64) -> bool {
        let shrunk = self.graph_from / 4;
        let (found, flat) = match &mut self.state {
            State::Flat(flat) => return flat.remove(id),
            State::Growing { flat, graph, .. } => {
                graph.remove(id);
                let found = flat.remove(id);
                if flat.len() >= shrunk {
                    return found;
                }
                (found, std::mem::take(flat))
            }
            State::Graph(graph) => {
                let found = graph.remove(id);
                if graph.len() >= shrunk {
                    return found;
                }
                let mut flat = FlatIndex::new(self.dim);
                for (id, v) in graph.iter() {
                    flat.add(id, v);
                }
                (found, flat)
            }
        };
        self.state = State::Flat(flat);
        found
    }

    /// The `k` most similar entries, best first (from the graph: approximate, with exact
    /// scores).
    pub fn search(&self, q: &[f32], k: usize) -> Vec<Neighbour> {
        match &self.state {
            State::Flat(flat) | State::Growing { flat, .. } => flat.search(q, k),
            State::Graph(graph) => graph.search(q, k),
        }
    }

    /// Bytes held per entry (vectors, ids and, from half of `GRAPH_FROM` on, the graph).
    pub fn bytes_per_entry(&self) -> usize {
        match &self.state {
            State::Flat(flat) => flat.bytes_per_entry(),
            State::Growing { flat, graph, .. } => {
                flat.bytes_per_entry() + graph.bytes_per_entry() * graph.len() / flat.len().max(1)
            }
            State::Graph(graph) => graph.bytes_per_entry(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::synthetic::seeded_unit as unit;

    /// Through every state: flat, growing a graph under adds and removals, graph, flat
    /// again; every live entry findable and every removed one gone at each step.
    #[test]
    fn vector_index_switches_and_keeps_every_entry() {
        let dim = 24;
        let mut idx = VectorIndex::with_graph_from(dim, 400);
        let check = |idx: &VectorIndex, live: &[u64], gone: &[u64]| {
            assert_eq!(idx.len(), live.len());
            for &i in live {
                assert_eq!(idx.search(&unit(i, dim), 1)[0].id, i);
            }
            for &i in gone {
                assert!(idx.search(&unit(i, dim), 5).iter().all(|n| n.id != i));
            }
        };
        for i in 0..150 {
            idx.add(i, &unit(i, dim));
        }
        assert!(matches!(idx.state, State::Flat(_)));
        // Removals while the graph grows move flat entries behind the cursor.
        for i in 150..300 {
            idx.add(i, &unit(i, dim));
            if i % 5 == 0 {
                idx.remove(i - 150);
            }
        }
        assert!(matches!(idx.state, State::Growing { .. }));
        let live: Vec<u64> = (0..300).filter(|i| i % 5 != 0 || *i >= 150).collect();
        let gone: Vec<u64> = (0..150).step_by(5).collect();
        check(&idx, &live, &gone);
        for i in 300..600 {
            idx.add(i, &unit(i, dim));
        }
        assert!(idx.is_graph());
        let live: Vec<u64> = live.into_iter().chain(300..600).collect();
        check(&idx, &live, &gone);
        assert!(idx.bytes_per_entry() > FlatIndex::new(dim).bytes_per_entry());
        for &i in &live[..live.len() - 90] {
            assert!(idx.remove(i));
        }
        assert!(!idx.is_graph());
        check(&idx, &live[live.len() - 90..], &live[..10]);
        assert_eq!(idx.bytes_per_entry(), FlatIndex::new(dim).bytes_per_entry());
    }

    #[test]
    fn vector_index_holds_one_vector_per_id() {
        let dim = 8;
        for graph_from in [GRAPH_FROM, 4] {
            let mut idx = VectorIndex::with_graph_from(dim, graph_from);
            assert!(idx.is_empty() && idx.search(&unit(1, dim), 3).is_empty());
            for i in 0..10 {
                idx.add(i, &unit(i, dim));
            }
            idx.add(3, &unit(99, dim));
            idx.add(3, &[1.0]);
            assert_eq!(idx.len(), 10);
            assert_eq!(idx.search(&unit(99, dim), 1)[0].id, 3);
            assert_eq!(idx.search(&unit(1, dim), 50).len(), 10);
            assert!(idx.remove(3) && !idx.remove(3));
            assert!(idx.search(&unit(99, dim), 10).iter().all(|n| n.id != 3));
        }
    }
}
