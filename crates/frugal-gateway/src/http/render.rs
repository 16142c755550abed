//! Rendering: answers as OpenAI's JSON bodies and SSE streams, with what they cost.
//!
//! Every response says what it cost: `x-frugal-cost-usd` on a whole body (and
//! `usage.cost_usd` in it), and on a stream, whose cost is known only at its end, a
//! `frugal` object (`cost_usd` exact as a decimal string, `cache`, `saved_usd`) on the last
//! chunk before `[DONE]`, plus `usage.cost_usd` on the usage chunk when the client asked for
//! usage. An upstream's stream is passed through event by event, its finish chunk held
//! until its usage has priced the call. Prompt tokens whose work was reused are in
//! `usage.prompt_tokens_details.cached_tokens`, and on a whole body in
//! `x-frugal-cached-tokens` too (a stream's are known at its end, in its usage chunk only).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;

use axum::Json;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{Value, json};

use frugal_cost::Money;
use frugal_engine::scheduler::FinishReason;

use crate::backend::text::Piece;
use crate::backend::upstream;
use crate::backend::{Backend, Output};
use crate::http::api::{TokenLogprob, Usage};
use crate::http::validate::{Job, Kind};
use crate::request::pipeline::Ask;
use crate::request::pipeline::{self, Body, Finished, Live, Started};
use crate::request::settle::{Bill, CacheNote, End};
use crate::request::shadow;
use crate::request::state::AppState;

/// One request through the pipeline on `backend`, streamed or whole.
pub(crate) async fn answer(
    state: &AppState,
    backend: Arc<dyn Backend>,
    job: Arc<Job>,
    ask: &Ask<'_>,
) -> Response {
    let mut started = match pipeline::start(state, backend.clone(), &job, ask).await {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    shadow::spawn(state, started.shadow.take());
    if job.common.stream {
        let usage = job
            .common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage);
        return stream(started, usage);
    }
    match pipeline::finish(started).await {
        Ok(f) => json(f, job.kind, backend.name()),
        Err(e) => e.into_response(),
    }
}

/// How one response's chunks are shaped.
#[derive(Clone)]
pub struct Shape {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Shape {
    fn choice(
        &self,
        text: &str,
        logprobs: Option<Value>,
        finish: Option<&str>,
        chunk: bool,
    ) -> Value {
        match (self.kind, chunk) {
            (Kind::Chat, false) => json!({
                "index": 0,
                "message": { "role": "assistant", "content": text },
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
            (Kind::Chat, true) => json!({
                "index": 0,
                "delta": if finish.is_some() && text.is_empty() { json!({}) } else { json!({ "role": "assistant", "content": text }) },
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
            (Kind::Text, _) => json!({
                "index": 0,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
        }
    }

    fn body(&self, choices: Vec<Value>, usage: Option<Usage>, chunk: bool) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.kind.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = json!(u);
        }
        v
    }

    fn logprobs(&self, entries: Vec<TokenLogprob>) -> Value {
        match self.kind {
            Kind::Chat => json!({ "content": entries }),
            Kind::Text => json!({
                "tokens": entries.iter().map(|e| e.token.clone()).collect::<Vec<_>>(),
                "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
                "top_logprobs": entries
                    .iter()
                    .map(|e| {
                        e.top_logprobs
                            .iter()
                            .map(|t| (t.token.clone(), json!(t.logprob)))
                            .collect::<serde_json::Map<_, _>>()
                    })
                    .collect::<Vec<_>>(),
            }),
        }
    }

    /// The finish chunk, and the usage chunk when asked for; the last carries the cost.
    fn ending(
        &self,
        reason: FinishReason,
        usage: Usage,
        include_usage: bool,
        cost: &Costed,
    ) -> Vec<SseEvent> {
        let mut finish = self.body(
            vec![self.choice("", None, Some(finish_name(reason)), true)],
            None,
            true,
        );
        let mut out = Vec::new();
        if include_usage {
            out.push(data(&finish));
            let mut last = self.body(Vec::new(), Some(usage), true);
            cost.stamp(&mut last);
            out.push(data(&last));
        } else {
            cost.stamp(&mut finish);
            out.push(data(&finish));
        }
        out.push(SseEvent::default().data("[DONE]"));
        out
    }
}

/// What a response says of its cost and how it met the caches.
pub struct Costed {
    pub cost: Option<Money>,
    pub cache: CacheNote,
    pub saved: Option<Money>,
}

impl Costed {
    /// Response headers: what the request cost, and how it met the cache.
    pub fn headers(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = self
            .cost
            .and_then(|c| HeaderValue::from_str(&c.to_string_places(9)).ok())
        {
            h.insert("x-frugal-cost-usd", v);
        }
        if let Some(v) = self
            .saved
            .and_then(|s| HeaderValue::from_str(&s.to_string_places(9)).ok())
        {
            h.insert("x-frugal-saved-usd", v);
        }
        h.insert("x-frugal-cache", HeaderValue::from_static(self.cache.label));
        if let Some(v) = self.cache.veto {
            h.insert("x-frugal-semantic-veto", HeaderValue::from_static(v.name()));
        }
        h
    }

    /// The cost on a body or the last chunk: `usage.cost_usd` where there is a usage
    /// object, and the `frugal` object.
    pub fn stamp(&self, v: &mut Value) {
        let cost = self.cost.unwrap_or(Money::ZERO);
        if let Some(u) = v.get_mut("usage").filter(|u| u.is_object()) {
            u["cost_usd"] = json!(cost.as_f64());
        }
        let mut f = json!({ "cost_usd": cost.to_string_places(9), "cache": self.cache.label });
        if let Some(s) = self.saved {
            f["saved_usd"] = json!(s.to_string_places(9));
        }
        v["frugal"] = f;
    }
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

pub fn finish_name(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

type Events = Pin<Box<dyn Stream<Item = Result<SseEvent, Infallible>> + Send>>;

fn sse_response(events: Events, headers: HeaderMap) -> Response {
    let mut r = Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response();
    r.headers_mut().extend(headers);
    r
}

/// A finished answer as one JSON body.
pub fn json(f: Finished, kind: Kind, model: &str) -> Response {
    let costed = Costed {
        cost: Some(f.cost),
        cache: f.cache,
        saved: f.saved,
    };
    let mut v = match f.body {
        Body::Raw(v) => v,
        Body::Text {
            text,
            logprobs,
            reason,
            usage,
        } => {
            let shape = Shape {
                kind,
                id: f.id,
                created: f.created,
                model: model.to_owned(),
            };
            let lp = logprobs.map(|e| shape.logprobs(e));
            let choice = shape.choice(&text, lp, Some(finish_name(reason)), false);
            shape.body(vec![choice], Some(usage), false)
        }
    };
    costed.stamp(&mut v);
    let mut r = Json(v).into_response();
    r.headers_mut().extend(costed.headers());
    // Streams carry it in their usage chunk only: it is known at their end, after the
    // headers went out.
    r.headers_mut()
        .insert("x-frugal-cached-tokens", HeaderValue::from(f.cached_tokens));
    r
}

/// An embeddings answer, with what it cost.
pub(crate) fn embedded(e: crate::request::embed::Answered) -> Response {
    let costed = Costed {
        cost: Some(e.cost),
        cache: e.cache,
        saved: e.saved,
    };
    let mut v = e.body;
    costed.stamp(&mut v);
    let mut r = Json(v).into_response();
    r.headers_mut().extend(costed.headers());
    r
}

/// A finished (and settled) answer replayed as a stream: a cascade's accepted first tier.
pub fn replay_stream(f: Finished, kind: Kind, model: &str, include_usage: bool) -> Response {
    let costed = Costed {
        cost: Some(f.cost),
        cache: f.cache,
        saved: f.saved,
    };
    let shape = Shape {
        kind,
        id: f.id,
        created: f.created,
        model: model.to_owned(),
    };
    let headers = Costed {
        cost: None,
        ..costed
    }
    .headers();
    let events = match f.body {
        Body::Text {
            text,
            reason,
            usage,
            ..
        } => {
            let mut events = vec![data(&shape.body(
                vec![shape.choice(&text, None, None, true)],
                None,
                true,
            ))];
            events.extend(shape.ending(reason, usage, include_usage, &costed));
            events
        }
        Body::Raw(_) => vec![
            data(
                &json!({ "error": { "message": "this answer cannot be streamed", "type": "server_error" } }),
            ),
            SseEvent::default().data("[DONE]"),
        ],
    };
    sse_response(Box::pin(stream::iter(events.into_iter().map(Ok))), headers)
}

/// A started answer as an SSE stream; the stream owns the bill, so a client that leaves
/// drops it and the request settles as cancelled.
pub fn stream(started: Started, include_usage: bool) -> Response {
    let Started {
        bill,
        output,
        id,
        kind,
        prompt_bytes,
        ..
    } = started;
    let headers = Costed {
        cost: None,
        cache: bill.cache.label(),
        saved: bill.cache.saved().map(|(m, _)| m),
    }
    .headers();
    let shape = Shape {
        kind,
        id,
        created: pipeline::created(&bill),
        model: bill.model().to_owned(),
    };
    let events: Events = match output {
        Output::Pieces(source) => Box::pin(pieces(Live { bill, source }, shape, include_usage)),
        Output::Events(events) => Box::pin(pass(
            Pass {
                bill,
                events,
                kind,
                content_chunks: 0,
                answer_bytes: 0,
                prompt_bytes,
                usage: None,
                reason: None,
                plain: true,
                held: None,
                done: false,
            },
            include_usage,
        )),
        Output::Json(v) => {
            // Asked to stream, the upstream answered whole: settled, then sent as one chunk.
            let mut bill = bill;
            let (usage, cached) = pipeline::usage_or_estimate(&v, kind, prompt_bytes);
            bill.count(usage, cached);
            let cost = bill.settle(End::Completed {
                reason: FinishReason::Stop,
                first_token: None,
                judged: None,
                cacheable: false,
            });
            let mut v = v;
            Costed {
                cost: Some(cost),
                cache: CacheNote::BYPASS,
                saved: None,
            }
            .stamp(&mut v);
            Box::pin(stream::iter(
                [data(&v), SseEvent::default().data("[DONE]")]
                    .into_iter()
                    .map(Ok),
            ))
        }
    };
    sse_response(events, headers)
}

fn pieces(
    live: Live,
    shape: Shape,
    include_usage: bool,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send {
    stream::unfold((live, false), move |(mut live, done)| {
        let shape = shape.clone();
        async move {
            if done {
                return None;
            }
            let events = match live.next().await {
                Piece::Text { text, logprobs } => {
                    let lp = (!logprobs.is_empty()).then(|| shape.logprobs(logprobs));
                    let chunk = shape.body(vec![shape.choice(&text, lp, None, true)], None, true);
                    return Some((vec![data(&chunk)], (live, false)));
                }
                Piece::Done {
                    reason,
                    usage,
                    first_token,
                    judged,
                    ..
                } => {
                    let costed = Costed {
                        cache: live.bill.cache.label(),
                        saved: live.bill.cache.saved().map(|(m, _)| m),
                        cost: Some(live.complete(reason, first_token, judged)),
                    };
                    shape.ending(reason, usage, include_usage, &costed)
                }
                Piece::Failed(e) => {
                    live.fail();
                    tracing::warn!(error = %e, "generation failed mid-stream");
                    vec![
                        data(&json!({ "error": { "message": e, "type": "server_error" } })),
                        SseEvent::default().data("[DONE]"),
                    ]
                }
            };
            Some((events, (live, true)))
        }
    })
    .flat_map(|events| stream::iter(events.into_iter().map(Ok)))
}

/// An upstream's stream on its way through.
struct Pass {
    bill: Bill,
    events: Pin<Box<dyn Stream<Item = Result<String, String>> + Send>>,
    kind: Kind,
    /// Chunks with content: the completion tokens of a stream cut short, as most servers
    /// stream a token a chunk.
    content_chunks: u64,
    /// Bytes the model wrote in every choice, for the same estimate.
    answer_bytes: u64,
    prompt_bytes: u64,
    usage: Option<(Usage, u64)>,
    reason: Option<FinishReason>,
    /// A one-choice answer of plain text (cacheable).
    plain: bool,
    /// The finish chunk, held until the usage prices the call.
    held: Option<Value>,
    done: bool,
}

impl Pass {
    /// The call's tokens: the upstream's usage, or estimates when it never came.
    fn count(&mut self) {
        match self.usage {
            Some((usage, cached)) => self.bill.count(usage, cached),
            None => {
                let usage = pipeline::estimated_usage(
                    self.prompt_bytes,
                    self.answer_bytes,
                    self.content_chunks,
                );
                self.bill.count(usage, 0);
            }
        }
    }

    fn costed(&mut self, end: End) -> Costed {
        self.count();
        Costed {
            cost: Some(self.bill.settle(end)),
            cache: self.bill.cache.label(),
            saved: None,
        }
    }

    fn settle_completed(&mut self) -> Costed {
        let cacheable = self.plain && self.reason.is_some();
        self.costed(End::Completed {
            reason: self.reason.unwrap_or(FinishReason::Stop),
            first_token: None,
            judged: None,
            cacheable,
        })
    }

    fn fail(&mut self, message: String) -> Vec<SseEvent> {
        self.done = true;
        self.costed(End::Failed);
        tracing::warn!(upstream = %self.bill.model(), error = %message, "stream failed");
        let body = json!({ "error": { "message": message, "type": "upstream_error" } });
        vec![data(&body), SseEvent::default().data("[DONE]")]
    }

    /// Reads one upstream payload: what to send on.
    fn take(&mut self, mut v: Value, include_usage: bool) -> Vec<SseEvent> {
        let usage = upstream::usage_of(&v);
        let choices = v["choices"].as_array().map_or(&[][..], Vec::as_slice);
        if choices.len() > 1 {
            self.plain = false;
        }
        self.answer_bytes += choices
            .iter()
            .map(|c| match self.kind {
                Kind::Chat => pipeline::answer_bytes(&c["delta"]),
                Kind::Text => c["text"].as_str().map_or(0, str::len) as u64,
            })
            .sum::<u64>();
        let mut finish = false;
        if let Some(c) = choices.first() {
            let text = match self.kind {
                Kind::Chat => &c["delta"]["content"],
                Kind::Text => &c["text"],
            };
            if let Some(t) = text.as_str() {
                self.content_chunks += u64::from(!t.is_empty());
                let t = t.to_owned();
                self.bill.record(&t, &[]);
            }
            if c["delta"].get("tool_calls").is_some_and(|t| !t.is_null()) {
                self.plain = false;
            }
            match c["finish_reason"].as_str() {
                Some("stop") => self.reason = Some(FinishReason::Stop),
                Some("length") => self.reason = Some(FinishReason::Length),
                Some(_) => self.plain = false,
                None => {}
            }
            finish = c["finish_reason"].is_string();
        }
        let has_choices = !choices.is_empty();
        if usage.is_none() {
            if finish {
                self.held = Some(v);
                return Vec::new();
            }
            return if has_choices {
                vec![data(&v)]
            } else {
                Vec::new()
            };
        }
        // The usage has come: the call is priced.
        self.usage = usage;
        let costed = self.settle_completed();
        let mut out = Vec::new();
        if let Some(mut held) = self.held.take() {
            if !include_usage {
                costed.stamp(&mut held);
            }
            out.push(data(&held));
        }
        if include_usage || has_choices {
            if !include_usage && has_choices {
                v.as_object_mut().map(|o| o.remove("usage"));
            }
            costed.stamp(&mut v);
            out.push(data(&v));
        }
        out
    }

    /// `[DONE]`: settles if the usage never came, and sends what was held.
    fn end(&mut self) -> Vec<SseEvent> {
        self.done = true;
        let mut out = Vec::new();
        if self.bill.cost().is_none() {
            let costed = self.settle_completed();
            let mut last = self
                .held
                .take()
                .unwrap_or_else(|| json!({ "object": self.kind.object(true), "choices": [] }));
            costed.stamp(&mut last);
            out.push(data(&last));
        } else if let Some(held) = self.held.take() {
            out.push(data(&held));
        }
        out.push(SseEvent::default().data("[DONE]"));
        out
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        // A client gone mid-stream: the tokens seen so far go on the bill, which settles as
        // cancelled when it drops next.
        if self.bill.cost().is_none() {
            self.count();
        }
    }
}

fn pass(p: Pass, include_usage: bool) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send {
    stream::unfold(p, move |mut p| async move {
        if p.done {
            return None;
        }
        loop {
            let events = match p.events.next().await {
                Some(Ok(data)) if data == "[DONE]" => p.end(),
                Some(Ok(data)) => match serde_json::from_str::<Value>(&data) {
                    Ok(v) => {
                        let events = p.take(v, include_usage);
                        if events.is_empty() {
                            continue;
                        }
                        events
                    }
                    Err(e) => p.fail(format!(
                        "upstream `{}` sent malformed JSON in its stream: {e}",
                        p.bill.model()
                    )),
                },
                Some(Err(e)) => p.fail(format!("upstream `{}`: {e}", p.bill.model())),
                None => return None,
            };
            return Some((events, p));
        }
    })
    .flat_map(|events| stream::iter(events.into_iter().map(Ok)))
}
