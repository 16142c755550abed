//! The exact cache: a finished answer, replayed for the next request that would get the
//! same answer.
//!
//! The key is the canonical form of everything in the request body that can change the
//! answer: every field, known or not, except the few that only change how the answer is
//! delivered (`stream`, `stream_options`, `user`, ...). Canonical means object keys sorted,
//! nulls and explicit defaults dropped, `stop: "x"` = `stop: ["x"]`, `max_completion_tokens`
//! = `max_tokens`, `1.0` = `1`. Only deterministic requests are cached (temperature 0, or a
//! seed; embeddings always), so a hit returns what the model would have said anyway.
//!
//! Entries are bounded by bytes with least-recently-used eviction and a time to live, on
//! moka (a concurrent cache whose reads do not serialize on one lock); the full key is
//! stored and compared, so a hash collision can never serve another request's answer.
//! Identical requests that arrive while the first is still being answered wait for its
//! answer instead of computing it again ([`ExactCache::claim`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use frugal_cost::Money;
use frugal_engine::scheduler::FinishReason;
use moka::policy::EvictionPolicy;
use serde_json::{Map, Value};
use tokio::sync::watch;

use crate::http::api::{TokenLogprob, Usage};

/// Fields that change how an answer is delivered, never what it says.
const DELIVERY_ONLY: &[&str] = &["stream", "stream_options", "user", "metadata", "store"];

/// Limits of the cache.
#[derive(Debug, Clone, Copy)]
pub struct CacheConfig {
    /// Bytes of keys and answers held at most.
    pub max_bytes: u64,
    pub ttl: Duration,
}

impl Default for CacheConfig {
    fn default() -> CacheConfig {
        CacheConfig {
            max_bytes: 256 << 20,
            ttl: Duration::from_secs(3600),
        }
    }
}

/// One streamed piece of a cached answer.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Chunk {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
}

/// A finished answer as it was produced, with what producing it cost.
#[derive(Debug, Clone)]
pub struct Answer {
    pub chunks: Vec<Chunk>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    /// What the call cost: each hit saves this much.
    pub cost: Money,
    /// Each token's logprob as the model produced it, so a cascade can judge a cached
    /// answer as it judged the fresh one; `None` where unknown (an upstream's answer).
    pub judged: Option<Vec<f32>>,
}

impl Answer {
    /// The whole text.
    pub fn text(&self) -> String {
        self.chunks.iter().map(|c| c.text.as_str()).collect()
    }

    fn weight(&self, key: &str) -> u32 {
        // Text, plus token strings, bytes and alternatives of the logprobs, plus fixed
        // overhead per entry and per chunk.
        let logprobs: usize = self
            .chunks
            .iter()
            .flat_map(|c| &c.logprobs)
            .map(|l| 2 * l.token.len() + 16 + l.top_logprobs.len() * 48)
            .sum();
        let text: usize = self.chunks.iter().map(|c| c.text.len() + 56).sum();
        u32::try_from(key.len() + text + logprobs + 160).unwrap_or(u32::MAX)
    }
}

/// Why a request does or does not go through the cache.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    /// Cacheable: look up (unless the client said `no-cache`) and store under this key;
    /// `probe` is the semantic cache's view when the request ends in one question.
    Key {
        key: Arc<str>,
        read: bool,
        probe: Option<Probe>,
    },
    /// Not cacheable: sampled, or the client said `no-store`, or the cache is off.
    Bypass,
}

/// A request as the semantic cache sees it: the final question, and everything else.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    /// The exact key with the question blanked: what must match exactly.
    pub space: Arc<str>,
    /// The last user message (chat) or the prompt (completions).
    pub text: String,
    /// The least cosine for a hit, where the model's policy sets one.
    pub threshold: Option<f32>,
    /// The error budget's bound, where the model's policy sets one.
    pub max_error: Option<f64>,
}

/// How one served name (the local model, an upstream, a route) uses the caches.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CachePolicy {
    /// One namespace for every tenant: an answer cached for one is served to the others.
    pub shared: bool,
    /// The semantic cache's least cosine for a hit [default: the cache's own].
    pub semantic_threshold: Option<f32>,
    /// The share of the semantic cache's hits that may be wrong [default: the cache's own].
    pub semantic_max_error: Option<f64>,
}

type Pending = watch::Receiver<Option<Arc<Answer>>>;

pub struct ExactCache {
    entries: moka::sync::Cache<Arc<str>, Arc<Answer>>,
    /// Keys being answered now, and where their answer will appear.
    inflight: Arc<Mutex<HashMap<Arc<str>, Pending>>>,
}

/// Who answers a missed key.
pub enum Claim {
    /// This request: store the answer with [`Leader::fulfil`].
    Leader(Leader),
    /// Another request already is: wait with [`wait`].
    Follower(Pending),
}

/// The right to answer a key; dropped without an answer (a failure, a disconnect), it lets
/// the waiting requests go and answer for themselves.
pub struct Leader {
    key: Arc<str>,
    tx: watch::Sender<Option<Arc<Answer>>>,
    inflight: Arc<Mutex<HashMap<Arc<str>, Pending>>>,
}

impl Leader {
    pub fn key(&self) -> &Arc<str> {
        &self.key
    }

    /// Stores the answer and hands it to the requests waiting for it.
    pub fn fulfil(self, cache: &ExactCache, answer: Answer) -> Arc<Answer> {
        let answer = Arc::new(answer);
        cache.entries.insert(self.key.clone(), answer.clone());
        self.tx.send_replace(Some(answer.clone()));
        answer
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        self.inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
    }
}

/// The leader's answer, or `None` if it ended without one.
pub async fn wait(mut pending: Pending) -> Option<Arc<Answer>> {
    pending
        .wait_for(Option::is_some)
        .await
        .ok()
        .and_then(|a| a.clone())
}

impl ExactCache {
    pub fn new(config: CacheConfig) -> ExactCache {
        ExactCache {
            entries: moka::sync::Cache::builder()
                .max_capacity(config.max_bytes)
                .weigher(|k: &Arc<str>, v: &Arc<Answer>| v.weight(k))
                .time_to_live(config.ttl)
                .eviction_policy(EvictionPolicy::lru())
                .build(),
            inflight: Arc::default(),
        }
    }

    /// After a miss: lead the key, or follow the request already answering it.
    pub fn claim(&self, key: &Arc<str>) -> Claim {
        let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pending) = inflight.get(key) {
            return Claim::Follower(pending.clone());
        }
        let (tx, rx) = watch::channel(None);
        inflight.insert(key.clone(), rx);
        Claim::Leader(Leader {
            key: key.clone(),
            tx,
            inflight: self.inflight.clone(),
        })
    }

    pub fn get(&self, key: &Arc<str>) -> Option<Arc<Answer>> {
        self.entries.get(key)
    }

    pub fn insert(&self, key: Arc<str>, answer: Arc<Answer>) {
        self.entries.insert(key, answer);
    }

    /// Entries and their weighed bytes (after pending maintenance).
    pub fn usage(&self) -> (u64, u64) {
        self.entries.run_pending_tasks();
        (self.entries.entry_count(), self.entries.weighted_size())
    }
}

/// Decides how a request meets the cache: `body` is the parsed request, `endpoint` and
/// `model` (the resolved model, so aliases share entries) and `namespace` (the tenant)
/// go into the key; `cache_control` is the request's header.
pub fn lookup(
    body: &Value,
    endpoint: &str,
    model: &str,
    namespace: &str,
    cache_control: Option<&str>,
) -> Lookup {
    let directives: Vec<String> = cache_control
        .unwrap_or("")
        .split(',')
        .map(|d| d.trim().to_ascii_lowercase())
        .collect();
    // Embeddings are a function of their input: every one is kept.
    let deterministic = endpoint == "embeddings" || deterministic(body);
    if directives.iter().any(|d| d == "no-store") || !deterministic {
        return Lookup::Bypass;
    }
    let Value::Object(fields) = body else {
        return Lookup::Bypass;
    };
    let mut canon = Map::new();
    for (k, v) in fields {
        if DELIVERY_ONLY.contains(&k.as_str()) || k == "model" {
            continue;
        }
        let k = if k == "max_completion_tokens" {
            "max_tokens"
        } else {
            k.as_str()
        };
        let v = canonical(v);
        if v.is_null() || is_default(k, &v) {
            continue;
        }
        let v = match (k, v) {
            ("stop", Value::String(s)) => Value::Array(vec![Value::String(s)]),
            (_, v) => v,
        };
        canon.insert(k.to_owned(), v);
    }
    // serde_json's Map is ordered by key, so this string is canonical.
    let head = format!("{namespace}\u{0}{endpoint}\u{0}{model}\u{0}");
    let key = format!("{head}{}", Value::Object(canon.clone()));
    let probe = question(&mut canon).map(|text| Probe {
        space: format!("{head}{}", Value::Object(canon)).into(),
        text,
        threshold: None,
        max_error: None,
    });
    Lookup::Key {
        key: key.into(),
        read: !directives.iter().any(|d| d == "no-cache"),
        probe,
    }
}

/// The final question of a request body (as the semantic cache reads it), if it has one.
pub fn question_text(body: &Value) -> Option<String> {
    let Value::Object(map) = body else {
        return None;
    };
    question(&mut map.clone())
}

/// Takes the final question out of a canonical request: the last message's text when it is
/// the user's, or a single string prompt. Other shapes (tool results, image parts, several
/// prompts) have no semantic probe.
fn question(canon: &mut Map<String, Value>) -> Option<String> {
    let slot = if let Some(Value::Array(messages)) = canon.get_mut("messages") {
        let last = messages.last_mut()?;
        if last.get("role").and_then(Value::as_str) != Some("user") {
            return None;
        }
        last.get_mut("content")?
    } else {
        canon.get_mut("prompt")?
    };
    let text = match &*slot {
        Value::String(s) => s.clone(),
        Value::Array(parts) => {
            let texts: Option<Vec<&str>> = parts
                .iter()
                .map(|p| match p.get("type").and_then(Value::as_str) {
                    Some("text") => p.get("text").and_then(Value::as_str),
                    _ => None,
                })
                .collect();
            texts?.join("\n")
        }
        _ => return None,
    };
    if text.trim().is_empty() {
        return None;
    }
    *slot = Value::Null;
    Some(text)
}

/// Temperature 0 (greedy), or a seed: the same request gets the same answer.
fn deterministic(body: &Value) -> bool {
    let greedy = body
        .get("temperature")
        .and_then(Value::as_f64)
        .is_some_and(|t| t == 0.0);
    let seeded = body.get("seed").is_some_and(|s| !s.is_null());
    greedy || seeded
}

/// Values that mean the same as leaving the field out.
fn is_default(key: &str, v: &Value) -> bool {
    match key {
        "n" | "top_p" => v.as_f64() == Some(1.0),
        "presence_penalty" | "frequency_penalty" => v.as_f64() == Some(0.0),
        "logprobs" | "ignore_eos" | "echo" => v.as_bool() == Some(false),
        _ => false,
    }
}

/// Sorted keys (by serde_json's map), nulls inside objects dropped, integral floats as
/// integers.
fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), canonical(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
            _ => v.clone(),
        },
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "model": "m",
            "messages": [{ "role": "user", "content": "What is 2 + 2?" }],
            "temperature": 0,
            "max_tokens": 16,
        })
    }

    fn key(body: &Value) -> Arc<str> {
        match lookup(body, "chat", "m", "", None) {
            Lookup::Key {
                key, read: true, ..
            } => key,
            other => panic!("not cacheable: {other:?}"),
        }
    }

    fn with(field: &str, v: Value) -> Value {
        let mut b = base();
        b[field] = v;
        b
    }

    #[test]
    fn every_answer_changing_field_changes_the_key() {
        let k = key(&base());
        let changes = [
            (
                "messages",
                json!([{ "role": "user", "content": "What is 2 + 3?" }]),
            ),
            (
                "tools",
                json!([{ "type": "function", "function": { "name": "f" } }]),
            ),
            ("tool_choice", json!("required")),
            ("response_format", json!({ "type": "json_object" })),
            ("top_p", json!(0.5)),
            ("top_k", json!(5)),
            ("max_tokens", json!(17)),
            ("stop", json!(["\n"])),
            ("seed", json!(7)),
            ("n", json!(2)),
            ("logprobs", json!(true)),
            ("top_logprobs", json!(3)),
            ("presence_penalty", json!(0.5)),
            ("frequency_penalty", json!(0.5)),
            ("logit_bias", json!({ "50256": -100 })),
            ("ignore_eos", json!(true)),
            ("some_future_field", json!("x")),
        ];
        for (field, v) in changes {
            assert_ne!(key(&with(field, v)), k, "{field} must change the key");
        }
        // Seeded sampling: the temperature is part of the answer.
        let seeded = |t: f64| {
            let mut b = with("seed", json!(1));
            b["temperature"] = json!(t);
            key(&b)
        };
        assert_ne!(seeded(0.7), seeded(0.8));
        // Another endpoint, model or tenant is another key too.
        let other = |endpoint, model, ns| match lookup(&base(), endpoint, model, ns, None) {
            Lookup::Key { key, .. } => key,
            Lookup::Bypass => panic!(),
        };
        assert_ne!(other("completions", "m", ""), k);
        assert_ne!(other("chat", "big", ""), k);
        assert_ne!(other("chat", "m", "tenant-b"), k);
    }

    #[test]
    fn delivery_fields_and_equivalent_spellings_keep_the_key() {
        let k = key(&base());
        for (field, v) in [
            ("stream", json!(true)),
            ("stream_options", json!({ "include_usage": true })),
            ("user", json!("alice")),
            ("metadata", json!({ "trace": "1" })),
            ("model", json!("an alias of m")),
            ("n", json!(1)),
            ("top_p", json!(1.0)),
            ("logprobs", json!(false)),
            ("presence_penalty", json!(0)),
            ("seed", Value::Null),
        ] {
            assert_eq!(key(&with(field, v)), k, "{field} must not change the key");
        }
        assert_eq!(key(&with("temperature", json!(0.0))), k);
        let mut b = base();
        b.as_object_mut().unwrap().remove("max_tokens");
        b["max_completion_tokens"] = json!(16);
        assert_eq!(key(&b), k);
        assert_eq!(
            key(&with("stop", json!("\n"))),
            key(&with("stop", json!(["\n"])))
        );
        // Key order in the body does not matter.
        let reordered: Value = serde_json::from_str(
            r#"{"max_tokens":16,"temperature":0,"messages":[{"content":"What is 2 + 2?","role":"user"}],"model":"m"}"#,
        )
        .unwrap();
        assert_eq!(key(&reordered), k);
    }

    #[test]
    fn only_deterministic_requests_are_cached_and_cache_control_is_honoured() {
        let mut sampled = base();
        sampled["temperature"] = json!(0.7);
        assert_eq!(lookup(&sampled, "chat", "m", "", None), Lookup::Bypass);
        sampled.as_object_mut().unwrap().remove("temperature");
        assert_eq!(lookup(&sampled, "chat", "m", "", None), Lookup::Bypass);
        // A seed makes a sampled request repeatable.
        sampled["seed"] = json!(1);
        assert!(matches!(
            lookup(&sampled, "chat", "m", "", None),
            Lookup::Key { read: true, .. }
        ));
        let b = base();
        assert_eq!(
            lookup(&b, "chat", "m", "", Some("no-store")),
            Lookup::Bypass
        );
        assert!(matches!(
            lookup(&b, "chat", "m", "", Some("max-age=0, No-Cache")),
            Lookup::Key { read: false, .. }
        ));
        // Embeddings have no temperature: every one is the same for the same input, and
        // none is the semantic cache's (it compares questions, not inputs to embed).
        let embed = json!({ "model": "e", "input": ["a", "b"], "encoding_format": "float" });
        assert!(matches!(
            lookup(&embed, "embeddings", "e", "", None),
            Lookup::Key {
                read: true,
                probe: None,
                ..
            }
        ));
        assert_eq!(
            lookup(&embed, "embeddings", "e", "", Some("no-store")),
            Lookup::Bypass
        );
    }

    fn answer(text: &str) -> Answer {
        Answer {
            chunks: vec![Chunk {
                text: text.into(),
                logprobs: Vec::new(),
            }],
            finish_reason: FinishReason::Stop,
            usage: Usage {
                prompt_tokens: 3,
                completion_tokens: 1,
                total_tokens: 4,
                cached_tokens: 0,
            },
            cost: Money::from_nanos(1_000),
            judged: None,
        }
    }

    #[test]
    fn bounded_by_bytes_least_recently_used_first() {
        let cache = ExactCache::new(CacheConfig {
            max_bytes: 4_000,
            ttl: Duration::from_secs(60),
        });
        let k = |i: usize| -> Arc<str> { format!("key-{i}").into() };
        for i in 0..10 {
            cache.insert(k(i), Arc::new(answer(&"x".repeat(300))));
            // Key 0 stays in use, so it is never the least recently used (moka applies
            // reads in batches: `usage` makes it apply them now).
            cache.usage();
            assert!(cache.get(&k(0)).is_some(), "key 0 evicted at {i}");
            cache.usage();
        }
        let (entries, bytes) = cache.usage();
        assert!(bytes <= 4_000, "{bytes} bytes held");
        assert!(entries < 10, "{entries} entries: nothing evicted");
        assert!(cache.get(&k(0)).is_some());
        assert!(cache.get(&k(1)).is_none(), "the least recently used stays");
        assert!(cache.get(&k(9)).is_some());
    }

    #[tokio::test]
    async fn identical_requests_in_flight_wait_for_the_first_answer() {
        let cache = ExactCache::new(CacheConfig::default());
        let key: Arc<str> = "k".into();
        let Claim::Leader(leader) = cache.claim(&key) else {
            panic!("the first request leads")
        };
        let Claim::Follower(pending) = cache.claim(&key) else {
            panic!("the second follows")
        };
        let waiter = tokio::spawn(wait(pending));
        leader.fulfil(&cache, answer("4"));
        assert_eq!(waiter.await.unwrap().unwrap().text(), "4");
        assert_eq!(cache.get(&key).unwrap().text(), "4");
        // A leader that ends without an answer releases its followers, and the key.
        let other: Arc<str> = "other".into();
        let Claim::Leader(leader) = cache.claim(&other) else {
            panic!()
        };
        let Claim::Follower(pending) = cache.claim(&other) else {
            panic!()
        };
        drop(leader);
        assert!(wait(pending).await.is_none());
        assert!(matches!(cache.claim(&other), Claim::Leader(_)));
    }

    #[test]
    fn entries_expire() {
        let cache = ExactCache::new(CacheConfig {
            max_bytes: 1 << 20,
            ttl: Duration::from_millis(50),
        });
        let key: Arc<str> = "k".into();
        cache.insert(key.clone(), Arc::new(answer("4")));
        assert_eq!(cache.get(&key).unwrap().text(), "4");
        std::thread::sleep(Duration::from_millis(120));
        assert!(cache.get(&key).is_none());
    }

    fn probe(body: &Value) -> Option<Probe> {
        match lookup(body, "chat", "m", "t", None) {
            Lookup::Key { probe, .. } => probe,
            Lookup::Bypass => None,
        }
    }

    #[test]
    fn probe_takes_the_last_question_and_keeps_the_rest_exact() {
        let p = probe(&base()).unwrap();
        assert_eq!(p.text, "What is 2 + 2?");
        assert!(!p.space.contains("2 + 2"));
        // Another question, same everything else: same space.
        let mut other = base();
        other["messages"][0]["content"] = json!("How much is two plus two?");
        assert_eq!(probe(&other).unwrap().space, p.space);
        // Any other answer-changing field, or an earlier turn, is another space.
        assert_ne!(
            probe(&with("max_tokens", json!(17))).unwrap().space,
            p.space
        );
        let mut turns = base();
        turns["messages"] = json!([
            { "role": "system", "content": "Answer in French." },
            { "role": "user", "content": "What is 2 + 2?" },
        ]);
        assert_ne!(probe(&turns).unwrap().space, p.space);
        // Text parts are joined; a conversation that ends with the assistant has no probe.
        let mut parts = base();
        parts["messages"][0]["content"] = json!([{ "type": "text", "text": "What is 2 + 2?" }]);
        assert_eq!(probe(&parts).unwrap(), p);
        let mut ends = base();
        ends["messages"] = json!([{ "role": "assistant", "content": "Hi" }]);
        assert_eq!(probe(&ends), None);
        let prompt = json!({ "prompt": "Once upon a time", "temperature": 0 });
        match lookup(&prompt, "completions", "m", "", None) {
            Lookup::Key { probe, .. } => assert_eq!(probe.unwrap().text, "Once upon a time"),
            Lookup::Bypass => panic!("cacheable"),
        }
    }
}
