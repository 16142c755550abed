//! Continuous (in-flight) batching: one engine thread owns the model and every running
//! sequence, and runs the loop `admit -> next_batch -> forward -> sample -> filter`.
//!
//! A waiting request joins the running batch at the next step when there is room; prefill
//! is cut into chunks under a per-step token budget so it never stalls the decoding
//! streams for long; a sequence whose client has gone (its receiver dropped) is removed
//! before the next step. Memory is bounded up front: a request is admitted only when its
//! worst case (prompt + max_tokens positions of KV cache) fits the budget, and the queue
//! behind it is bounded, so overload is an immediate "overloaded" error, never an OOM.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc as events;

use crate::model::{Chunk, KvCache, Model, ModelError};
use crate::sampling::{Sampled, Sampler, SamplingParams};

/// When waiting requests may join the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Batching {
    /// At every step, as soon as there is room.
    #[default]
    Continuous,
    /// Classic static batching, kept to measure the difference: a batch is admitted only
    /// when the previous one is gone, and each request keeps its slot, still computed (as
    /// padding, its tokens thrown away), until the batch's longest request has finished.
    /// Clients still get their answers as soon as they are complete.
    Static,
    /// Static admission, but a finished request leaves the batch at once: the batch drains
    /// and runs smaller, the kindest baseline for continuous batching.
    Drain,
}

/// Limits of the scheduler.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    pub batching: Batching,
    /// Sequences decoded together at most.
    pub max_batch: usize,
    /// Tokens in one forward step (decode tokens plus prefill chunks).
    pub step_tokens: usize,
    /// KV-cache positions reserved by running sequences at most.
    pub kv_positions: usize,
    /// Requests waiting for admission at most; beyond, `submit` says overloaded.
    pub max_queue: usize,
}

impl Default for SchedulerConfig {
    fn default() -> SchedulerConfig {
        SchedulerConfig {
            batching: Batching::Continuous,
            max_batch: 16,
            step_tokens: 256,
            kv_positions: 64 * 1024,
            max_queue: 256,
        }
    }
}

/// One generation request.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Tokens that end the generation (end of turn, end of text).
    pub stop_tokens: Vec<u32>,
    /// Generate exactly `max_tokens`, through stop tokens (load tests need set lengths).
    pub ignore_eos: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token.
    Stop,
    /// max_tokens, or the context's end.
    Length,
}

/// Engine time a request has used: its share of the steps it was in, and what its part of
/// those steps would have taken with the engine to itself. The difference is what
/// batching saved it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineTime {
    pub shared: Duration,
    pub alone: Duration,
}

impl EngineTime {
    /// Time batching saved: decode steps alone, less their shares.
    pub fn saved(&self) -> Duration {
        self.alone.saturating_sub(self.shared)
    }
}

/// What a request receives, in order: tokens, then `Done` or `Failed`.
#[derive(Debug, Clone)]
pub enum Event {
    /// A token, with the engine time this request has used so far.
    Token(Sampled, EngineTime),
    Done {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
        /// Time in the queue, time to first token, and engine time this request used.
        queued: Duration,
        first_token: Duration,
        engine: EngineTime,
    },
    Failed(String),
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the engine is overloaded ({0} requests waiting); retry shortly")]
    Overloaded(usize),
    #[error("prompt of {prompt} tokens plus max_tokens {max} exceeds the context of {ctx} tokens")]
    TooLong {
        prompt: usize,
        max: usize,
        ctx: usize,
    },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the engine has stopped")]
    Stopped,
}

/// Gauges and counters the server exports.
#[derive(Debug, Default)]
pub struct Stats {
    pub waiting: AtomicUsize,
    pub running: AtomicUsize,
    pub last_batch: AtomicUsize,
    pub steps: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Tokens computed for answered requests as static batching's padding: waste.
    pub padding_tokens: AtomicU64,
    pub kv_reserved: AtomicUsize,
}

struct Job {
    request: Request,
    events: events::UnboundedSender<Event>,
    arrived: Instant,
}

/// A cheap, cloneable handle to the engine thread.
#[derive(Clone)]
pub struct Engine {
    tx: mpsc::SyncSender<Job>,
    stats: Arc<Stats>,
    config: SchedulerConfig,
    ctx_len: usize,
}

impl Engine {
    /// Starts the engine thread that owns `model`.
    pub fn start(model: Model, config: SchedulerConfig) -> Result<Engine, ModelError> {
        let (tx, rx) = mpsc::sync_channel(config.max_queue);
        let stats = Arc::new(Stats::default());
        let ctx_len = model.config.ctx_len.min(config.kv_positions);
        let worker = Worker {
            model,
            config,
            rx,
            waiting: VecDeque::new(),
            running: Vec::new(),
            stats: stats.clone(),
            reserved: 0,
            solo_decode: None,
        };
        std::thread::Builder::new()
            .name("frugal-scheduler".into())
            .spawn(move || worker.run())
            .map_err(|e| ModelError::Threads(e.to_string()))?;
        Ok(Engine {
            tx,
            stats,
            config,
            ctx_len,
        })
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn context_len(&self) -> usize {
        self.ctx_len
    }

    /// Queues a request; its events arrive on the returned receiver. Dropping the receiver
    /// cancels the request.
    pub fn submit(
        &self,
        request: Request,
    ) -> Result<events::UnboundedReceiver<Event>, SubmitError> {
        if request.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        if request.prompt.len() + request.max_tokens > self.ctx_len {
            return Err(SubmitError::TooLong {
                prompt: request.prompt.len(),
                max: request.max_tokens,
                ctx: self.ctx_len,
            });
        }
        let waiting = self.stats.waiting.load(Ordering::Relaxed);
        if waiting >= self.config.max_queue {
            return Err(SubmitError::Overloaded(waiting));
        }
        let (events, rx) = events::unbounded_channel();
        let job = Job {
            request,
            events,
            arrived: Instant::now(),
        };
        // Counted before the send: the engine thread may take the job and count it out
        // before this thread would get to count it in.
        self.stats.waiting.fetch_add(1, Ordering::Relaxed);
        self.tx.try_send(job).map_err(|e| {
            self.stats.waiting.fetch_sub(1, Ordering::Relaxed);
            match e {
                mpsc::TrySendError::Full(_) => SubmitError::Overloaded(self.config.max_queue),
                mpsc::TrySendError::Disconnected(_) => SubmitError::Stopped,
            }
        })?;
        Ok(rx)
    }
}

struct Sequence {
    job: Job,
    cache: KvCache,
    sampler: Sampler,
    /// Prompt tokens already in the cache.
    prefilled: usize,
    /// The last sampled token, fed at the next step.
    next: Option<u32>,
    generated: usize,
    first_token: Option<Duration>,
    admitted: Instant,
    engine: EngineTime,
    /// KV positions reserved for it.
    reserved: usize,
    /// Answered, and kept computing as static batching's padding.
    padding: bool,
}

struct Worker {
    model: Model,
    config: SchedulerConfig,
    rx: mpsc::Receiver<Job>,
    waiting: VecDeque<Job>,
    running: Vec<Sequence>,
    stats: Arc<Stats>,
    /// KV positions reserved by running sequences.
    reserved: usize,
    /// A decode step with one sequence: a moving average of the steps that had one, first
    /// measured on a throwaway sequence when the batch first holds more than one.
    solo_decode: Option<Duration>,
}

/// Weight of the newest solo decode step in the moving average.
const SOLO_WEIGHT: f64 = 0.1;

impl Worker {
    fn run(mut self) {
        loop {
            if !self.receive() {
                return;
            }
            self.admit();
            self.filter_gone();
            if self.running.is_empty() {
                continue;
            }
            self.step();
        }
    }

    /// Takes new jobs; blocks while there is nothing to do. False when every handle is gone.
    fn receive(&mut self) -> bool {
        if self.running.is_empty() && self.waiting.is_empty() {
            match self.rx.recv() {
                Ok(job) => self.waiting.push_back(job),
                Err(_) => return false,
            }
        }
        while let Ok(job) = self.rx.try_recv() {
            self.waiting.push_back(job);
        }
        true
    }

    /// Moves waiting jobs into the batch while their worst case fits.
    fn admit(&mut self) {
        if self.config.batching != Batching::Continuous && !self.running.is_empty() {
            return;
        }
        // A padded static batch runs every slot as long as its longest request.
        let longest = match self.config.batching {
            Batching::Static => self
                .waiting
                .iter()
                .take(self.config.max_batch)
                .map(|j| j.request.max_tokens)
                .max(),
            _ => None,
        };
        while self.running.len() < self.config.max_batch {
            let Some(job) = self.waiting.front() else {
                break;
            };
            if job.events.is_closed() {
                self.waiting.pop_front();
                self.stats.waiting.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            let need = job.request.prompt.len() + longest.unwrap_or(job.request.max_tokens);
            if self.reserved + need > self.config.kv_positions && !self.running.is_empty() {
                break;
            }
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            self.stats.waiting.fetch_sub(1, Ordering::Relaxed);
            self.reserved += need;
            self.running.push(Sequence {
                cache: KvCache::with_capacity(&self.model.config, need),
                sampler: Sampler::new(job.request.sampling),
                prefilled: 0,
                next: None,
                generated: 0,
                first_token: None,
                admitted: Instant::now(),
                engine: EngineTime::default(),
                reserved: need,
                padding: false,
                job,
            });
        }
        self.publish();
    }

    /// Drops sequences whose client has gone, before any work is spent on them.
    fn filter_gone(&mut self) {
        let mut freed = 0;
        self.running.retain(|s| {
            let gone = s.job.events.is_closed() && !s.padding;
            if gone {
                freed += s.reserved;
            }
            !gone
        });
        self.reserved -= freed;
        self.publish();
    }

    fn publish(&self) {
        self.stats
            .running
            .store(self.running.len(), Ordering::Relaxed);
        self.stats
            .kv_reserved
            .store(self.reserved, Ordering::Relaxed);
    }

    /// One forward step: every decoding sequence's next token, then prefill chunks, oldest
    /// first, in what is left of the token budget.
    fn step(&mut self) {
        let mut budget = self.config.step_tokens.max(self.running.len());
        let mut plan: Vec<(usize, Vec<u32>, bool)> = Vec::with_capacity(self.running.len());
        for (i, s) in self.running.iter().enumerate() {
            if let Some(t) = s.next {
                plan.push((i, vec![t], true));
                budget -= 1;
            }
        }
        for (i, s) in self.running.iter().enumerate() {
            let prompt = &s.job.request.prompt;
            if s.next.is_none() && s.prefilled < prompt.len() && budget > 0 {
                let n = (prompt.len() - s.prefilled).min(budget);
                let done = s.prefilled + n == prompt.len();
                plan.push((i, prompt[s.prefilled..s.prefilled + n].to_vec(), done));
                budget -= n;
            }
        }
        plan.sort_by_key(|(i, _, _)| *i);
        // Only a step shared by several sequences saved anything by batching.
        let solo = if plan.len() > 1 {
            self.solo_decode(&plan)
        } else {
            None
        };
        let started = Instant::now();
        let result = {
            let mut chunks: Vec<Chunk<'_>> = Vec::with_capacity(plan.len());
            let mut seqs = self.running.iter_mut().enumerate();
            for (i, tokens, logits) in &plan {
                let Some((_, s)) = seqs.find(|(j, _)| j == i) else {
                    continue;
                };
                chunks.push(Chunk {
                    tokens,
                    cache: &mut s.cache,
                    logits: *logits,
                });
            }
            self.model.forward(&mut chunks)
        };
        let elapsed = started.elapsed();
        let tokens_in_step: usize = plan.iter().map(|(_, t, _)| t.len()).sum();
        if plan.len() == 1 && tokens_in_step == 1 {
            self.solo_decode = Some(self.solo_decode.map_or(elapsed, |s| {
                s.mul_f64(1.0 - SOLO_WEIGHT) + elapsed.mul_f64(SOLO_WEIGHT)
            }));
        }
        self.stats.steps.fetch_add(1, Ordering::Relaxed);
        self.stats.last_batch.store(plan.len(), Ordering::Relaxed);
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                // A failed step fails the sequences in it; the engine goes on.
                for (i, _, _) in &plan {
                    let _ = self.running[*i]
                        .job
                        .events
                        .send(Event::Failed(e.to_string()));
                }
                let failed: Vec<usize> = plan.iter().map(|(i, _, _)| *i).collect();
                self.remove(&failed);
                return;
            }
        };
        let mut logits = logits.into_iter();
        let mut finished = Vec::new();
        for (i, tokens, wants) in &plan {
            let s = &mut self.running[*i];
            // Engine time is shared by the tokens of the step. A decode token alone would
            // have taken a solo step; a prefill chunk is counted at its share (it is a batch
            // of its own already), so batching is never credited with more than it saved.
            let share = elapsed.mul_f64(tokens.len() as f64 / tokens_in_step.max(1) as f64);
            s.engine.shared += share;
            s.engine.alone += match solo {
                Some(solo) if s.next.is_some() => solo.max(share),
                _ => share,
            };
            if s.next.is_none() {
                s.prefilled += tokens.len();
                self.stats
                    .prompt_tokens
                    .fetch_add(tokens.len() as u64, Ordering::Relaxed);
            }
            if !wants {
                continue;
            }
            let Some(row) = logits.next() else { continue };
            let sampled = s.sampler.sample(&row);
            let token = sampled.token;
            let room = s.cache.len() < s.reserved.min(self.model.config.ctx_len);
            if s.padding {
                self.stats.padding_tokens.fetch_add(1, Ordering::Relaxed);
                if room {
                    s.next = Some(token);
                } else {
                    finished.push(*i);
                }
                continue;
            }
            s.first_token.get_or_insert_with(|| s.job.arrived.elapsed());
            let stop = !s.job.request.ignore_eos && s.job.request.stop_tokens.contains(&token);
            if !stop {
                s.generated += 1;
                self.stats.generated_tokens.fetch_add(1, Ordering::Relaxed);
                if s.job.events.send(Event::Token(sampled, s.engine)).is_err() {
                    finished.push(*i);
                    continue;
                }
            }
            let full = s.generated >= s.job.request.max_tokens
                || s.cache.len() + 1 > self.model.config.ctx_len;
            if stop || full {
                let reason = if stop {
                    FinishReason::Stop
                } else {
                    FinishReason::Length
                };
                let _ = s.job.events.send(Event::Done {
                    reason,
                    prompt_tokens: s.job.request.prompt.len(),
                    completion_tokens: s.generated,
                    queued: s.admitted.duration_since(s.job.arrived),
                    first_token: s.first_token.unwrap_or_default(),
                    engine: s.engine,
                });
                if self.config.batching == Batching::Static && room {
                    s.padding = true;
                    s.next = Some(token);
                } else {
                    finished.push(*i);
                }
            } else {
                s.next = Some(token);
            }
        }
        if self.running.iter().all(|s| s.padding) {
            finished = (0..self.running.len()).collect();
        }
        self.remove(&finished);
    }

    /// What a decode step of one sequence takes, for a step that batches a decode with
    /// other work. Measured once on a throwaway sequence (a few milliseconds) if no step
    /// has run one sequence alone yet.
    fn solo_decode(&mut self, plan: &[(usize, Vec<u32>, bool)]) -> Option<Duration> {
        let decodes = plan
            .iter()
            .filter(|(i, _, _)| self.running[*i].next.is_some());
        if self.solo_decode.is_none() && decodes.count() > 0 {
            let mut cache = KvCache::with_capacity(&self.model.config, 2);
            let mut times = Vec::with_capacity(2);
            for token in [0, 0] {
                let started = Instant::now();
                let mut chunk = [Chunk {
                    tokens: &[token],
                    cache: &mut cache,
                    logits: true,
                }];
                if self.model.forward(&mut chunk).is_err() {
                    return None;
                }
                times.push(started.elapsed());
            }
            // The second step: the first also warms the caches.
            self.solo_decode = times.last().copied();
        }
        self.solo_decode
    }

    fn remove(&mut self, indices: &[usize]) {
        let mut freed = 0;
        let mut i = 0;
        self.running.retain(|s| {
            let drop = indices.contains(&i);
            if drop {
                freed += s.reserved;
            }
            i += 1;
            !drop
        });
        self.reserved -= freed;
        self.publish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::testutil::test_model;
    use crate::model::LoadOptions;

    fn engine(batching: Batching, max_batch: usize, max_queue: usize) -> Engine {
        let model = Model::from_gguf(test_model(), LoadOptions::default()).unwrap();
        let config = SchedulerConfig {
            batching,
            max_batch,
            max_queue,
            ..SchedulerConfig::default()
        };
        Engine::start(model, config).unwrap()
    }

    fn request(max_tokens: usize) -> Request {
        Request {
            prompt: vec![504, 3575, 282, 4649, 314],
            max_tokens,
            sampling: SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            },
            stop_tokens: vec![2],
            ignore_eos: true,
        }
    }

    /// Tokens until `Done`, and the time the request waited for admission.
    fn drain(mut rx: events::UnboundedReceiver<Event>) -> (Vec<u32>, Duration) {
        let mut tokens = Vec::new();
        while let Some(e) = rx.blocking_recv() {
            match e {
                Event::Token(s, _) => tokens.push(s.token),
                Event::Done { queued, .. } => return (tokens, queued),
                Event::Failed(e) => panic!("failed: {e}"),
            }
        }
        panic!("no Done event");
    }

    /// Two slots; a long request, a short one, and a third waiting: the steps each mode
    /// takes, the padding it computes, and the tokens it returns.
    fn run(batching: Batching) -> (u64, u64, Vec<Vec<u32>>) {
        let e = engine(batching, 2, 8);
        let rxs: Vec<_> = [24, 4, 4]
            .into_iter()
            .map(|n| e.submit(request(n)).unwrap())
            .collect();
        let outs: Vec<Vec<u32>> = rxs.into_iter().map(|rx| drain(rx).0).collect();
        let st = e.stats();
        (
            st.steps.load(Ordering::Relaxed),
            st.padding_tokens.load(Ordering::Relaxed),
            outs,
        )
    }

    fn engine_time(mut rx: events::UnboundedReceiver<Event>) -> EngineTime {
        while let Some(e) = rx.blocking_recv() {
            if let Event::Done { engine, .. } = e {
                return engine;
            }
        }
        panic!("no Done event");
    }

    #[test]
    fn batching_is_credited_only_for_steps_shared_with_others() {
        let e = engine(Batching::Continuous, 4, 8);
        let alone = engine_time(e.submit(request(16)).unwrap());
        assert!(alone.shared > Duration::ZERO);
        assert_eq!(
            alone.alone, alone.shared,
            "a request served alone saved nothing"
        );
        let rxs: Vec<_> = (0..3).map(|_| e.submit(request(16)).unwrap()).collect();
        for t in rxs.into_iter().map(engine_time) {
            // Each decode step alone would have taken a whole solo step, not a third.
            assert!(t.alone > t.shared, "{t:?}");
            assert_eq!(t.saved(), t.alone - t.shared);
        }
    }

    #[test]
    fn continuous_fills_a_freed_slot_static_waits_for_the_batch() {
        let (cont_steps, cont_pad, cont) = run(Batching::Continuous);
        let (static_steps, static_pad, stat) = run(Batching::Static);
        let (drain_steps, drain_pad, drained) = run(Batching::Drain);
        // Continuous: the third request runs beside the long one; 24 decode steps in all
        // (the first token comes with the prefill step).
        assert_eq!(cont_steps, 24, "continuous");
        // Static and drain: the third waits for the long one, then runs alone: 24 + 4.
        assert_eq!(static_steps, 28, "static");
        assert_eq!(drain_steps, 28, "drain");
        // Padding: the short request's slot is computed until the long one ends (from its
        // 4th token to the 24th), only in padded static batching.
        assert_eq!((cont_pad, drain_pad), (0, 0));
        assert_eq!(static_pad, 20);
        // Every mode returns the same greedy tokens, of the asked lengths.
        assert_eq!(cont, stat);
        assert_eq!(cont, drained);
        assert_eq!(cont.iter().map(Vec::len).collect::<Vec<_>>(), [24, 4, 4]);
    }

    #[test]
    fn a_full_queue_is_overloaded_and_a_dropped_receiver_frees_its_slot() {
        let e = engine(Batching::Continuous, 1, 2);
        let first = e.submit(request(200)).unwrap();
        // Wait until the first is running, so the queue counts only what follows.
        while e.stats().running.load(Ordering::Relaxed) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let queued: Vec<_> = (0..2).map(|_| e.submit(request(2)).unwrap()).collect();
        assert!(matches!(
            e.submit(request(2)),
            Err(SubmitError::Overloaded(2))
        ));
        // Cancel the long one: the queued requests are served long before its 200 tokens.
        drop(first);
        for rx in queued {
            assert_eq!(drain(rx).0.len(), 2);
        }
        assert!(e.stats().generated_tokens.load(Ordering::Relaxed) < 100);
    }

    #[test]
    fn impossible_requests_are_refused_at_submit() {
        let e = engine(Batching::Continuous, 2, 8);
        let mut empty = request(4);
        empty.prompt.clear();
        assert!(matches!(e.submit(empty), Err(SubmitError::EmptyPrompt)));
        let ctx = e.context_len();
        assert!(matches!(
            e.submit(request(ctx)),
            Err(SubmitError::TooLong { .. })
        ));
    }
}
