//! The semantic cache: an answer to a question asked in other words.
//!
//! A request is eligible when the exact cache would keep it (deterministic, storable). Its
//! *space* is the exact key with the last user message (or the prompt) blanked out, so
//! everything else that changes the answer (model, parameters, system prompt, earlier turns,
//! tenant) still has to match exactly; only the final question is compared by meaning. Within
//! a space the nearest cached questions by MiniLM cosine are checked by the guard
//! (`frugal_semantic::Guard`), and the first it accepts is served; when it vetoes the
//! nearest similar-enough one instead, the lookup says why (`x-frugal-semantic-veto`).
//!
//! Entries are bounded by count (oldest out first) and a time to live. Each holds its
//! question, its 384-float embedding and a share of the answer the exact cache also holds.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use frugal_semantic::{Embedder, Guard, VectorIndex, Verdict, Veto};

use crate::cache::exact::Answer;

/// Neighbours checked by the guard per lookup.
const CANDIDATES: usize = 4;

#[derive(Debug, Clone, Copy)]
pub struct SemanticConfig {
    pub guard: Guard,
    pub max_entries: usize,
    pub ttl: Duration,
}

impl Default for SemanticConfig {
    fn default() -> SemanticConfig {
        SemanticConfig {
            guard: Guard::default(),
            max_entries: 10_000,
            ttl: Duration::from_secs(3600),
        }
    }
}

pub struct SemanticCache {
    embedder: Arc<Embedder>,
    config: SemanticConfig,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    spaces: HashMap<Arc<str>, VectorIndex>,
    entries: HashMap<u64, Entry>,
    order: VecDeque<u64>,
    next: u64,
}

struct Entry {
    space: Arc<str>,
    text: String,
    answer: Arc<Answer>,
    born: Instant,
}

/// A semantic hit: the answer and the similarity it was found at.
pub struct Found {
    pub answer: Arc<Answer>,
    pub similarity: f32,
}

/// What a lookup found: an answer the guard accepted, or why it turned away the nearest
/// entry that was similar enough (`None` when none was).
pub enum Search {
    Hit(Found),
    Miss(Option<Veto>),
}

#[cfg(test)]
impl Search {
    fn found(self) -> Option<Found> {
        match self {
            Search::Hit(f) => Some(f),
            Search::Miss(_) => None,
        }
    }
}

impl State {
    fn remove(&mut self, id: u64) {
        if let Some(e) = self.entries.remove(&id)
            && let Some(index) = self.spaces.get_mut(&e.space)
        {
            index.remove(id);
            if index.is_empty() {
                self.spaces.remove(&e.space);
            }
        }
    }
}

impl SemanticCache {
    pub fn new(embedder: Arc<Embedder>, config: SemanticConfig) -> SemanticCache {
        // The guard's WordNet is parsed once; here, rather than in the first lookup.
        frugal_semantic::lexicon::Lexicon::get();
        SemanticCache {
            embedder,
            config,
            state: Mutex::default(),
        }
    }

    /// The question's embedding, computed off the async threads (~2 ms of CPU); `None` if
    /// it cannot be embedded (the request then just misses).
    pub async fn embed(&self, text: &str) -> Option<Vec<f32>> {
        embed_off_thread(&self.embedder, text, "semantic cache").await
    }

    /// The first cached answer in `space` that the guard accepts for `text`, at `threshold`
    /// if given (a route's; the aligned pairs' threshold moves with it), else the cache's own.
    pub fn find(&self, space: &str, text: &str, v: &[f32], threshold: Option<f32>) -> Search {
        let guard = threshold.map_or(self.config.guard, |t| self.config.guard.at(t));
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(index) = state.spaces.get(space) else {
            return Search::Miss(None);
        };
        let near = index.search(v, CANDIDATES);
        let mut vetoed = None;
        for n in near {
            let Some(e) = state.entries.get(&n.id) else {
                continue;
            };
            if e.born.elapsed() > self.config.ttl {
                state.remove(n.id);
                continue;
            }
            match guard.judge(text, &e.text, n.score, Some(&self.embedder)) {
                Verdict::Same => {
                    return Search::Hit(Found {
                        answer: e.answer.clone(),
                        similarity: n.score,
                    });
                }
                Verdict::Veto(v) => {
                    vetoed.get_or_insert(v);
                }
                Verdict::TooFar => {}
            }
        }
        Search::Miss(vetoed)
    }

    pub fn insert(&self, space: Arc<str>, text: String, v: &[f32], answer: Arc<Answer>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while state.entries.len() >= self.config.max_entries.max(1) {
            match state.order.pop_front() {
                Some(old) => state.remove(old),
                None => break,
            }
        }
        let id = state.next;
        state.next += 1;
        let dim = v.len();
        state
            .spaces
            .entry(space.clone())
            .or_insert_with(|| VectorIndex::new(dim))
            .add(id, v);
        state.entries.insert(
            id,
            Entry {
                space,
                text,
                answer,
                born: Instant::now(),
            },
        );
        state.order.push_back(id);
        // Entries that expired on lookup leave their ids behind here; compacting once stale
        // ids outnumber live ones keeps the list bounded at amortized O(1) per insert.
        if state.order.len() > 2 * state.entries.len() + 64 {
            let State { order, entries, .. } = &mut *state;
            order.retain(|id| entries.contains_key(id));
        }
    }

    /// The question's embedding and the first cached answer the guard accepts, computed off
    /// the async threads (the embedding is ~2 ms of CPU; the scan and the guard hold the
    /// index's lock). `None` for the embedding if it cannot be computed (the request misses).
    pub async fn lookup(
        self: &Arc<Self>,
        space: Arc<str>,
        text: String,
        threshold: Option<f32>,
        read: bool,
    ) -> (Option<Vec<f32>>, Search, Duration) {
        let this = self.clone();
        let work = move || {
            let v = match this.embedder.embed(&text) {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!("semantic cache: {e}");
                    return (None, Search::Miss(None), Duration::ZERO);
                }
            };
            let t = Instant::now();
            let found = if read {
                this.find(&space, &text, &v, threshold)
            } else {
                Search::Miss(None)
            };
            (Some(v), found, t.elapsed())
        };
        tokio::task::spawn_blocking(work).await.unwrap_or((
            None,
            Search::Miss(None),
            Duration::ZERO,
        ))
    }

    /// Inserts off the async threads when there are some (a graph relink can take a while).
    pub fn insert_later(
        self: &Arc<Self>,
        space: Arc<str>,
        text: String,
        v: Vec<f32>,
        answer: Arc<Answer>,
    ) {
        let this = self.clone();
        let work = move || this.insert(space, text, &v, answer);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(work)),
            Err(_) => work(),
        }
    }

    /// Ids in the eviction order, live or stale.
    #[cfg(test)]
    fn order_len(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .order
            .len()
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entries
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `text`'s embedding, computed off the async threads; `None` (logged under `what`) if it
/// cannot be embedded.
pub async fn embed_off_thread(
    embedder: &Arc<Embedder>,
    text: &str,
    what: &str,
) -> Option<Vec<f32>> {
    let (embedder, text) = (embedder.clone(), text.to_owned());
    match tokio::task::spawn_blocking(move || embedder.embed(&text)).await {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) => {
            tracing::warn!("{what}: {e}");
            None
        }
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::path::Path;
    use std::sync::OnceLock;

    use frugal_cost::Money;
    use frugal_engine::scheduler::FinishReason;

    use super::*;
    use crate::cache::exact::Chunk;
    use crate::http::api::Usage;

    fn embedder() -> Arc<Embedder> {
        static E: OnceLock<Arc<Embedder>> = OnceLock::new();
        E.get_or_init(|| {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../..")
                .join(frugal_semantic::DEFAULT_EMBEDDER);
            Arc::new(Embedder::load(&dir).expect("run scripts/fetch-models.sh minilm"))
        })
        .clone()
    }

    fn answer(text: &str) -> Arc<Answer> {
        Arc::new(Answer {
            chunks: vec![Chunk {
                text: text.into(),
                logprobs: vec![],
            }],
            finish_reason: FinishReason::Stop,
            usage: Usage::default(),
            cost: Money::from_nanos(1000),
            judged: None,
        })
    }

    fn cache(config: SemanticConfig) -> SemanticCache {
        SemanticCache::new(embedder(), config)
    }

    async fn put(c: &SemanticCache, space: &str, q: &str, a: &str) {
        let v = c.embed(q).await.unwrap();
        c.insert(space.into(), q.into(), &v, answer(a));
    }

    async fn get(c: &SemanticCache, space: &str, q: &str) -> Option<String> {
        let v = c.embed(q).await.unwrap();
        c.find(space, q, &v, None).found().map(|f| f.answer.text())
    }

    #[tokio::test]
    async fn rewording_hits_and_other_questions_miss() {
        let c = cache(SemanticConfig::default());
        put(
            &c,
            "s",
            "How can I improve my English speaking skills?",
            "practice",
        )
        .await;
        put(&c, "s", "How do I convert dollars to rupees?", "rate").await;
        let hit = get(&c, "s", "How do I improve my English speaking skills?").await;
        assert_eq!(hit.as_deref(), Some("practice"));
        // Near-identical text, another meaning: vetoed.
        assert_eq!(
            get(&c, "s", "How do I convert rupees to dollars?").await,
            None
        );
        assert_eq!(
            get(&c, "s", "What is the boiling point of water?").await,
            None
        );
        // Another space (other parameters, other tenant) never sees the entry.
        assert_eq!(
            get(&c, "t", "How can I improve my English speaking skills?").await,
            None
        );
    }

    #[tokio::test]
    async fn bounded_by_count_oldest_out_first() {
        let c = cache(SemanticConfig {
            max_entries: 2,
            ..SemanticConfig::default()
        });
        put(&c, "s", "What is the capital of France?", "Paris").await;
        put(&c, "s", "Who wrote Hamlet?", "Shakespeare").await;
        put(&c, "s", "How far is the Moon from Earth?", "384,400 km").await;
        assert_eq!(c.len(), 2);
        assert_eq!(get(&c, "s", "What is the capital of France?").await, None);
        assert_eq!(
            get(&c, "s", "Who wrote Hamlet?").await.as_deref(),
            Some("Shakespeare")
        );
    }

    #[tokio::test]
    async fn expired_entries_are_not_served() {
        let c = cache(SemanticConfig {
            ttl: Duration::from_millis(30),
            ..SemanticConfig::default()
        });
        put(&c, "s", "Who wrote Hamlet?", "Shakespeare").await;
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(get(&c, "s", "Who wrote Hamlet?").await, None);
        assert!(c.is_empty());
    }

    #[tokio::test]
    async fn ids_of_expired_entries_do_not_pile_up_in_the_eviction_order() {
        let c = cache(SemanticConfig {
            ttl: Duration::from_millis(1),
            ..SemanticConfig::default()
        });
        let q = "Who wrote Hamlet?";
        let v = c.embed(q).await.unwrap();
        for _ in 0..500 {
            c.insert("s".into(), q.into(), &v, answer("Shakespeare"));
            std::thread::sleep(Duration::from_millis(2));
            // The lookup finds the entry expired and removes it.
            assert!(c.find("s", q, &v, None).found().is_none());
        }
        assert!(c.order_len() <= 2 * c.len() + 65, "{}", c.order_len());
    }
}
