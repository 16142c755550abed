//! The semantic cache: an answer to a question asked in other words.
//!
//! A request is eligible when the exact cache would keep it (deterministic, storable). Its
//! *space* is the exact key with the last user message (or the prompt) blanked out, so
//! everything else that changes the answer (model, parameters, system prompt, earlier turns,
//! tenant) still has to match exactly; only the final question is compared by meaning.
//!
//! Within a space the nearest cached questions by MiniLM cosine are candidates at or above a
//! floor. The guard's hard vetoes stand first (a number, a unit, a name, a negation, a
//! reversed relation: never left to a model); then the paraphrase verifier reads the cached
//! question and the asked one together for the probability that one answer serves both, and
//! the error budget (`frugal_semantic::budget`, one per `semantic_max_error`) serves it when
//! the share of wrong hits it expects stays within the bound. Without a verifier the guard
//! alone decides, at its thresholds. When the nearest candidate is turned away the lookup
//! says why (`x-frugal-semantic-veto`).
//!
//! Entries are bounded by count (oldest out first) and a time to live. Each holds its
//! question, its 384-float embedding and a share of the answer the exact cache also holds.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use frugal_semantic::budget::{Budget, DEFAULT_MAX_ERROR, Served};
use frugal_semantic::verify::Reading;
use frugal_semantic::{Embedder, Guard, VectorIndex, Verdict, Verifier, Veto, guard};

use crate::cache::exact::Answer;

/// Neighbours read per lookup.
const CANDIDATES: usize = 4;
/// Candidates the verifier reads per lookup at most (~2.5 ms each on one core).
const VERIFIED: usize = 2;

#[derive(Debug, Clone)]
pub struct SemanticConfig {
    /// The guard alone (no verifier): its thresholds and vetoes.
    pub guard: Guard,
    pub max_entries: usize,
    pub ttl: Duration,
    /// The paraphrase verifier; `None`: the guard alone decides.
    pub verifier: Option<Arc<Verifier>>,
    /// With the verifier: the least cosine of a candidate.
    pub floor: f32,
    /// With the verifier: the share of served hits that may be wrong.
    pub max_error: f64,
}

impl Default for SemanticConfig {
    fn default() -> SemanticConfig {
        SemanticConfig {
            guard: Guard::default(),
            max_entries: 10_000,
            ttl: Duration::from_secs(3600),
            verifier: None,
            floor: frugal_semantic::verify::DEFAULT_FLOOR,
            max_error: DEFAULT_MAX_ERROR,
        }
    }
}

/// A lookup's own settings, where the served name's policy sets them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Bounds {
    /// The least cosine (the guard's threshold, or the verifier's floor).
    pub threshold: Option<f32>,
    /// The error budget's bound.
    pub max_error: Option<f64>,
}

pub struct SemanticCache {
    embedder: Arc<Embedder>,
    config: SemanticConfig,
    state: Mutex<State>,
    /// One error budget per bound in use.
    budgets: Mutex<Vec<Arc<Budget>>>,
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

/// A semantic hit: the answer, the similarity it was found at and, when the verifier read
/// it, the calibrated probability that it is right.
pub struct Found {
    pub answer: Arc<Answer>,
    pub similarity: f32,
    pub probability: Option<f32>,
}

/// A candidate read out of the index, so that the guard and the verifier run without the
/// index's lock.
struct Near {
    text: String,
    answer: Arc<Answer>,
    score: f32,
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
    /// The embedder its entries are embedded with (a shadow compares answers with it).
    pub fn embedder(&self) -> &Arc<Embedder> {
        &self.embedder
    }

    pub fn new(embedder: Arc<Embedder>, config: SemanticConfig) -> SemanticCache {
        // The guard's WordNet is parsed once; here, rather than in the first lookup.
        frugal_semantic::lexicon::Lexicon::get();
        SemanticCache {
            embedder,
            config,
            state: Mutex::default(),
            budgets: Mutex::default(),
        }
    }

    /// The error budget of bound `max_error`, made on first use.
    fn budget(&self, max_error: f64) -> Arc<Budget> {
        let mut budgets = self.budgets.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = budgets.iter().find(|b| b.max_error() == max_error) {
            return b.clone();
        }
        let b = Arc::new(Budget::new(max_error));
        budgets.push(b.clone());
        b
    }

    /// What each error budget has served: (bound, account), tightest first.
    pub fn budgets(&self) -> Vec<(f64, Served)> {
        let budgets = self.budgets.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<(f64, Served)> = budgets
            .iter()
            .map(|b| (b.max_error(), b.served()))
            .collect();
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }

    /// Whether a verifier decides (else the guard alone).
    pub fn verifies(&self) -> bool {
        self.config.verifier.is_some()
    }

    /// The bound a lookup without its own is held to.
    pub fn max_error(&self) -> f64 {
        self.config.max_error
    }

    /// The question's embedding, computed off the async threads (~2 ms of CPU); `None` if
    /// it cannot be embedded (the request then just misses).
    pub async fn embed(&self, text: &str) -> Option<Vec<f32>> {
        embed_off_thread(&self.embedder, text, "semantic cache").await
    }

    /// The first cached answer in `space` accepted for `text`: by the vetoes, the verifier
    /// and the error budget, or without a verifier by the guard at its thresholds (`bounds`',
    /// where the served name sets them, else the cache's own).
    pub fn find(&self, space: &str, text: &str, v: &[f32], bounds: Bounds) -> Search {
        let near = self.nearest(space, v);
        match &self.config.verifier {
            Some(verifier) => self.verify(text, near, verifier, bounds),
            None => self.judge(text, near, bounds.threshold),
        }
    }

    /// The live entries nearest `v` in `space`, best first (expired ones removed).
    fn nearest(&self, space: &str, v: &[f32]) -> Vec<Near> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(index) = state.spaces.get(space) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for n in index.search(v, CANDIDATES) {
            let Some(e) = state.entries.get(&n.id) else {
                continue;
            };
            if e.born.elapsed() > self.config.ttl {
                state.remove(n.id);
                continue;
            }
            out.push(Near {
                text: e.text.clone(),
                answer: e.answer.clone(),
                score: n.score,
            });
        }
        out
    }

    fn judge(&self, text: &str, near: Vec<Near>, threshold: Option<f32>) -> Search {
        let guard = threshold.map_or(self.config.guard, |t| self.config.guard.at(t));
        let mut vetoed = None;
        for n in near {
            match guard.judge(text, &n.text, n.score, Some(&self.embedder)) {
                Verdict::Same => {
                    return Search::Hit(Found {
                        answer: n.answer,
                        similarity: n.score,
                        probability: None,
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

    fn verify(&self, text: &str, near: Vec<Near>, verifier: &Verifier, bounds: Bounds) -> Search {
        let floor = bounds.threshold.unwrap_or(self.config.floor);
        let budget = self.budget(bounds.max_error.unwrap_or(self.config.max_error));
        let (mut why, mut read) = (None, 0);
        for n in near.into_iter().take_while(|n| n.score >= floor) {
            let x = guard::explain(text, &n.text, Some(&self.embedder));
            if let Some(v) = x.veto.filter(|v| v.is_hard()) {
                why.get_or_insert(v);
                continue;
            }
            if read == VERIFIED {
                break;
            }
            read += 1;
            let r = Reading {
                cosine: n.score,
                aligned: x.aligned(),
                soft_veto: x.veto.is_some(),
            };
            let p = match verifier.probability(&n.text, text, &r) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("semantic cache verifier: {e}");
                    break;
                }
            };
            if budget.consider(p) {
                return Search::Hit(Found {
                    answer: n.answer,
                    similarity: n.score,
                    probability: Some(p),
                });
            }
            why.get_or_insert(Veto::Verifier);
        }
        Search::Miss(why)
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
        bounds: Bounds,
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
                this.find(&space, &text, &v, bounds)
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
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::path::Path;
    use std::sync::OnceLock;

    use frugal_cost::Money;
    use frugal_engine::scheduler::FinishReason;
    use frugal_semantic::Verifier;

    use super::*;
    use crate::cache::exact::Chunk;
    use crate::http::api::Usage;

    /// MiniLM, loaded once for the crate's tests.
    pub(crate) fn embedder() -> Arc<Embedder> {
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

    /// The shipped verifier, behind a budget of `max_error`.
    fn verified(max_error: f64) -> SemanticCache {
        static V: OnceLock<Arc<Verifier>> = OnceLock::new();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let v = V.get_or_init(|| {
            let file = root.join(frugal_semantic::verify::DEFAULT_VERIFIER);
            let base = root.join(frugal_semantic::DEFAULT_EMBEDDER);
            Arc::new(Verifier::load(&base, &file).expect("run scripts/fetch-models.sh minilm"))
        });
        cache(SemanticConfig {
            verifier: Some(v.clone()),
            max_error,
            ..SemanticConfig::default()
        })
    }

    async fn search(c: &SemanticCache, q: &str, bounds: Bounds) -> Search {
        let v = c.embed(q).await.unwrap();
        c.find("s", q, &v, bounds)
    }

    async fn put(c: &SemanticCache, space: &str, q: &str, a: &str) {
        let v = c.embed(q).await.unwrap();
        c.insert(space.into(), q.into(), &v, answer(a));
    }

    async fn get(c: &SemanticCache, space: &str, q: &str) -> Option<String> {
        let v = c.embed(q).await.unwrap();
        c.find(space, q, &v, Bounds::default())
            .found()
            .map(|f| f.answer.text())
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
    async fn the_verifier_serves_a_reworded_question_within_the_budget_behind_the_hard_vetoes() {
        let c = verified(0.05);
        put(&c, "s", "Who wrote Pride and Prejudice?", "Jane Austen").await;
        put(&c, "s", "How do I convert dollars to rupees?", "rate").await;
        // Another frame of the same question: below the guard's cosine thresholds, but the
        // verifier reads both and serves it.
        let reworded = "Who is the author of Pride and Prejudice?";
        let Search::Hit(hit) = search(&c, reworded, Bounds::default()).await else {
            panic!("{reworded:?} missed");
        };
        assert_eq!(hit.answer.text(), "Jane Austen");
        assert!(hit.similarity < frugal_semantic::guard::DEFAULT_THRESHOLD);
        // A reversed relation is a hard veto: no model decides it.
        let Search::Miss(why) =
            search(&c, "How do I convert rupees to dollars?", Bounds::default()).await
        else {
            panic!("a swapped question was served");
        };
        assert_eq!(why, Some(Veto::Swapped));
        // Another role in the same frame: the verifier (or a soft veto) turns it away.
        let other = search(
            &c,
            "Who illustrated Pride and Prejudice?",
            Bounds::default(),
        )
        .await;
        assert!(
            matches!(other, Search::Miss(Some(_))),
            "another question was served"
        );
        // A route's own bound has its own budget: at 0 no hit is ever doubtful enough.
        let none_wrong = Bounds {
            max_error: Some(0.0),
            ..Bounds::default()
        };
        let refused = search(&c, reworded, none_wrong).await;
        assert!(matches!(refused, Search::Miss(Some(Veto::Verifier))));
        let budgets = c.budgets();
        assert_eq!(budgets.len(), 2, "{budgets:?}");
        let (bound, served) = budgets[1];
        assert_eq!(bound, 0.05);
        assert_eq!(served.hits, 1);
        assert!(served.candidates >= 2, "{served:?}");
        let e = served.estimate();
        assert!(
            e.rate <= 0.05 && e.low <= e.rate && e.rate <= e.high,
            "{e:?}"
        );
        // A floor above the pair's cosine: not even a candidate.
        let high = Bounds {
            threshold: Some(0.99),
            ..Bounds::default()
        };
        assert!(matches!(
            search(&c, reworded, high).await,
            Search::Miss(None)
        ));
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
            assert!(c.find("s", q, &v, Bounds::default()).found().is_none());
        }
        assert!(c.order_len() <= 2 * c.len() + 65, "{}", c.order_len());
    }
}
