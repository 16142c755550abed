//! Upstream backends: any OpenAI-compatible server (vLLM, TGI, llama.cpp, hosted APIs)
//! behind the gateway, priced per token (hosted APIs) or by the hour of the machine that
//! serves it (self-hosted servers).
//!
//! One pooled reqwest client per upstream. A request is retried, with exponential backoff
//! (or the upstream's Retry-After, capped), on connection errors, 429 and 5xx, as long as
//! nothing has been sent to the client yet; other 4xx are the client's to see, passed
//! through as they came. Streams are passed through chunk by chunk, with usage asked for
//! (`stream_options.include_usage`) so every call is metered.

use frugal_cost::causes::with_causes;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use frugal_cost::Money;
use frugal_cost::catalog::ModelPrice;
use frugal_cost::money::HourlyRate;
use futures_util::{Stream, StreamExt};
use serde_json::{Value, json};

use crate::http::api::Usage;
use crate::http::error::ApiError;
use crate::meter::Machine;

/// Longest wait between tries by default, whatever Retry-After says.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Largest answer body read from an upstream by default; past it the call is a 502.
const MAX_BODY: usize = 32 << 20;
/// Largest single SSE event by default; past it the stream is broken off.
const MAX_EVENT: usize = 4 << 20;
/// What a model answers at most when its `[[serve.upstream]]` says no `max_output_tokens`:
/// the only place a request's worst case is a guess (many hosted models stop at 4,096 or
/// 8,192 tokens, some go to 100,000: set it for those).
pub const ASSUMED_MAX_OUTPUT_TOKENS: u64 = 4096;

#[derive(Clone)]
pub struct UpstreamConfig {
    /// The name clients ask for.
    pub name: String,
    /// Base URL, e.g. `https://api.openai.com/v1`.
    pub url: String,
    /// The upstream's own name for the model.
    pub model: String,
    pub api_key: Option<String>,
    /// Unpriced calls are recorded at $0.
    pub pricing: Option<Pricing>,
    /// Whole-request limit (for streams: until the first byte of the body).
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// Tries after the first.
    pub retries: u32,
    /// First backoff; doubled each try.
    pub backoff: Duration,
    /// Longest wait between tries, whatever the upstream's Retry-After asks.
    pub max_backoff: Duration,
    /// Largest answer body (and SSE event) read from the upstream.
    pub max_body: usize,
    /// The most tokens the model answers with, for the worst case of a request that names
    /// no `max_tokens` (hosted APIs then allow the model's whole output window).
    pub max_output_tokens: u64,
}

/// Written out by hand: the API key must never reach a log through `{:?}`.
impl std::fmt::Debug for UpstreamConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamConfig")
            .field("name", &self.name)
            .field("url", &crate::redis_conn::redact_url(&self.url))
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .field("pricing", &self.pricing)
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .finish_non_exhaustive()
    }
}

impl UpstreamConfig {
    pub fn new(name: &str, url: &str) -> UpstreamConfig {
        UpstreamConfig {
            name: name.to_owned(),
            url: url.trim_end_matches('/').to_owned(),
            model: name.to_owned(),
            api_key: None,
            pricing: None,
            timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(5),
            retries: 2,
            backoff: Duration::from_millis(200),
            max_backoff: MAX_BACKOFF,
            max_body: MAX_BODY,
            max_output_tokens: ASSUMED_MAX_OUTPUT_TOKENS,
        }
    }
}

/// A `Retry-After` value: seconds (a decimal, as some servers send) or an HTTP date,
/// clamped to `[0, max]`. Garbage (`-1`, `inf`, `NaN`, `1e300`, a date in the past) never
/// panics: a negative or past wait is no wait, anything too long or not finite is `max`.
pub fn retry_after(
    value: &str,
    max: Duration,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<f64>() {
        if secs.is_nan() {
            return Some(max);
        }
        let secs = secs.clamp(0.0, max.as_secs_f64());
        return Some(Duration::try_from_secs_f64(secs).map_or(max, |d| d.min(max)));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let wait = (at.with_timezone(&chrono::Utc) - now)
        .to_std()
        .unwrap_or(Duration::ZERO);
    Some(wait.min(max))
}

/// How an upstream's calls are priced.
#[derive(Debug, Clone)]
pub enum Pricing {
    /// Per token, at the price files' `[[model]]` prices (hosted APIs).
    Tokens(ModelPrice),
    /// By the hour of the machine serving it (a self-hosted server, frugal's alone): each
    /// call pays for the time it was in flight, split evenly with the calls in flight beside
    /// it, and the time none was in flight is the meter's idle capacity.
    Hourly {
        rate: HourlyRate,
        instance_type: Option<String>,
    },
}

pub struct Upstream {
    pub config: UpstreamConfig,
    client: reqwest::Client,
    /// Only an upstream priced by the hour keeps time: a per-token one's calls take no lock.
    clock: Option<Arc<Mutex<Clock>>>,
}

/// Processor-sharing time of one upstream: `share` grows by dt / n while n calls are in
/// flight, so a call's share of the machine is the growth between its start and its end,
/// and the shares of all calls add up to the time any was in flight.
#[derive(Debug)]
pub(crate) struct Clock {
    pub(crate) in_flight: u32,
    last: Instant,
    /// The time calls have held the machine, in all.
    pub(crate) share: Duration,
}

impl Clock {
    pub(crate) fn shared() -> Arc<Mutex<Clock>> {
        Arc::new(Mutex::new(Clock {
            in_flight: 0,
            last: Instant::now(),
            share: Duration::ZERO,
        }))
    }

    /// The shares so far, counted to `now`.
    pub(crate) fn share_at(&mut self, now: Instant) -> Duration {
        self.advance(now);
        self.share
    }

    fn advance(&mut self, now: Instant) {
        if self.in_flight > 0 {
            self.share += now.saturating_duration_since(self.last) / self.in_flight;
        }
        self.last = now;
    }

    /// A call starts: the mark its share is counted from.
    fn begin(&mut self, now: Instant) -> Duration {
        self.advance(now);
        self.in_flight += 1;
        self.share
    }

    /// The call that started at `mark` ends: its share.
    fn end(&mut self, mark: Duration, now: Instant) -> Duration {
        self.advance(now);
        self.in_flight = self.in_flight.saturating_sub(1);
        self.share.saturating_sub(mark)
    }
}

/// One call's hold on its upstream, from before its first byte is sent until its answer has
/// ended; dropped unfinished (a client gone mid-stream), it lets go unbilled.
pub struct Ticket {
    /// Taken when the hold ends; none on an upstream that keeps no time.
    clock: Option<Arc<Mutex<Clock>>>,
    start: Duration,
    /// Told when the hold ends (a pool's held requests wait for a free replica).
    released: Option<Arc<tokio::sync::Notify>>,
}

impl Ticket {
    /// A hold on `clock`'s machine from now; `released` is told when it ends.
    pub(crate) fn take(
        clock: &Arc<Mutex<Clock>>,
        released: Option<Arc<tokio::sync::Notify>>,
    ) -> Ticket {
        let start = clock
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .begin(Instant::now());
        Ticket {
            clock: Some(clock.clone()),
            start,
            released,
        }
    }

    /// Lets go of the upstream: the call's share of its time (zero where none is kept).
    pub fn finish(mut self) -> Duration {
        self.close()
    }

    fn close(&mut self) -> Duration {
        let share = self.clock.take().map_or(Duration::ZERO, |clock| {
            let mut c = clock.lock().unwrap_or_else(|p| p.into_inner());
            c.end(self.start, Instant::now())
        });
        if let Some(n) = self.released.take() {
            n.notify_waiters();
        }
        share
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.close();
    }
}

/// What an upstream answered.
pub enum Reply {
    /// A whole JSON body (a non-streaming request).
    Json(Value),
    /// The SSE body, as it arrives.
    Stream(reqwest::Response),
}

impl Upstream {
    pub fn new(config: UpstreamConfig) -> Result<Upstream, ApiError> {
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .map_err(|e| ApiError::Internal(format!("cannot build an HTTP client: {e}")))?;
        let clock = matches!(config.pricing, Some(Pricing::Hourly { .. })).then(Clock::shared);
        Ok(Upstream {
            config,
            client,
            clock,
        })
    }

    /// The largest single SSE event read from this upstream.
    pub fn max_event(&self) -> usize {
        self.config.max_body.min(MAX_EVENT)
    }

    /// Takes a place among the calls in flight; the ticket's `finish` says what share of
    /// the upstream's time the call had.
    pub fn occupy(&self) -> Ticket {
        match &self.clock {
            Some(c) => Ticket::take(c, None),
            None => Ticket {
                clock: None,
                start: Duration::ZERO,
                released: None,
            },
        }
    }

    /// The machine the meter records idle time for, for an upstream priced by the hour.
    pub fn machine(&self) -> Option<Machine> {
        match &self.config.pricing {
            Some(Pricing::Hourly {
                rate,
                instance_type,
            }) => Some(Machine {
                model: self.config.name.clone(),
                rate: *rate,
                instance_type: instance_type.clone(),
                on_demand: None,
            }),
            _ => None,
        }
    }

    /// Cost of a call: its tokens at the upstream's prices, or its `share` of the machine's
    /// time at its hourly price.
    pub fn cost(&self, usage: &Usage, cached: u64, share: Duration) -> Option<Money> {
        match self.config.pricing.as_ref()? {
            // Saturating: usage past the range (an upstream's absurd count) is the most
            // there is, not $0.
            Pricing::Tokens(price) => Some(price.saturating_cost(
                usage.prompt_tokens as u64,
                cached,
                usage.completion_tokens as u64,
            )),
            Pricing::Hourly { rate, .. } => Some(
                rate.0
                    .saturating_mul_div(share.as_micros() as i128, 3_600_000_000),
            ),
        }
    }

    /// What the same tokens cost at per-token prices, if it has them (a cascade's saving is
    /// priced so; an hourly machine's price of a call depends on the load beside it).
    pub fn token_cost(&self, usage: &Usage) -> Option<Money> {
        match self.config.pricing {
            Some(Pricing::Tokens(_)) => self.cost(usage, 0, Duration::ZERO),
            _ => None,
        }
    }

    /// Sends `body` (the client's, with the upstream's model name) to `endpoint`
    /// (`chat/completions` or `completions`), retrying what may be retried.
    pub async fn send(
        &self,
        endpoint: &str,
        mut body: Value,
        stream: bool,
    ) -> Result<Reply, ApiError> {
        if self.config.model.is_empty() {
            // A pool replica serves one model under its own name for it.
            if let Some(o) = body.as_object_mut() {
                o.remove("model");
            }
        } else {
            body["model"] = json!(self.config.model);
        }
        if stream {
            body["stream"] = json!(true);
            body["stream_options"] = json!({ "include_usage": true });
        } else if let Some(o) = body.as_object_mut() {
            o.remove("stream");
            o.remove("stream_options");
        }
        let url = format!("{}/{endpoint}", self.config.url);
        let name = &self.config.name;
        let mut tries = 0;
        loop {
            let mut req = self
                .client
                .post(&url)
                .timeout(self.config.timeout)
                .json(&body);
            if let Some(key) = &self.config.api_key {
                req = req.bearer_auth(key);
            }
            let wait = self.config.backoff * 2u32.saturating_pow(tries);
            let (retry_after, error) = match req.send().await {
                Ok(resp) if resp.status().is_success() => {
                    if stream {
                        return Ok(Reply::Stream(resp));
                    }
                    let bytes = read_capped(resp, self.config.max_body, name).await?;
                    return serde_json::from_slice(&bytes)
                        .map(Reply::Json)
                        .map_err(|e| ApiError::Upstream {
                            status: 502,
                            message: format!("upstream `{name}` returned malformed JSON: {e}"),
                        });
                }
                Ok(resp) => {
                    let status = resp.status();
                    let retry_after = resp
                        .headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| retry_after(v, self.config.max_backoff, chrono::Utc::now()));
                    // An error body is read only as far as a message needs.
                    let text = read_capped(resp, 64 << 10, name)
                        .await
                        .map(|b| String::from_utf8_lossy(&b).into_owned())
                        .unwrap_or_default();
                    let message = upstream_message(&text);
                    if !(status.as_u16() == 429 || status.is_server_error()) {
                        // The client's mistake, as the upstream said it.
                        return Err(ApiError::Upstream {
                            status: status.as_u16(),
                            message: format!("upstream `{name}`: {message}"),
                        });
                    }
                    let code = if status.as_u16() == 429 { 429 } else { 502 };
                    (
                        retry_after,
                        ApiError::Upstream {
                            status: code,
                            message: format!(
                                "upstream `{name}` answered {status} after {} tries: {message}",
                                tries + 1
                            ),
                        },
                    )
                }
                Err(e) if e.is_timeout() => (
                    None,
                    ApiError::Upstream {
                        status: 504,
                        message: format!(
                            "upstream `{name}` timed out after {:.0?} ({} tries)",
                            self.config.timeout,
                            tries + 1
                        ),
                    },
                ),
                Err(e) => (None, lost(name, &e)),
            };
            if tries >= self.config.retries {
                return Err(error);
            }
            tries += 1;
            let pause = retry_after.unwrap_or(wait).min(self.config.max_backoff);
            tracing::warn!(upstream = %name, try_ = tries, ?pause, error = %error, "retrying");
            tokio::time::sleep(pause).await;
        }
    }
}

/// The body, refused past `max` bytes (a 502 that says so) instead of held in memory.
async fn read_capped(
    mut resp: reqwest::Response,
    max: usize,
    name: &str,
) -> Result<Vec<u8>, ApiError> {
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(too_large(name, max));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| lost(name, &e))? {
        if body.len() + chunk.len() > max {
            return Err(too_large(name, max));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn too_large(name: &str, max: usize) -> ApiError {
    ApiError::Upstream {
        status: 502,
        message: format!("upstream `{name}` sent an answer larger than {max} bytes"),
    }
}

fn lost(name: &str, e: &reqwest::Error) -> ApiError {
    ApiError::Upstream {
        status: 502,
        message: format!("upstream `{name}` is unreachable: {}", with_causes(e)),
    }
}

/// OpenAI's `error.message`, or the body itself (cut short).
fn upstream_message(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| body.chars().take(300).collect())
}

/// The usage object of an OpenAI response or final stream chunk.
pub fn usage_of(v: &Value) -> Option<(Usage, u64)> {
    let u = v.get("usage").filter(|u| u.is_object())?;
    let n = |k: &str| u[k].as_u64().unwrap_or(0) as usize;
    let cached = u["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    Some((
        Usage {
            prompt_tokens: n("prompt_tokens"),
            completion_tokens: n("completion_tokens"),
            total_tokens: n("total_tokens"),
            cached_tokens: cached as usize,
        },
        cached,
    ))
}

/// The `data:` payloads of an SSE body, one per event, as they arrive; an error once the
/// connection drops before `[DONE]`, or an event outgrows `max_event` bytes.
pub fn sse_events(
    resp: reqwest::Response,
    max_event: usize,
) -> impl Stream<Item = Result<String, String>> {
    let body = resp
        .bytes_stream()
        .map(|chunk| chunk.map_err(|e| format!("the upstream stream broke: {}", with_causes(&e))));
    sse_frames(body, max_event)
}

/// The events of an SSE body that arrives in `body`'s chunks, cut wherever the network cut
/// it; see `sse_events`.
pub(crate) fn sse_frames<B: AsRef<[u8]>>(
    body: impl Stream<Item = Result<B, String>> + Unpin,
    max_event: usize,
) -> impl Stream<Item = Result<String, String>> {
    futures_util::stream::unfold(
        (body, Vec::<u8>::new(), 0, false),
        move |(mut body, mut buf, mut scanned, ended)| async move {
            if ended {
                return None;
            }
            let too_large = || {
                Err(format!(
                    "the upstream sent an event larger than {max_event} bytes"
                ))
            };
            loop {
                // A complete event ends with a blank line.
                if let Some(at) = find_event_end(&buf, scanned) {
                    // Judged whole, so that the same stream passes or fails however the
                    // network cut it.
                    if at.0 > max_event {
                        return Some((too_large(), (body, buf, 0, true)));
                    }
                    let event: Vec<u8> = buf.drain(..at.0 + at.1).collect();
                    scanned = 0;
                    let text = String::from_utf8_lossy(&event[..at.0]).into_owned();
                    let data: Vec<&str> = text
                        .lines()
                        // One space after the colon is the separator (as the SSE spec says);
                        // any other leading blank is the payload's.
                        .filter_map(|l| {
                            l.strip_prefix("data:")
                                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                        })
                        .collect();
                    if data.is_empty() {
                        continue;
                    }
                    return Some((Ok(data.join("\n")), (body, buf, 0, false)));
                }
                // Up to 3 bytes of an unfinished event may be the start of its blank line:
                // past the limit by more, the event is too large whatever follows.
                if buf.len() > max_event.saturating_add(MAX_SEPARATOR - 1) {
                    return Some((too_large(), (body, buf, 0, true)));
                }
                // Searched already, but for a blank line the next chunk completes: each chunk
                // is scanned once, not the whole event again (quadratic in small chunks).
                scanned = buf.len().saturating_sub(MAX_SEPARATOR - 1);
                match body.next().await {
                    Some(Ok(chunk)) => buf.extend_from_slice(chunk.as_ref()),
                    Some(Err(e)) => return Some((Err(e), (body, buf, 0, true))),
                    None => {
                        return Some((
                            Err("the upstream closed the stream before [DONE]".into()),
                            (body, buf, 0, true),
                        ));
                    }
                }
            }
        },
    )
}

/// The longest blank line that ends an event (`\r\n\r\n`).
const MAX_SEPARATOR: usize = 4;

/// Where the first event in `buf` ends, looking from `from` on: (its length, the
/// separator's length).
fn find_event_end(buf: &[u8], from: usize) -> Option<(usize, usize)> {
    let rest = buf.get(from..)?;
    let lf = rest
        .windows(2)
        .position(|w| w == b"\n\n")
        .map(|i| (from + i, 2));
    let crlf = rest
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (from + i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_retry_after_is_a_bounded_wait() {
        let max = Duration::from_secs(10);
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-05T10:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let wait = |v: &str| retry_after(v, max, now);
        assert_eq!(wait("2"), Some(Duration::from_secs(2)));
        assert_eq!(wait("0.5"), Some(Duration::from_millis(500)));
        assert_eq!(wait("-1"), Some(Duration::ZERO));
        for huge in [
            "inf",
            "+inf",
            "1e300",
            "99999999999999999999",
            "NaN",
            "-nan",
        ] {
            assert_eq!(wait(huge), Some(max), "{huge}");
        }
        assert_eq!(wait("-inf"), Some(Duration::ZERO));
        assert_eq!(
            wait("Sat, 05 Dec 2026 10:00:03 GMT"),
            Some(Duration::from_secs(3))
        );
        assert_eq!(wait("Sat, 05 Dec 2026 09:00:00 GMT"), Some(Duration::ZERO));
        assert_eq!(wait("Sun, 06 Dec 2026 10:00:00 GMT"), Some(max));
        assert_eq!(wait("soon"), None);
        assert_eq!(wait(""), None);
    }

    #[test]
    fn the_config_never_prints_its_key() {
        let mut c = UpstreamConfig::new("gpt", "https://user:pw@api.example.com/v1");
        c.api_key = Some("sk-secret-123".into());
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("sk-secret-123") && !shown.contains("pw@"),
            "{shown}"
        );
        assert!(shown.contains("api.example.com"), "{shown}");
    }

    #[test]
    fn calls_in_flight_together_split_the_time_and_the_shares_add_up() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut c = Clock {
            in_flight: 0,
            last: t0,
            share: Duration::ZERO,
        };
        // Idle for 100 ms, then A alone for 100 ms, A and B together for 200 ms, B alone
        // for 100 ms.
        let a = c.begin(at(100));
        let b = c.begin(at(200));
        let a = c.end(a, at(400));
        let b = c.end(b, at(500));
        assert_eq!(a, Duration::from_millis(200));
        assert_eq!(b, Duration::from_millis(200));
        // Together, exactly the 400 ms some call was in flight; the first 100 ms are idle.
        assert_eq!(a + b, Duration::from_millis(400));
        assert_eq!(c.in_flight, 0);
    }

    #[test]
    fn an_hourly_upstream_prices_the_share_and_a_dropped_ticket_lets_go() {
        let mut config = UpstreamConfig::new("self-hosted", "http://127.0.0.1:9/v1");
        config.pricing = Some(Pricing::Hourly {
            rate: HourlyRate(Money::from_cents(360_000)),
            instance_type: None,
        });
        let up = Upstream::new(config).unwrap();
        let usage = Usage::default();
        // $3,600 an hour is $1 a second, $0.25 for a quarter of one.
        assert_eq!(
            up.cost(&usage, 0, Duration::from_millis(250)),
            Some(Money::from_cents(25))
        );
        assert_eq!(up.token_cost(&usage), None, "no per-token price to save");
        let dropped = up.occupy();
        let clock = up.clock.as_ref().unwrap();
        assert_eq!(clock.lock().unwrap().in_flight, 1);
        drop(dropped);
        assert_eq!(clock.lock().unwrap().in_flight, 0);
    }
}
