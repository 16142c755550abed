//! From engine tokens to response text: UTF-8-safe incremental decoding, stop sequences
//! (text that could still become a stop sequence is held back until it cannot), and
//! per-token logprobs. And [`Source`]: where a rendered answer's pieces come from, the
//! engine or a cached answer.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use frugal_engine::scheduler::{EngineTime, Event, FinishReason};
use frugal_engine::tokenizer::{StreamDecoder, Tokenizer};

use crate::cache::exact::Answer;
use crate::http::api::{TokenLogprob, TopLogprob, Usage};

/// Engine events, for the text layer.
pub(crate) type Events = tokio::sync::mpsc::UnboundedReceiver<Event>;

pub enum Piece {
    Text {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    Done {
        reason: FinishReason,
        usage: Usage,
        engine: EngineTime,
        /// This request's share of engine time until its first token: its prefill.
        prefill: Duration,
        first_token: Option<Duration>,
        /// Each generated token's logprob, which a cascade judges; `None` where unknown.
        judged: Option<Vec<f32>>,
    },
    Failed(String),
}

pub struct TextStream {
    /// `None` once a stop sequence matched: dropping the receiver cancels the sequence.
    rx: Option<Events>,
    tokenizer: Arc<Tokenizer>,
    decoder: StreamDecoder,
    stops: Vec<String>,
    /// Decoded text not yet sent: it might be the start of a stop sequence.
    held: String,
    logprobs: bool,
    prompt_tokens: usize,
    /// Of the prompt, tokens the engine's prefix cache held (known at the end).
    cached_tokens: usize,
    completion_tokens: usize,
    started: std::time::Instant,
    first_token: Option<Duration>,
    /// Engine time used so far, as the last token reported it.
    engine: EngineTime,
    /// Engine time as the first token reported it.
    prefill: Duration,
    /// The logprob of each token generated so far (one float each: the cascade's evidence).
    chosen: Vec<f32>,
    finished: Option<Piece>,
}

impl TextStream {
    pub fn new(
        rx: Events,
        tokenizer: Arc<Tokenizer>,
        stops: Vec<String>,
        logprobs: bool,
        prompt_tokens: usize,
    ) -> TextStream {
        TextStream {
            rx: Some(rx),
            tokenizer,
            decoder: StreamDecoder::new(),
            stops,
            held: String::new(),
            logprobs,
            prompt_tokens,
            cached_tokens: 0,
            completion_tokens: 0,
            started: std::time::Instant::now(),
            first_token: None,
            engine: EngineTime::default(),
            prefill: Duration::ZERO,
            chosen: Vec::new(),
            finished: None,
        }
    }

    /// Tokens and engine time used so far: what a request left part-way is billed for.
    pub fn progress(&self) -> (Usage, EngineTime) {
        (self.usage(), self.engine)
    }

    pub fn wants_logprobs(&self) -> bool {
        self.logprobs
    }

    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            total_tokens: self.prompt_tokens + self.completion_tokens,
            cached_tokens: self.cached_tokens,
        }
    }

    /// The next piece; after `Done` or `Failed` it keeps returning the same end.
    pub async fn next(&mut self) -> Piece {
        loop {
            if let Some(end) = self.finished.take() {
                return end;
            }
            let Some(rx) = self.rx.as_mut() else {
                return Piece::Failed("the generation has ended".into());
            };
            let event = rx.recv().await;
            match event {
                Some(Event::Admitted { cached_tokens }) => self.cached_tokens = cached_tokens,
                Some(Event::Token(sampled, engine)) => {
                    self.completion_tokens += 1;
                    if self.first_token.is_none() {
                        self.prefill = engine.shared;
                    }
                    self.engine = engine;
                    self.chosen.push(sampled.logprob);
                    self.first_token
                        .get_or_insert_with(|| self.started.elapsed());
                    let logprobs = if self.logprobs {
                        vec![self.logprob(&sampled)]
                    } else {
                        Vec::new()
                    };
                    let new = self
                        .decoder
                        .push(&self.tokenizer, sampled.token)
                        .unwrap_or_default();
                    self.held.push_str(&new);
                    if let Some(at) = self
                        .stops
                        .iter()
                        .filter_map(|s| self.held.find(s.as_str()))
                        .min()
                    {
                        self.held.truncate(at);
                        let text = std::mem::take(&mut self.held);
                        self.rx = None;
                        self.finished = Some(Piece::Done {
                            reason: FinishReason::Stop,
                            usage: self.usage(),
                            engine: self.engine,
                            prefill: self.prefill,
                            first_token: self.first_token,
                            judged: Some(std::mem::take(&mut self.chosen)),
                        });
                        return Piece::Text { text, logprobs };
                    }
                    let keep = self.holdback();
                    let text: String = self.held.drain(..self.held.len() - keep).collect();
                    if text.is_empty() && logprobs.is_empty() {
                        continue;
                    }
                    return Piece::Text { text, logprobs };
                }
                Some(Event::Done {
                    reason,
                    completion_tokens,
                    engine,
                    first_token,
                    ..
                }) => {
                    self.completion_tokens = completion_tokens;
                    let text = std::mem::take(&mut self.held);
                    self.rx = None;
                    self.engine = engine;
                    self.finished = Some(Piece::Done {
                        reason,
                        usage: self.usage(),
                        engine,
                        prefill: self.prefill,
                        first_token: Some(first_token),
                        judged: Some(std::mem::take(&mut self.chosen)),
                    });
                    if !text.is_empty() {
                        return Piece::Text {
                            text,
                            logprobs: Vec::new(),
                        };
                    }
                }
                Some(Event::Failed(e)) => {
                    self.rx = None;
                    return Piece::Failed(e);
                }
                None => {
                    self.rx = None;
                    return Piece::Failed("the engine stopped".into());
                }
            }
        }
    }

    /// Bytes at the end of `held` that are a proper prefix of some stop sequence.
    fn holdback(&self) -> usize {
        let mut keep = 0;
        for stop in &self.stops {
            for (i, _) in stop.char_indices().skip(1) {
                if self.held.ends_with(&stop[..i]) {
                    keep = keep.max(i);
                }
            }
        }
        keep
    }

    fn logprob(&self, s: &frugal_engine::sampling::Sampled) -> TokenLogprob {
        let text = |id: u32| self.tokenizer.decode(&[id]).unwrap_or_default();
        let token = text(s.token);
        TokenLogprob {
            bytes: token.as_bytes().to_vec(),
            token,
            logprob: s.logprob,
            top_logprobs: s
                .top
                .iter()
                .map(|&(id, logprob)| {
                    let token = text(id);
                    TopLogprob {
                        bytes: token.as_bytes().to_vec(),
                        token,
                        logprob,
                    }
                })
                .collect(),
        }
    }
}

/// Where a response's pieces come from: the engine, or a cached answer.
pub enum Source {
    Live(Box<TextStream>),
    Replay(Replay),
}

impl Source {
    pub async fn next(&mut self) -> Piece {
        match self {
            Source::Live(t) => t.next().await,
            Source::Replay(r) => r.next(),
        }
    }

    pub fn wants_logprobs(&self) -> bool {
        match self {
            Source::Live(t) => t.wants_logprobs(),
            Source::Replay(r) => r.logprobs,
        }
    }
}

/// A cached answer's pieces in their first chunking, then its end; free of engine time.
pub struct Replay {
    pieces: VecDeque<Piece>,
    logprobs: bool,
}

impl Replay {
    pub fn new(answer: &Answer, logprobs: bool) -> Replay {
        let mut pieces: VecDeque<Piece> = answer
            .chunks
            .iter()
            .map(|c| Piece::Text {
                text: c.text.clone(),
                logprobs: if logprobs {
                    c.logprobs.clone()
                } else {
                    Vec::new()
                },
            })
            .collect();
        pieces.push_back(Piece::Done {
            reason: answer.finish_reason,
            usage: answer.usage,
            engine: EngineTime::default(),
            prefill: Duration::ZERO,
            first_token: None,
            judged: answer.judged.clone(),
        });
        Replay { pieces, logprobs }
    }

    fn next(&mut self) -> Piece {
        self.pieces
            .pop_front()
            .unwrap_or_else(|| Piece::Failed("the cached answer has ended".into()))
    }
}
