//! Multi-turn conversation replay: each conversation's user messages are sent in order, each
//! turn's prompt holding every earlier turn with the server's own answers appended, several
//! conversations in flight at once (or each starting at a trace's arrival time). It measures
//! what a prefix cache changes: first- and later-turn time to first token, and the prompt
//! tokens the server computed against those it took from its cache, as the server reports
//! them (`usage.prompt_tokens_details.cached_tokens`, OpenAI's field; llama-server's
//! `timings.prompt_n` and `cache_n`).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use frugal_cost::Money;

use super::{BenchConfig, Counter, Percentiles, closed_loop, each_event};

/// One conversation: its user messages, in order (the data's own answers are not sent: the
/// server's are).
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub id: String,
    pub turns: Vec<String>,
}

/// Conversations from a JSON-lines file, at most `limit` with at least one user message.
/// A line is a ShareGPT conversation, `{"id": .., "conversations": [{"from": "human" | "gpt"
/// | .., "value": text}]}` (user turns are `human` or `user`), or `{"prompt": text}` (a
/// workload line, one turn).
pub fn conversations(path: &Path, limit: usize) -> Result<Vec<Conversation>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if out.len() == limit {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let bad = |what: String| format!("{} line {}: {what}", path.display(), i + 1);
        let v: Value = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        let turns: Vec<String> = if let Some(prompt) = v["prompt"].as_str() {
            vec![prompt.to_owned()]
        } else if let Some(messages) = v["conversations"].as_array() {
            messages
                .iter()
                .filter(|m| matches!(m["from"].as_str(), Some("human" | "user")))
                .filter_map(|m| m["value"].as_str())
                .filter(|t| !t.trim().is_empty())
                .map(str::to_owned)
                .collect()
        } else {
            return Err(bad(
                "expected {\"conversations\": [{\"from\", \"value\"}]} or {\"prompt\"}".into(),
            ));
        };
        if turns.is_empty() {
            continue;
        }
        let id = match &v["id"] {
            Value::String(s) => s.clone(),
            Value::Null => format!("line-{}", i + 1),
            other => other.to_string(),
        };
        out.push(Conversation { id, turns });
    }
    Ok(out)
}

/// How the conversations are sent.
#[derive(Debug, Clone)]
pub struct ReplayConfig {
    pub bench: BenchConfig,
    /// A system message ahead of every conversation (a shared instruction block).
    pub system: Option<String>,
    /// Turns sent per conversation at most.
    pub max_turns: usize,
    /// Prompt length a turn may reach, in tokens (estimated at 4 characters a token): each
    /// user message is cut to its share, and a conversation ends before a turn past it.
    pub max_prompt: usize,
    /// Tokens asked for per answer.
    pub max_tokens: usize,
    /// Conversations in flight at once, each starting when one ends.
    pub in_flight: usize,
    /// Seconds after the start each conversation starts instead (a trace's arrivals).
    pub arrivals: Option<Vec<f64>>,
}

/// One turn as sent and answered.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Turn {
    pub ttft_s: Option<f64>,
    pub latency_s: f64,
    pub prompt_tokens: u64,
    /// Prompt tokens the server says came from its cache; `None`: it said nothing.
    pub cached_tokens: Option<u64>,
    /// Prompt tokens the server computed (llama-server's `timings.prompt_n`, else prompt
    /// less cached).
    pub prefill_tokens: u64,
    pub output_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A conversation as replayed: every message sent, the last answer included, and its turns.
#[derive(Debug, Clone, Serialize)]
pub struct Transcript {
    pub id: String,
    pub messages: Vec<Value>,
    pub turns: Vec<Turn>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReplaySummary {
    pub conversations: usize,
    /// Turns sent (requests), errors among them.
    pub requests: usize,
    pub errors: usize,
    pub error_samples: Vec<String>,
    pub wall_s: f64,
    /// Seconds to the first token of each conversation's first turn, and of its later turns.
    pub first_turn_ttft: Percentiles,
    pub later_turn_ttft: Percentiles,
    pub later_turns: usize,
    pub prompt_tokens: u64,
    /// Prompt tokens the server reported cached, and whether it reported any figure at all.
    pub cached_tokens: u64,
    pub cache_reported: bool,
    /// Prompt tokens computed: prompt less cached.
    pub prefill_tokens: u64,
    pub output_tokens: u64,
    /// Output tokens per second of each stream after its first token.
    pub decode_tok_s: Percentiles,
    pub output_tokens_per_s: f64,
    pub cost: Money,
    pub cost_per_1k_requests: Option<Money>,
}

/// Replays the conversations; each transcript in the order given.
pub async fn run(
    config: &ReplayConfig,
    conversations: Vec<Conversation>,
    done: Arc<Counter>,
) -> Result<(ReplaySummary, Vec<Transcript>), String> {
    let client = reqwest::Client::builder()
        .timeout(config.bench.timeout)
        // As the one-shot load: a fresh connection per request.
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let config = Arc::new(config.clone());
    let conversations = Arc::new(conversations);
    let started = Instant::now();
    let mut transcripts: Vec<Option<Transcript>> = vec![None; conversations.len()];
    let answered: Vec<(usize, Transcript)> = match &config.arrivals {
        Some(arrivals) => {
            let tasks: Vec<_> = (0..conversations.len())
                .map(|i| {
                    let at = arrivals.get(i).copied().unwrap_or(0.0);
                    let (client, config, conversations, done) = (
                        client.clone(),
                        config.clone(),
                        conversations.clone(),
                        done.clone(),
                    );
                    tokio::spawn(async move {
                        tokio::time::sleep_until(tokio::time::Instant::from_std(
                            started + Duration::from_secs_f64(at),
                        ))
                        .await;
                        let c = &conversations[i];
                        (i, converse(&client, &config, c, i, &done).await)
                    })
                })
                .collect();
            let mut all = Vec::new();
            for t in tasks {
                all.push(t.await.map_err(|e| format!("a conversation failed: {e}"))?);
            }
            all
        }
        None => {
            let (n, workers) = (conversations.len(), config.in_flight);
            let (client, config, conversations, done) = (
                client.clone(),
                config.clone(),
                conversations.clone(),
                done.clone(),
            );
            closed_loop(workers, n, move |i| {
                let (client, config, conversations, done) = (
                    client.clone(),
                    config.clone(),
                    conversations.clone(),
                    done.clone(),
                );
                async move { converse(&client, &config, &conversations[i], i, &done).await }
            })
            .await
            .map_err(|e| format!("a conversation failed: {e}"))?
        }
    };
    for (i, transcript) in answered {
        transcripts[i] = Some(transcript);
    }
    let transcripts: Vec<Transcript> = transcripts.into_iter().flatten().collect();
    let summary = summarize(&transcripts, started.elapsed().as_secs_f64(), &config);
    Ok((summary, transcripts))
}

/// A message cut to at most `chars` characters, at a character boundary.
fn cut(text: &str, chars: usize) -> &str {
    text.char_indices()
        .nth(chars)
        .map_or(text, |(at, _)| &text[..at])
}

/// One conversation, turn after turn, until its turns or the prompt budget run out or a turn
/// fails.
async fn converse(
    client: &reqwest::Client,
    config: &ReplayConfig,
    c: &Conversation,
    i: usize,
    done: &Counter,
) -> Transcript {
    let mut messages = Vec::new();
    let mut chars = 0;
    if let Some(system) = &config.system {
        messages.push(json!({ "role": "system", "content": system }));
        chars += system.chars().count();
    }
    let turns = c.turns.len().min(config.max_turns.max(1));
    let share = (config.max_prompt * 4).saturating_sub(chars) / turns;
    let mut out = Transcript {
        id: c.id.clone(),
        messages: Vec::new(),
        turns: Vec::new(),
    };
    // Characters a token, from the server's own count once a turn has told it (code and
    // other languages run well under 4).
    let mut per_token = 4.0;
    for (t, user) in c.turns.iter().take(turns).enumerate() {
        let mut user = cut(user, share.max(16)).to_owned();
        if t == 0 && config.bench.distinct {
            user = format!("{user} ({i})");
        }
        chars += user.chars().count();
        if t > 0 && chars as f64 / per_token > config.max_prompt as f64 {
            break;
        }
        messages.push(json!({ "role": "user", "content": user }));
        let (turn, answer) = one_turn(client, config, &messages).await;
        done.0.fetch_add(1, Ordering::Relaxed);
        if turn.prompt_tokens > 0 {
            per_token = (chars as f64 / turn.prompt_tokens as f64).min(4.0);
        }
        let failed = turn.error.is_some();
        out.turns.push(turn);
        if failed {
            break;
        }
        chars += answer.chars().count();
        messages.push(json!({ "role": "assistant", "content": answer }));
    }
    out.messages = messages;
    out
}

/// One streamed chat turn: its figures and the answer's text.
async fn one_turn(
    client: &reqwest::Client,
    config: &ReplayConfig,
    messages: &[Value],
) -> (Turn, String) {
    let started = Instant::now();
    let mut body = json!({
        "messages": messages,
        "max_tokens": config.max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    if let Some(m) = &config.bench.model {
        body["model"] = Value::String(m.clone());
    }
    let url = format!(
        "{}/chat/completions",
        config.bench.url.trim_end_matches('/')
    );
    let mut turn = Turn::default();
    let mut answer = String::new();
    let response = match client.post(&url).json(&body).send().await {
        Ok(r) => r,
        Err(e) => {
            turn.error = Some(format!("request failed: {e}"));
            return (turn, answer);
        }
    };
    if !response.status().is_success() {
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        turn.error = Some(format!(
            "{status}: {}",
            text.chars().take(200).collect::<String>()
        ));
        return (turn, answer);
    }
    let header_cached = response
        .headers()
        .get("x-frugal-cached-tokens")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let (mut chunks, mut computed) = (0u64, None);
    let read = each_event(response, |v| {
        let text = v["choices"][0]["delta"]["content"].as_str().unwrap_or("");
        if !text.is_empty() {
            chunks += 1;
            answer.push_str(text);
            turn.ttft_s
                .get_or_insert_with(|| started.elapsed().as_secs_f64());
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            turn.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
            turn.output_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
            if let Some(n) = u["prompt_tokens_details"]["cached_tokens"].as_u64() {
                turn.cached_tokens = Some(n);
            }
        }
        // llama-server's own account: prompt tokens computed and taken from its cache.
        let timings = &v["timings"];
        if let Some(n) = timings["prompt_n"].as_u64() {
            computed = Some(n);
            if let Some(cached) = timings["cache_n"].as_u64() {
                turn.cached_tokens = Some(cached);
            }
        }
    })
    .await;
    if let Err(e) = read {
        turn.error = Some(e);
        return (turn, answer);
    }
    turn.cached_tokens = turn.cached_tokens.or(header_cached);
    if turn.output_tokens == 0 {
        turn.output_tokens = chunks;
    }
    if let (0, Some(n)) = (turn.prompt_tokens, computed) {
        turn.prompt_tokens = n + turn.cached_tokens.unwrap_or(0);
    }
    turn.prefill_tokens = computed
        .unwrap_or(turn.prompt_tokens - turn.cached_tokens.unwrap_or(0).min(turn.prompt_tokens));
    turn.latency_s = started.elapsed().as_secs_f64();
    (turn, answer)
}

fn summarize(transcripts: &[Transcript], wall_s: f64, config: &ReplayConfig) -> ReplaySummary {
    let all: Vec<(usize, &Turn)> = transcripts
        .iter()
        .flat_map(|t| t.turns.iter().enumerate())
        .collect();
    let ok: Vec<(usize, &Turn)> = all
        .iter()
        .copied()
        .filter(|(_, t)| t.error.is_none())
        .collect();
    let ttft = |later: bool| {
        Percentiles::of(
            ok.iter()
                .filter(|(i, _)| (*i > 0) == later)
                .filter_map(|(_, t)| t.ttft_s)
                .collect(),
        )
    };
    let sum = |f: fn(&Turn) -> u64| ok.iter().map(|(_, t)| f(t)).sum::<u64>();
    let output_tokens = sum(|t| t.output_tokens);
    let cost = config
        .bench
        .rate
        .cost((wall_s * 1000.0) as i64, 1)
        .unwrap_or(Money::ZERO);
    ReplaySummary {
        conversations: transcripts.len(),
        requests: all.len(),
        errors: all.len() - ok.len(),
        error_samples: all
            .iter()
            .filter_map(|(_, t)| t.error.clone())
            .take(3)
            .collect(),
        wall_s,
        first_turn_ttft: ttft(false),
        later_turn_ttft: ttft(true),
        later_turns: ok.iter().filter(|(i, _)| *i > 0).count(),
        prompt_tokens: sum(|t| t.prompt_tokens),
        cached_tokens: sum(|t| t.cached_tokens.unwrap_or(0)),
        cache_reported: ok.iter().any(|(_, t)| t.cached_tokens.is_some()),
        prefill_tokens: sum(|t| t.prefill_tokens),
        output_tokens,
        decode_tok_s: Percentiles::of(
            ok.iter()
                .filter_map(|(_, t)| {
                    let first = t.ttft_s?;
                    (t.output_tokens > 1 && t.latency_s > first)
                        .then(|| (t.output_tokens - 1) as f64 / (t.latency_s - first))
                })
                .collect(),
        ),
        output_tokens_per_s: output_tokens as f64 / wall_s.max(1e-9),
        cost,
        cost_per_1k_requests: (!ok.is_empty())
            .then(|| cost.mul_div(1000, ok.len() as i128))
            .flatten(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharegpt_lines_keep_the_user_turns_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        std::fs::write(
            &path,
            concat!(
                r#"{"id": "a", "conversations": [{"from": "human", "value": "one"}, {"from": "gpt", "value": "x"}, {"from": "human", "value": "two"}]}"#,
                "\n\n",
                r#"{"id": "b", "conversations": [{"from": "gpt", "value": "only an answer"}]}"#,
                "\n",
                r#"{"prompt": "a question"}"#,
                "\n",
            ),
        )
        .unwrap();
        let c = conversations(&path, 10).unwrap();
        assert_eq!(
            c,
            vec![
                Conversation {
                    id: "a".into(),
                    turns: vec!["one".into(), "two".into()]
                },
                Conversation {
                    id: "line-4".into(),
                    turns: vec!["a question".into()]
                },
            ]
        );
        assert_eq!(conversations(&path, 1).unwrap().len(), 1);
        std::fs::write(&path, "{\"text\": \"x\"}\n").unwrap();
        let err = conversations(&path, 10).unwrap_err();
        assert!(err.contains("line 1"), "{err}");
    }

    /// A server that streams llama-server's shape: no `prompt_tokens_details`, its own
    /// `timings` (prompt tokens computed, `cache_n` reused) in the last chunk. It answers
    /// "answer N" to a prompt of N messages and records each request's messages.
    async fn llama_like() -> (String, Arc<std::sync::Mutex<Vec<Value>>>) {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(move |body: axum::Json<Value>| {
                let messages = body.0["messages"].clone();
                let n = messages.as_array().map_or(0, Vec::len);
                log.lock().unwrap().push(messages);
                // Everything before the last message is cached.
                let (prompt, cached) = (10 * n as u64, 10 * (n as u64 - 1));
                let chunks = [
                    json!({ "choices": [{ "delta": { "role": "assistant" } }] }),
                    json!({ "choices": [{ "delta": { "content": "answer " } }] }),
                    json!({ "choices": [{ "delta": { "content": n.to_string() } }] }),
                    json!({ "choices": [{ "delta": {}, "finish_reason": "length" }],
                            "usage": { "prompt_tokens": prompt, "completion_tokens": 2 },
                            "timings": { "prompt_n": prompt - cached, "cache_n": cached } }),
                ];
                let sse: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
                async move { sse + "data: [DONE]\n\n" }
            }),
        );
        (frugal_testkit::loopback::serve(app).await, seen)
    }

    #[tokio::test]
    async fn turns_carry_the_answers_and_the_servers_own_cache_figures() {
        let (url, seen) = llama_like().await;
        let config = ReplayConfig {
            bench: BenchConfig {
                url: format!("{url}/v1"),
                model: None,
                rate: frugal_cost::money::HourlyRate(Money::ZERO),
                timeout: Duration::from_secs(10),
                distinct: false,
            },
            system: Some("be brief".into()),
            max_turns: 2,
            max_prompt: 1000,
            max_tokens: 2,
            in_flight: 2,
            arrivals: None,
        };
        let c = Conversation {
            id: "a".into(),
            turns: vec!["one".into(), "two".into(), "three".into()],
        };
        let (s, t) = run(&config, vec![c], Arc::new(Counter::default()))
            .await
            .unwrap();
        let sent = seen.lock().unwrap().clone();
        // Turn 2 is the system message, turn 1, the server's answer to it, then turn 2.
        assert_eq!(
            sent[1],
            json!([
                { "role": "system", "content": "be brief" },
                { "role": "user", "content": "one" },
                { "role": "assistant", "content": "answer 2" },
                { "role": "user", "content": "two" },
            ])
        );
        assert_eq!(sent.len(), 2, "--turns caps the conversation");
        assert_eq!(t[0].messages.len(), 5, "the last answer is kept too");
        // 20 + 40 prompt tokens; 10 + 30 of them cached, as `cache_n` said.
        assert_eq!(
            (s.prompt_tokens, s.cached_tokens, s.prefill_tokens),
            (60, 40, 20)
        );
        assert!(s.cache_reported);
        assert_eq!((s.requests, s.later_turns, s.output_tokens), (2, 1, 4));
    }

    #[test]
    fn messages_are_cut_at_a_character() {
        assert_eq!(cut("héllo", 2), "hé");
        assert_eq!(cut("hi", 5), "hi");
    }
}
