//! `frugal bench`: a load generator for any OpenAI-compatible endpoint.
//!
//! Two shapes of load: a fixed number of concurrent clients each sending requests back to
//! back, or a replay of a trace (arrival times, prompt and output lengths, e.g. the Azure
//! LLM inference traces) scaled to the model. Requests stream (`/v1/completions`,
//! `ignore_eos` so outputs have the trace's lengths), and each records time to first token,
//! time per output token and latency. The summary prices the run at the machine's hourly
//! rate: cost per 1,000 requests and per million tokens. A workload file replays given chat
//! prompts at given times instead; against frugal, the summary also sums the cost each
//! response reports (`x-frugal-cost-usd`) and counts cache answers and routes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Serialize;

use frugal_cost::Money;
use frugal_cost::money::HourlyRate;

pub mod replay;

/// One request of the load.
#[derive(Debug, Clone, PartialEq)]
pub struct Shot {
    /// Seconds after the start it is sent (trace replay); 0 for closed-loop clients.
    pub at: f64,
    pub prompt_words: usize,
    pub max_tokens: usize,
    /// A user message to send as a chat completion; `None`: a synthetic completion prompt.
    pub text: Option<Arc<str>>,
}

#[derive(Debug, Clone)]
pub enum Load {
    /// `clients` concurrent clients sharing `shots` in order.
    Closed { clients: usize, shots: Vec<Shot> },
    /// Each shot sent at its time, however many are in flight.
    Open { shots: Vec<Shot> },
}

#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Base URL ending in `/v1`.
    pub url: String,
    pub model: Option<String>,
    pub rate: HourlyRate,
    pub timeout: Duration,
    /// Make every prompt unique (the request's number appended), so no cache can answer.
    pub distinct: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub mean: f64,
}

impl Percentiles {
    fn of(mut v: Vec<f64>) -> Percentiles {
        if v.is_empty() {
            return Percentiles::default();
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Percentiles {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            mean: v.iter().sum::<f64>() / v.len() as f64,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub requests: usize,
    pub errors: usize,
    /// The first few error messages.
    pub error_samples: Vec<String>,
    pub wall_s: f64,
    pub prompt_tokens: u64,
    pub output_tokens: u64,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    /// Seconds.
    pub ttft: Percentiles,
    pub tpot: Percentiles,
    pub latency: Percentiles,
    pub cost: Money,
    pub cost_per_1k_requests: Option<Money>,
    pub cost_per_1m_tokens: Option<Money>,
    /// What the responses said they cost (`x-frugal-cost-usd`), where they said.
    pub metered_cost: Option<Money>,
    pub metered_per_1k_requests: Option<Money>,
    /// Requests by `x-frugal-cache` (hit-exact, hit-semantic, miss, bypass).
    pub cache: BTreeMap<String, u64>,
    /// Requests by `x-frugal-route` (the model chain that answered).
    pub routes: BTreeMap<String, u64>,
}

#[derive(Debug, Default)]
struct Outcome {
    ttft: Option<f64>,
    latency: f64,
    prompt_tokens: u64,
    output_tokens: u64,
    metered: Option<Money>,
    cache: Option<String>,
    route: Option<String>,
    error: Option<String>,
}

/// Counts finished requests for a progress bar.
#[derive(Debug, Default)]
pub struct Counter(pub AtomicU64);

/// A prompt of about `words` tokens: common words, each about one token.
pub fn prompt(words: usize, salt: usize) -> String {
    const WORDS: &[&str] = &[
        "the", "cost", "of", "compute", "is", "measured", "per", "unit", "and", "every", "model",
        "answer", "has", "a", "price", "that", "we", "can", "lower", "with", "care",
    ];
    (0..words.max(1))
        .map(|i| WORDS[(i * 7 + salt) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Shots from a trace CSV with `TIMESTAMP,ContextTokens,GeneratedTokens` (the Azure LLM
/// inference trace's columns): arrival times relative to the first row, divided by
/// `speedup`; prompt and output lengths scaled by `scale` and `output_scale` and capped; at
/// most `limit` rows.
#[allow(clippy::too_many_arguments)]
pub fn trace_shots(
    path: &Path,
    speedup: f64,
    scale: f64,
    output_scale: f64,
    max_prompt: usize,
    max_output: usize,
    limit: usize,
) -> Result<Vec<Shot>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut shots = Vec::new();
    let mut first = None;
    for (i, line) in text.lines().enumerate().skip(1).take(limit) {
        let bad = |what: &str| format!("{} line {}: {what}", path.display(), i + 1);
        let mut cols = line.split(',');
        let (Some(ts), Some(ctx), Some(generated)) = (cols.next(), cols.next(), cols.next()) else {
            return Err(bad("expected TIMESTAMP,ContextTokens,GeneratedTokens"));
        };
        let t = frugal_cost::import::parse_ts(ts).map_err(|e| bad(&e))? as f64 / 1000.0;
        let start = *first.get_or_insert(t);
        let num = |s: &str| {
            s.trim()
                .parse::<f64>()
                .map_err(|_| bad(&format!("`{s}` is not a number")))
        };
        shots.push(Shot {
            at: (t - start) / speedup.max(1e-9),
            prompt_words: ((num(ctx)? * scale).round() as usize).clamp(1, max_prompt),
            max_tokens: ((num(generated)? * output_scale).round() as usize).clamp(1, max_output),
            text: None,
        });
    }
    Ok(shots)
}

/// One line of a workload file.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkloadLine {
    /// Seconds after the start.
    at: f64,
    prompt: String,
    max_tokens: usize,
}

/// Shots from a workload file: JSON lines of `{"at": seconds, "prompt": text, "max_tokens": n}`,
/// times divided by `speedup`; at most `limit` lines.
pub fn workload_shots(path: &Path, speedup: f64, limit: usize) -> Result<Vec<Shot>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut shots = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        if shots.len() == limit {
            break;
        }
        let w: WorkloadLine = serde_json::from_str(line)
            .map_err(|e| format!("{} line {}: {e}", path.display(), i + 1))?;
        if !(w.at.is_finite() && w.at >= 0.0) {
            return Err(format!(
                "{} line {}: `at` must be seconds >= 0",
                path.display(),
                i + 1
            ));
        }
        shots.push(Shot {
            at: w.at / speedup.max(1e-9),
            prompt_words: w.prompt.split_whitespace().count(),
            max_tokens: w.max_tokens.max(1),
            text: Some(w.prompt.into()),
        });
    }
    Ok(shots)
}

/// Runs the load and summarizes it.
pub async fn run(config: &BenchConfig, load: Load, done: Arc<Counter>) -> Result<Summary, String> {
    let client = reqwest::Client::builder()
        .timeout(config.timeout)
        // A fresh connection per request: servers differ in how long they keep idle
        // connections, and reusing one the server has just closed fails the request.
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let config = Arc::new(config.clone());
    let started = Instant::now();
    let outcomes: Vec<Outcome> = match load {
        Load::Closed { clients, shots } => {
            let shots = Arc::new(shots);
            let n = shots.len();
            let (client, config, done) = (client.clone(), config.clone(), done.clone());
            closed_loop(clients, n, move |i| {
                let (client, config, shots, done) =
                    (client.clone(), config.clone(), shots.clone(), done.clone());
                async move {
                    let o = one(&client, &config, &shots[i], i).await;
                    done.0.fetch_add(1, Ordering::Relaxed);
                    o
                }
            })
            .await
            .map_err(|e| format!("a client task failed: {e}"))?
            .into_iter()
            .map(|(_, o)| o)
            .collect()
        }
        Load::Open { shots } => {
            let tasks: Vec<_> = shots
                .into_iter()
                .enumerate()
                .map(|(i, shot)| {
                    let (client, config, done) = (client.clone(), config.clone(), done.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep_until(tokio::time::Instant::from_std(
                            started + Duration::from_secs_f64(shot.at),
                        ))
                        .await;
                        let o = one(&client, &config, &shot, i).await;
                        done.0.fetch_add(1, Ordering::Relaxed);
                        o
                    })
                })
                .collect();
            let mut all = Vec::new();
            for t in tasks {
                all.push(t.await.map_err(|e| format!("a request task failed: {e}"))?);
            }
            all
        }
    };
    Ok(summarize(
        &outcomes,
        started.elapsed().as_secs_f64(),
        config.rate,
    ))
}

/// Reads a stream of server-sent events, handing each `data:` JSON event to `on` in order;
/// an event that carries `error`, or a broken stream, ends it with that error.
pub(crate) async fn each_event(
    response: reqwest::Response,
    mut on: impl FnMut(&serde_json::Value),
) -> Result<(), String> {
    let mut stream = response.bytes_stream();
    let mut buf = String::new();
    while let Some(piece) = stream.next().await {
        let piece = piece.map_err(|e| format!("stream broke: {e}"))?;
        buf.push_str(&String::from_utf8_lossy(&piece));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let Some(data) = event
                .lines()
                .find_map(|l| l.strip_prefix("data:"))
                .map(str::trim)
            else {
                continue;
            };
            if data == "[DONE]" {
                continue;
            }
            let Ok(v) = serde_json::from_str::<serde_json::Value>(data) else {
                continue;
            };
            if let Some(e) = v.get("error") {
                return Err(e.to_string());
            }
            on(&v);
        }
    }
    Ok(())
}

/// Runs `work(i)` for every index below `n` on `workers` tasks, each taking the next index
/// as soon as it is free (a closed loop, as clients that wait for each answer); the results
/// with their index.
pub(crate) async fn closed_loop<R, F, Fut>(
    workers: usize,
    n: usize,
    work: F,
) -> Result<Vec<(usize, R)>, tokio::task::JoinError>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = R> + Send + 'static,
    R: Send + 'static,
{
    let work = Arc::new(work);
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..workers.max(1))
        .map(|_| {
            let (work, next) = (work.clone(), next.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    out.push((i, work(i).await));
                }
                out
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    Ok(all)
}

fn summarize(outcomes: &[Outcome], wall_s: f64, rate: HourlyRate) -> Summary {
    let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.error.is_none()).collect();
    let prompt_tokens: u64 = ok.iter().map(|o| o.prompt_tokens).sum();
    let output_tokens: u64 = ok.iter().map(|o| o.output_tokens).sum();
    let tpot = ok
        .iter()
        .filter_map(|o| {
            let first = o.ttft?;
            (o.output_tokens > 1).then(|| (o.latency - first) / (o.output_tokens - 1) as f64)
        })
        .collect();
    let cost = rate
        .cost((wall_s * 1000.0) as i64, 1)
        .unwrap_or(Money::ZERO);
    let per = |n: u64, unit: i128| (n > 0).then(|| cost.mul_div(unit, i128::from(n))).flatten();
    let metered = ok
        .iter()
        .any(|o| o.metered.is_some())
        .then(|| ok.iter().filter_map(|o| o.metered).sum::<Money>());
    let count = |f: fn(&Outcome) -> Option<&String>| {
        let mut m = BTreeMap::new();
        for o in &ok {
            if let Some(k) = f(o) {
                *m.entry(k.clone()).or_insert(0) += 1;
            }
        }
        m
    };
    Summary {
        requests: outcomes.len(),
        errors: outcomes.len() - ok.len(),
        error_samples: outcomes
            .iter()
            .filter_map(|o| o.error.clone())
            .take(3)
            .collect(),
        wall_s,
        prompt_tokens,
        output_tokens,
        requests_per_s: ok.len() as f64 / wall_s.max(1e-9),
        output_tokens_per_s: output_tokens as f64 / wall_s.max(1e-9),
        ttft: Percentiles::of(ok.iter().filter_map(|o| o.ttft).collect()),
        tpot: Percentiles::of(tpot),
        latency: Percentiles::of(ok.iter().map(|o| o.latency).collect()),
        cost,
        cost_per_1k_requests: per(ok.len() as u64, 1000),
        cost_per_1m_tokens: per(prompt_tokens + output_tokens, 1_000_000),
        metered_cost: metered,
        metered_per_1k_requests: metered
            .filter(|_| !ok.is_empty())
            .and_then(|m| m.mul_div(1000, ok.len() as i128)),
        cache: count(|o| o.cache.as_ref()),
        routes: count(|o| o.route.as_ref()),
    }
}

/// One completion: a workload's prompt as a chat turn, not streamed (frugal says what an
/// answer cost in its headers, known before a JSON body but not before a stream); else a
/// synthetic prompt, streamed, whose output runs to `max_tokens`.
async fn one(client: &reqwest::Client, config: &BenchConfig, shot: &Shot, i: usize) -> Outcome {
    let started = Instant::now();
    let (path, mut body) = match &shot.text {
        Some(text) => (
            "chat/completions",
            serde_json::json!({ "messages": [{ "role": "user", "content": &**text }] }),
        ),
        None => {
            let mut text = prompt(shot.prompt_words, i);
            if config.distinct {
                text = format!("{text} {i}");
            }
            (
                "completions",
                serde_json::json!({ "prompt": text, "ignore_eos": true }),
            )
        }
    };
    let streamed = shot.text.is_none();
    body["max_tokens"] = shot.max_tokens.into();
    body["temperature"] = 0.into();
    body["stream"] = streamed.into();
    if streamed {
        body["stream_options"] = serde_json::json!({ "include_usage": true });
    }
    if let Some(m) = &config.model {
        body["model"] = serde_json::Value::String(m.clone());
    }
    let url = format!("{}/{path}", config.url.trim_end_matches('/'));
    let mut out = Outcome::default();
    let response = match client.post(&url).json(&body).send().await {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(format!("request failed: {e}"));
            return out;
        }
    };
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    out.metered = header("x-frugal-cost-usd").and_then(|v| v.parse().ok());
    out.cache = header("x-frugal-cache");
    out.route = header("x-frugal-route");
    if !response.status().is_success() {
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        out.error = Some(format!(
            "{status}: {}",
            text.chars().take(200).collect::<String>()
        ));
        return out;
    }
    if !streamed {
        match response.json::<serde_json::Value>().await {
            Ok(v) => {
                out.prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
                out.output_tokens = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
            }
            Err(e) => out.error = Some(format!("unreadable answer: {e}")),
        }
        out.latency = started.elapsed().as_secs_f64();
        return out;
    }
    let mut chunks = 0u64;
    let read = each_event(response, |v| {
        let text = v["choices"][0]["text"].as_str().unwrap_or("");
        if !text.is_empty() {
            chunks += 1;
            out.ttft
                .get_or_insert_with(|| started.elapsed().as_secs_f64());
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            out.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
            out.output_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
        }
    })
    .await;
    if let Err(e) = read {
        out.error = Some(e);
        return out;
    }
    if out.output_tokens == 0 {
        out.output_tokens = chunks;
    }
    out.latency = started.elapsed().as_secs_f64();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_hand() {
        let p = Percentiles::of((1..=100).map(f64::from).collect());
        assert_eq!((p.p50, p.p90, p.p99), (51.0, 90.0, 99.0));
        assert_eq!(p.mean, 50.5);
    }

    #[test]
    fn costs_come_from_wall_time() {
        let outcomes: Vec<Outcome> = (0..4)
            .map(|i| Outcome {
                ttft: Some(0.1),
                latency: 1.1,
                prompt_tokens: 100,
                output_tokens: 11,
                metered: Some("0.001".parse().unwrap()),
                cache: Some(if i == 0 { "miss" } else { "hit-exact" }.into()),
                ..Outcome::default()
            })
            .collect();
        // $3.60/h for 10 s is $0.01: per 1,000 of 4 requests $2.50; per 1M of 444 tokens.
        let s = summarize(&outcomes, 10.0, HourlyRate("3.6".parse().unwrap()));
        assert_eq!(s.cost, "0.01".parse().unwrap());
        assert_eq!(s.cost_per_1k_requests, Some("2.5".parse().unwrap()));
        assert_eq!(s.cost_per_1m_tokens, Some("22.522522523".parse().unwrap()));
        assert!((s.tpot.p50 - 0.1).abs() < 1e-9);
        // Metered: $0.001 a response is $1 per 1,000.
        assert_eq!(s.metered_cost, Some("0.004".parse().unwrap()));
        assert_eq!(s.metered_per_1k_requests, Some("1".parse().unwrap()));
        assert_eq!(s.cache["hit-exact"], 3);
        assert!(s.routes.is_empty());
    }

    #[test]
    fn workload_lines_become_chat_shots() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.jsonl");
        std::fs::write(
            &path,
            "{\"at\": 2.0, \"prompt\": \"What is the capital of France?\", \"max_tokens\": 16}\n\n",
        )
        .unwrap();
        let shots = workload_shots(&path, 2.0, 10).unwrap();
        assert_eq!(shots.len(), 1);
        assert_eq!(shots[0].at, 1.0);
        assert_eq!(
            shots[0].text.as_deref(),
            Some("What is the capital of France?")
        );
        std::fs::write(&path, "{\"at\": 1, \"prompt\": \"x\"}\n").unwrap();
        let err = workload_shots(&path, 1.0, 10).unwrap_err();
        assert!(
            err.contains("line 1") && err.contains("max_tokens"),
            "{err}"
        );
    }

    #[test]
    fn trace_rows_become_scaled_shots() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        std::fs::write(
            &path,
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,374,44\n2023-11-16 18:15:48.0,4000,2000\n",
        )
        .unwrap();
        let shots = trace_shots(&path, 2.0, 0.25, 0.25, 512, 128, 10).unwrap();
        assert_eq!(
            shots[0],
            Shot {
                at: 0.0,
                prompt_words: 94,
                max_tokens: 11,
                text: None,
            }
        );
        assert_eq!(
            shots[1],
            Shot {
                at: 1.0,
                prompt_words: 512,
                max_tokens: 128,
                text: None,
            }
        );
    }
}
