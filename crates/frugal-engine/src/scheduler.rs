//! Continuous (in-flight) batching: one engine thread owns the model and every running
//! sequence, and runs the loop `admit -> filter_gone -> step` (plan, forward, sample).
//!
//! A waiting request joins the running batch at the next step when there is room; prefill
//! is cut into chunks under a per-step token budget so it never stalls the decoding
//! streams for long; a sequence whose client has gone (its receiver dropped) is removed
//! before the next step. Memory is bounded up front: a request is admitted only when its
//! worst case (prompt + max_tokens positions of KV cache) fits the budget, and the queue
//! behind it is bounded, so overload is an immediate "overloaded" error, never an OOM.
//!
//! Requests have a [`Priority`]. Interactive ones are admitted before any batch one (an
//! offline batch job's lines), FIFO within each class, and batch lines fill the slots and
//! KV budget left. A step's token budget goes to decodes first, then interactive prefill,
//! then batch prefill. When an interactive request cannot be admitted for want of a slot
//! or of KV room, batch sequences are preempted, the most recently admitted first, until
//! it fits: batch lines never hold its first token back by more than the step in flight.
//!
//! Preemption is by recompute, as in vLLM: the sequence frees its KV cache and reservation
//! and goes back to the front of the batch queue with all else it had (tokens generated,
//! sampler state, times). Readmitted, it prefills its prompt and the tokens it had fed,
//! then decodes on from its pending token, so its client sees no token twice and a greedy
//! output is that of an uninterrupted run. Swapping the cache out instead would gain
//! nothing on a CPU engine, where it is in host memory already: only freeing it lets the
//! interactive reservation fit, and recomputing a batch line costs one prefill.
//!
//! Static and drain batching, kept as baselines, ignore priorities.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc as events;

use crate::kv::{BLOCK, Shape};
use crate::model::{Chunk, Config, KvCache, Model, ModelError};
use crate::prefix::PrefixCache;
use crate::sampling::{Sampled, Sampler, SamplingParams};
use crate::speculate::{self, DRAFT_COST, Drafter, Speculate};

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

/// Who waits for a request: a client at the other end, or an offline batch job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Priority {
    /// Admitted first, and never preempted.
    #[default]
    Interactive,
    /// Fills what interactive requests leave, and is preempted to make room for them.
    Batch,
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
    /// Reuse the KV blocks of prompt prefixes already computed (system prompts, earlier
    /// turns); off, every request prefills from its first token.
    pub prefix_cache: bool,
    /// Draft tokens for decoding sequences to verify in their step (`crate::speculate`).
    pub speculate: Speculate,
}

impl Default for SchedulerConfig {
    fn default() -> SchedulerConfig {
        SchedulerConfig {
            batching: Batching::Continuous,
            max_batch: 16,
            step_tokens: 256,
            kv_positions: 64 * 1024,
            max_queue: 256,
            prefix_cache: true,
            speculate: Speculate::None,
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
    /// Batch requests yield to interactive ones.
    pub priority: Priority,
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

/// What a request receives, in order: `Admitted`, tokens, then `Done` or `Failed`.
#[derive(Debug, Clone)]
pub enum Event {
    /// The request joined the batch; `cached_tokens` of its prompt came from the prefix
    /// cache (told before any token: a reader may stop at a stop sequence, before `Done`).
    Admitted {
        cached_tokens: usize,
    },
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
    /// Requests waiting for admission, batch ones and preempted ones included.
    pub waiting: AtomicUsize,
    /// Of those, batch requests.
    pub waiting_batch: AtomicUsize,
    pub running: AtomicUsize,
    pub last_batch: AtomicUsize,
    pub steps: AtomicU64,
    /// Wall time spent in forward steps, in microseconds: the engine's busy time, which
    /// `frugal watch` divides by its scrape interval for the busy share.
    pub busy_us: AtomicU64,
    /// Prompt tokens prefilled, each request's once.
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Tokens computed for answered requests as static batching's padding: waste.
    pub padding_tokens: AtomicU64,
    pub kv_reserved: AtomicUsize,
    /// Batch sequences preempted to admit an interactive request.
    pub preempted: AtomicU64,
    /// Positions prefilled again by preempted sequences: what preemption cost.
    pub recomputed_tokens: AtomicU64,
    /// Requests looked up in the prefix cache, and those that reused at least one token.
    pub prefix_lookups: AtomicU64,
    pub prefix_hits: AtomicU64,
    /// Prompt tokens taken from the prefix cache instead of computed.
    pub prefix_hit_tokens: AtomicU64,
    /// Cached blocks evicted (least recently used) to make room.
    pub prefix_evictions: AtomicU64,
    /// Tokens drafted and verified in decode steps, and those of them accepted (each an
    /// emitted token that took no step of its own).
    pub drafted_tokens: AtomicU64,
    pub accepted_tokens: AtomicU64,
    /// KV blocks by state: held by running sequences, held only by the prefix cache
    /// (evictable), and never used or freed.
    pub kv_blocks_used: AtomicUsize,
    pub kv_blocks_cached: AtomicUsize,
    pub kv_blocks_free: AtomicUsize,
}

impl Stats {
    fn enqueued(&self, priority: Priority) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        if priority == Priority::Batch {
            self.waiting_batch.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn dequeued(&self, priority: Priority) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        if priority == Priority::Batch {
            self.waiting_batch.fetch_sub(1, Ordering::Relaxed);
        }
    }
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
        let (engine, worker) = Engine::new(model, config);
        std::thread::Builder::new()
            .name("frugal-scheduler".into())
            .spawn(move || worker.run())
            .map_err(|e| ModelError::Threads(e.to_string()))?;
        Ok(engine)
    }

    /// The handle, and the worker that serves it once run (tests turn it by hand).
    fn new(model: Model, config: SchedulerConfig) -> (Engine, Worker) {
        let (tx, rx) = mpsc::sync_channel(config.max_queue);
        let stats = Arc::new(Stats::default());
        let ctx_len = model.config.ctx_len.min(config.kv_positions);
        let shape = Shape::from(&model.config);
        let worker = Worker {
            model,
            config,
            rx,
            waiting: VecDeque::new(),
            waiting_batch: VecDeque::new(),
            running: Vec::new(),
            stats: stats.clone(),
            shape,
            capacity: config.kv_positions.div_ceil(BLOCK),
            prefix: PrefixCache::default(),
            reserved: 0,
            solo_decode: None,
            draft_cost: DRAFT_COST,
        };
        let engine = Engine {
            tx,
            stats,
            config,
            ctx_len,
        };
        (engine, worker)
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
        let priority = request.priority;
        let job = Job {
            request,
            events,
            arrived: Instant::now(),
        };
        // Counted before the send: the engine thread may take the job and count it out
        // before this thread would get to count it in.
        self.stats.enqueued(priority);
        self.tx.try_send(job).map_err(|e| {
            self.stats.dequeued(priority);
            match e {
                mpsc::TrySendError::Full(_) => SubmitError::Overloaded(self.config.max_queue),
                mpsc::TrySendError::Disconnected(_) => SubmitError::Stopped,
            }
        })?;
        Ok(rx)
    }
}

/// A request from its arrival to its end: waiting, running, and waiting again if it is
/// preempted, keeping all but its cache.
struct Sequence {
    job: Job,
    /// Empty while waiting.
    cache: KvCache,
    sampler: Sampler,
    /// Sampled tokens fed back into the cache after the prompt: with the prompt, what a
    /// preempted sequence prefills again.
    fed: Vec<u32>,
    /// The last sampled token, fed at the next step.
    next: Option<u32>,
    generated: usize,
    first_token: Option<Duration>,
    /// Its first admission.
    admitted: Option<Instant>,
    engine: EngineTime,
    /// Positions its cache may reach: its prompt and max_tokens.
    worst: usize,
    /// KV blocks reserved for it while it runs, less those it moved to the prefix cache.
    reserved: usize,
    /// Blocks of its cache offered to the prefix cache so far.
    indexed: usize,
    /// Times a later request with a longer cached prefix was admitted before it.
    passed: u32,
    /// Positions its cache held when it was last preempted: prefilling them is recompute.
    computed: usize,
    /// Answered, and kept computing as static batching's padding.
    padding: bool,
    /// Its drafter, when the engine speculates.
    drafter: Option<Drafter>,
    /// Tokens drafted to follow the pending one in the next step.
    draft: Vec<u32>,
}

impl Sequence {
    /// `draft_cost`: what a drafted token adds to a step, when the engine speculates.
    fn new(job: Job, model: &Config, draft_cost: Option<f32>) -> Sequence {
        Sequence {
            cache: KvCache::new(model),
            drafter: draft_cost.map(|cost| Drafter::new(&job.request.prompt, cost)),
            draft: Vec::new(),
            sampler: Sampler::new(job.request.sampling),
            fed: Vec::new(),
            next: None,
            generated: 0,
            first_token: None,
            admitted: None,
            engine: EngineTime::default(),
            worst: 0,
            reserved: 0,
            indexed: 0,
            passed: 0,
            computed: 0,
            padding: false,
            job,
        }
    }

    fn priority(&self) -> Priority {
        self.job.request.priority
    }

    /// Positions the cache holds before the pending token is fed.
    fn context_len(&self) -> usize {
        self.job.request.prompt.len() + self.fed.len()
    }

    /// Tokens of the context at positions `start..end`.
    fn context(&self, start: usize, end: usize) -> Vec<u32> {
        let prompt = &self.job.request.prompt;
        prompt
            .iter()
            .chain(&self.fed)
            .skip(start)
            .take(end - start)
            .copied()
            .collect()
    }
}

/// Where a running sequence stands, as a step's plan sees it.
#[derive(Debug, Clone, Copy)]
struct Progress {
    priority: Priority,
    /// Positions in its cache.
    cached: usize,
    /// Positions its cache holds before it decodes.
    context: usize,
    /// The sampled token to feed next.
    pending: Option<u32>,
    /// Tokens drafted to follow it.
    drafts: usize,
}

/// A sequence's part in one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Feeds its pending token and `drafts` drafted tokens after it, and samples from the
    /// logits of each until a draft is not the token drawn.
    Decode { token: u32, drafts: usize },
    /// Feeds context positions `start..end`. `logits` at the end of a new prompt, to
    /// sample the first token; a recomputed context ends without (its next token waits).
    Prefill {
        start: usize,
        end: usize,
        logits: bool,
    },
}

impl Part {
    /// Positions whose logits it samples from.
    fn logits(self) -> usize {
        match self {
            Part::Decode { drafts, .. } => 1 + drafts,
            Part::Prefill { logits, .. } => usize::from(logits),
        }
    }
}

/// Tokens a step may reach with drafted ones. The drafter weighs a drafted token against a
/// decode step of its sequence; in a large step, bound by its arithmetic, every token costs
/// about as much as any other and refused drafts only slow the batch.
const DRAFT_STEP_TOKENS: usize = 32;

/// A step's work under a budget of `step_tokens`, in running order: every decode (never
/// starved), then interactive prefill chunks, then batch ones in what is left, each class
/// in running order, which is admission order; then drafted tokens, in what the budget and
/// [`DRAFT_STEP_TOKENS`] leave, so that they never hold a prefill back.
fn plan_step(step_tokens: usize, seqs: &[Progress]) -> Vec<(usize, Part)> {
    let mut budget = step_tokens.max(seqs.len());
    let mut plan = Vec::with_capacity(seqs.len());
    for (i, s) in seqs.iter().enumerate() {
        if let Some(token) = s.pending.filter(|_| s.cached == s.context) {
            plan.push((i, Part::Decode { token, drafts: 0 }));
            budget -= 1;
        }
    }
    for class in [Priority::Interactive, Priority::Batch] {
        for (i, s) in seqs.iter().enumerate() {
            if s.priority == class && s.cached < s.context && budget > 0 {
                let end = s.context.min(s.cached + budget);
                let logits = end == s.context && s.pending.is_none();
                plan.push((
                    i,
                    Part::Prefill {
                        start: s.cached,
                        end,
                        logits,
                    },
                ));
                budget -= end - s.cached;
            }
        }
    }
    let used = step_tokens.max(seqs.len()) - budget;
    let mut room = budget.min(DRAFT_STEP_TOKENS.saturating_sub(used));
    for (i, part) in plan.iter_mut() {
        if let Part::Decode { drafts, .. } = part {
            *drafts = seqs[*i].drafts.min(room);
            room -= *drafts;
        }
    }
    plan.sort_by_key(|(i, _)| *i);
    plan
}

struct Worker {
    model: Model,
    config: SchedulerConfig,
    rx: mpsc::Receiver<Job>,
    /// Jobs waiting in arrival order: interactive ones, and every one where priorities do
    /// not apply (static and drain batching).
    waiting: VecDeque<Sequence>,
    /// Batch jobs waiting behind every interactive one, preempted sequences in front.
    waiting_batch: VecDeque<Sequence>,
    running: Vec<Sequence>,
    stats: Arc<Stats>,
    shape: Shape,
    /// KV blocks in the budget: what running sequences reserve plus what the prefix cache
    /// keeps stays within it.
    capacity: usize,
    prefix: PrefixCache,
    /// KV blocks reserved by running sequences for blocks of their own (those they share
    /// with the prefix cache are counted there).
    reserved: usize,
    /// A decode step with one sequence: a moving average of the steps that had one, first
    /// measured on a throwaway sequence when the batch first holds more than one.
    solo_decode: Option<Duration>,
    /// What a drafted token adds to a step, as a share of it: measured when the worker
    /// starts to run, if it speculates (`speculate::draft_cost`), then followed on the
    /// steps of a lone sequence with drafts (`speculate::learn_cost`).
    draft_cost: f32,
}

/// Times a waiting request may be passed over for one with a longer cached prefix.
const MAX_PASSED: u32 = 8;

/// Waiting requests compared for their cached prefix at each admission.
const LOOK_AHEAD: usize = 64;

/// Weight of the newest solo decode step in the moving average.
const SOLO_WEIGHT: f64 = 0.1;

impl Worker {
    fn run(mut self) {
        if self.config.speculate == Speculate::Ngram {
            self.draft_cost = speculate::draft_cost(&self.model);
            tracing::info!(
                draft_cost = self.draft_cost,
                "speculation: a drafted token adds {:.2} of a decode step",
                self.draft_cost
            );
        }
        while self.turn() {}
    }

    /// One round of the loop. False when every handle is gone.
    fn turn(&mut self) -> bool {
        if !self.receive() {
            return false;
        }
        self.admit();
        self.filter_gone();
        if !self.running.is_empty() {
            self.step();
        }
        true
    }

    /// Takes new jobs; blocks while there is nothing to do. False when every handle is gone.
    fn receive(&mut self) -> bool {
        if self.running.is_empty() && self.waiting.is_empty() && self.waiting_batch.is_empty() {
            match self.rx.recv() {
                Ok(job) => self.enqueue(job),
                Err(_) => return false,
            }
        }
        while let Ok(job) = self.rx.try_recv() {
            self.enqueue(job);
        }
        true
    }

    fn enqueue(&mut self, job: Job) {
        let cost = (self.config.speculate == Speculate::Ngram).then_some(self.draft_cost);
        let s = Sequence::new(job, &self.model.config, cost);
        if self.rank(&s) == Priority::Batch {
            self.waiting_batch.push_back(s);
        } else {
            self.waiting.push_back(s);
        }
    }

    /// A sequence's priority where priorities apply; the same for all elsewhere.
    fn rank(&self, s: &Sequence) -> Priority {
        match self.config.batching {
            Batching::Continuous => s.priority(),
            Batching::Static | Batching::Drain => Priority::Interactive,
        }
    }

    /// Moves waiting jobs into the batch while their worst case fits: interactive ones
    /// first, preempting batch sequences for them if need be, then batch ones in the room
    /// left. A batch job waits while an interactive one does. Within a queue, the job with
    /// the longest cached prefix goes first (it costs the least to start, and its blocks are
    /// the likeliest to be evicted if it waits), unless the front one has been passed over
    /// [`MAX_PASSED`] times: none waits for ever.
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
                .map(|s| s.job.request.max_tokens)
                .max(),
            _ => None,
        };
        loop {
            self.drop_gone_waiting();
            let from_batch = self.waiting.is_empty();
            let Some(at) = self.next_waiting(from_batch) else {
                break;
            };
            let queue = if from_batch {
                &self.waiting_batch
            } else {
                &self.waiting
            };
            let Some(s) = queue.get(at) else {
                break;
            };
            let worst = s.job.request.prompt.len() + longest.unwrap_or(s.job.request.max_tokens);
            let (tokens, limit) = (s.context(0, s.context_len()), self.limit(s));
            let hit = self.lookup(&tokens, limit);
            // Whole blocks of the hit are shared; a partial last one is copied, so it is own.
            let shared = hit.len() / BLOCK;
            let need = worst.div_ceil(BLOCK) - shared;
            // A batch job never preempts; an interactive one preempts batch sequences only.
            if !self.fits(need) && (from_batch || !self.preempt_for(need)) {
                break;
            }
            let queue = if from_batch {
                &mut self.waiting_batch
            } else {
                &mut self.waiting
            };
            queue.iter_mut().take(at).for_each(|s| s.passed += 1);
            let Some(mut s) = queue.remove(at) else {
                break;
            };
            self.stats.dequeued(s.priority());
            self.make_room(need);
            let reused = hit.len();
            if self.config.prefix_cache {
                self.stats.prefix_lookups.fetch_add(1, Ordering::Relaxed);
                if reused > 0 {
                    self.stats.prefix_hits.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .prefix_hit_tokens
                        .fetch_add(reused as u64, Ordering::Relaxed);
                }
            }
            if s.admitted.is_none() {
                let cached_tokens = reused.min(s.job.request.prompt.len());
                let _ = s.job.events.send(Event::Admitted { cached_tokens });
            }
            self.reserved += need;
            s.reserved = need;
            s.worst = worst;
            s.indexed = shared;
            s.cache = hit;
            s.admitted.get_or_insert_with(Instant::now);
            self.running.push(s);
        }
        self.publish();
    }

    /// Which waiting job of a queue to admit next: the front one when it has waited long
    /// enough or no prefix is cached, else the one with the longest cached prefix (the
    /// earliest of equals).
    fn next_waiting(&self, from_batch: bool) -> Option<usize> {
        let queue = if from_batch {
            &self.waiting_batch
        } else {
            &self.waiting
        };
        let front = queue.front()?;
        if !self.config.prefix_cache || front.passed >= MAX_PASSED || self.prefix.is_empty() {
            return Some(0);
        }
        let best = queue
            .iter()
            .take(LOOK_AHEAD)
            .enumerate()
            .map(|(i, s)| {
                (
                    self.prefix
                        .peek(&s.context(0, s.context_len()), self.limit(s)),
                    i,
                )
            })
            .max_by_key(|&(cached, i)| (cached, std::cmp::Reverse(i)));
        Some(best.map_or(0, |(_, i)| i))
    }

    /// Positions of a sequence's context that may come from the prefix cache: all but the
    /// last prompt token, whose logits give the first token (a preempted sequence has its
    /// next token already).
    fn limit(&self, s: &Sequence) -> usize {
        let n = s.context_len();
        if s.next.is_some() { n } else { n - 1 }
    }

    /// The longest cached prefix of a waiting sequence's context, `tokens`, at most `limit`
    /// long (none when the prefix cache is off).
    fn lookup(&mut self, tokens: &[u32], limit: usize) -> KvCache {
        if !self.config.prefix_cache {
            return KvCache::new(self.shape);
        }
        self.prefix.lookup(self.shape, tokens, limit)
    }

    /// Evicts cached blocks until `need` more blocks fit the budget.
    fn make_room(&mut self, need: usize) {
        let over = (self.reserved + self.prefix.len() + need).saturating_sub(self.capacity);
        if over > 0 {
            let gone = self.prefix.evict(over);
            self.stats
                .prefix_evictions
                .fetch_add(gone as u64, Ordering::Relaxed);
        }
    }

    /// Offers a sequence's new full blocks to the prefix cache; with `tail`, its last,
    /// partial block too (the sequence ends: nothing will write it again). The blocks taken
    /// move from the sequence's reservation to the cache's count.
    fn index(&mut self, i: usize, tail: bool) {
        let Some(s) = self.running.get_mut(i) else {
            return;
        };
        let upto = if tail {
            s.cache.len()
        } else {
            s.cache.len() / BLOCK * BLOCK
        };
        if !self.config.prefix_cache || upto <= s.indexed * BLOCK {
            return;
        }
        let tokens = s.context(0, upto);
        let added = self.prefix.insert(&tokens, &s.cache, upto).min(s.reserved);
        s.indexed = upto.div_ceil(BLOCK);
        s.reserved -= added;
        self.reserved -= added;
    }

    /// Drops the jobs at the queues' fronts whose client has gone.
    fn drop_gone_waiting(&mut self) {
        for queue in [&mut self.waiting, &mut self.waiting_batch] {
            while queue.front().is_some_and(|s| s.job.events.is_closed()) {
                if let Some(s) = queue.pop_front() {
                    self.stats.dequeued(s.priority());
                }
            }
        }
    }

    /// Whether a sequence needing `need` blocks of its own can join the batch now, once
    /// cached blocks no sequence holds are evicted.
    fn fits(&self, need: usize) -> bool {
        let held = self.prefix.len() - self.prefix.evictable();
        self.running.len() < self.config.max_batch
            && (self.reserved + held + need <= self.capacity || self.running.is_empty())
    }

    /// Preempts batch sequences, the most recently admitted first, until `need` fits; none
    /// when preempting them all would not be enough. True when it fits.
    fn preempt_for(&mut self, need: usize) -> bool {
        let (kept, kept_kv) = self
            .running
            .iter()
            .filter(|s| self.rank(s) == Priority::Interactive)
            .fold((0, 0), |(n, kv), s| (n + 1, kv + s.reserved));
        let enough = kept < self.config.max_batch && (kept == 0 || kept_kv + need <= self.capacity);
        if !enough {
            return false;
        }
        while !self.fits(need) {
            let Some(i) = self
                .running
                .iter()
                .rposition(|s| self.rank(s) == Priority::Batch)
            else {
                return false;
            };
            self.preempt(i);
        }
        true
    }

    /// Sends running sequence `i` back to the front of the batch queue, without its cache.
    fn preempt(&mut self, i: usize) {
        self.index(i, true);
        let mut s = self.running.remove(i);
        self.reserved -= s.reserved;
        s.reserved = 0;
        s.computed = s.computed.max(s.cache.len());
        s.cache = KvCache::new(self.shape);
        tracing::debug!(
            generated = s.generated,
            recompute = s.context_len(),
            "preempted a batch sequence"
        );
        self.stats.enqueued(Priority::Batch);
        self.stats.preempted.fetch_add(1, Ordering::Relaxed);
        self.waiting_batch.push_front(s);
    }

    /// Drops sequences whose client has gone, before any work is spent on them.
    fn filter_gone(&mut self) {
        let gone: Vec<usize> = (0..self.running.len())
            .filter(|&i| {
                let s = &self.running[i];
                s.job.events.is_closed() && !s.padding
            })
            .collect();
        self.remove(&gone);
    }

    fn publish(&self) {
        let st = &self.stats;
        st.running.store(self.running.len(), Ordering::Relaxed);
        let cached = self.prefix.evictable();
        let used = self.reserved + self.prefix.len() - cached;
        st.kv_reserved.store(used * BLOCK, Ordering::Relaxed);
        st.kv_blocks_used.store(used, Ordering::Relaxed);
        st.kv_blocks_cached.store(cached, Ordering::Relaxed);
        let free = self.capacity.saturating_sub(used + cached);
        st.kv_blocks_free.store(free, Ordering::Relaxed);
    }

    /// One forward step of the work [`plan_step`] gives it; then each sequence that wanted
    /// logits samples its next token, or, after drafted tokens, its next few.
    fn step(&mut self) {
        let ctx_len = self.model.config.ctx_len;
        let decodes =
            |s: &Sequence| s.next.is_some() && s.cache.len() == s.context_len() && !s.padding;
        let decoding = self.running.iter().filter(|s| decodes(s)).count();
        for s in self.running.iter_mut() {
            s.draft.clear();
            // The step emits a drafted token's successor too: none past max_tokens, and
            // every position within the sequence's reservation and the context.
            let left = s.job.request.max_tokens.saturating_sub(s.generated);
            let room = s.worst.min(ctx_len).saturating_sub(s.context_len() + 1);
            if decodes(s)
                && let Some(d) = s.drafter.as_mut()
            {
                s.draft
                    .extend_from_slice(d.propose(left.saturating_sub(1).min(room), decoding));
            }
        }
        let progress: Vec<Progress> = self
            .running
            .iter()
            .map(|s| Progress {
                priority: self.rank(s),
                cached: s.cache.len(),
                context: s.context_len(),
                pending: s.next,
                drafts: s.draft.len(),
            })
            .collect();
        let plan: Vec<(usize, Part, Vec<u32>)> = plan_step(self.config.step_tokens, &progress)
            .into_iter()
            .map(|(i, part)| {
                let s = &self.running[i];
                let tokens = match part {
                    Part::Decode { token, drafts } => [&[token], &s.draft[..drafts]].concat(),
                    Part::Prefill { start, end, .. } => s.context(start, end),
                };
                (i, part, tokens)
            })
            .collect();
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
            for (i, part, tokens) in &plan {
                let Some((_, s)) = seqs.find(|(j, _)| j == i) else {
                    continue;
                };
                chunks.push(Chunk {
                    tokens,
                    cache: &mut s.cache,
                    logits: part.logits(),
                });
            }
            self.model.forward(&mut chunks)
        };
        let elapsed = started.elapsed();
        let tokens_in_step: usize = plan.iter().map(|(_, _, t)| t.len()).sum();
        if plan.len() == 1 && tokens_in_step == 1 {
            self.solo_decode = Some(self.solo_decode.map_or(elapsed, |s| {
                s.mul_f64(1.0 - SOLO_WEIGHT) + elapsed.mul_f64(SOLO_WEIGHT)
            }));
        }
        // A lone sequence's step with drafts: what they cost at this context and load.
        if let ([(_, Part::Decode { drafts, .. }, _)], Some(solo)) = (&plan[..], self.solo_decode)
            && *drafts > 0
        {
            self.draft_cost = speculate::learn_cost(self.draft_cost, solo, elapsed, *drafts);
        }
        self.stats.steps.fetch_add(1, Ordering::Relaxed);
        self.stats
            .busy_us
            .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
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
        for (i, part, tokens) in &plan {
            let s = &mut self.running[*i];
            // Engine time is shared by the tokens of the step. A decode token alone would
            // have taken a solo step; a prefill chunk is counted at its share (it is a batch
            // of its own already), so batching is never credited with more than it saved.
            let share = elapsed.mul_f64(tokens.len() as f64 / tokens_in_step.max(1) as f64);
            s.engine.shared += share;
            s.engine.alone += match (solo, part) {
                (Some(solo), Part::Decode { .. }) => solo.max(share),
                _ => share,
            };
            let drafts = match *part {
                Part::Decode { token, drafts } => {
                    s.fed.push(token);
                    &tokens[1..=drafts]
                }
                Part::Prefill { start, end, .. } => {
                    let again = end.min(s.computed).saturating_sub(start);
                    self.stats
                        .recomputed_tokens
                        .fetch_add(again as u64, Ordering::Relaxed);
                    self.stats
                        .prompt_tokens
                        .fetch_add((end - start - again) as u64, Ordering::Relaxed);
                    &[]
                }
            };
            // Each position's logits are drawn from in turn, exactly once per emitted token,
            // as plain decoding draws: the sequence goes on past a drafted token only when
            // it is the token drawn, which is then in the cache already.
            let rows: Vec<Vec<f32>> = logits.by_ref().take(part.logits()).collect();
            let mut accepted = 0;
            for row in &rows {
                let sampled = self.running[*i].sampler.sample(row);
                let token = sampled.token;
                if !self.emit(*i, sampled) {
                    finished.push(*i);
                    break;
                }
                // (An answer kept as static batching's padding never drafts.)
                if self.running[*i].padding || drafts.get(accepted) != Some(&token) {
                    break;
                }
                self.running[*i].fed.push(token);
                accepted += 1;
            }
            let s = &mut self.running[*i];
            // Positions of refused drafts go; the cache holds the sequence's context again.
            s.cache.truncate(s.context_len());
            if let Some(d) = s.drafter.as_mut().filter(|_| !drafts.is_empty()) {
                d.verified(drafts.len(), accepted);
                self.stats
                    .drafted_tokens
                    .fetch_add(drafts.len() as u64, Ordering::Relaxed);
                self.stats
                    .accepted_tokens
                    .fetch_add(accepted as u64, Ordering::Relaxed);
            }
        }
        for (i, _, _) in &plan {
            self.index(*i, false);
        }
        if self.running.iter().all(|s| s.padding) {
            finished = (0..self.running.len()).collect();
        }
        self.remove(&finished);
    }

    /// Hands sequence `i` its sampled token: to its client, unless it is a stop token, then
    /// `Done` if it ends the sequence. False when the sequence is over (answered, or its
    /// client gone); static batching keeps an answered one as padding.
    fn emit(&mut self, i: usize, sampled: Sampled) -> bool {
        let ctx_len = self.model.config.ctx_len;
        let s = &mut self.running[i];
        let token = sampled.token;
        let room = s.context_len() < s.worst.min(ctx_len);
        if s.padding {
            self.stats.padding_tokens.fetch_add(1, Ordering::Relaxed);
            s.next = Some(token);
            return room;
        }
        s.first_token.get_or_insert_with(|| s.job.arrived.elapsed());
        let stop = !s.job.request.ignore_eos && s.job.request.stop_tokens.contains(&token);
        if !stop {
            s.generated += 1;
            self.stats.generated_tokens.fetch_add(1, Ordering::Relaxed);
            if s.job.events.send(Event::Token(sampled, s.engine)).is_err() {
                return false;
            }
        }
        let full = s.generated >= s.job.request.max_tokens || s.context_len() + 1 > ctx_len;
        if !(stop || full) {
            s.next = Some(token);
            if let Some(d) = s.drafter.as_mut() {
                d.push(token);
            }
            return true;
        }
        let reason = if stop {
            FinishReason::Stop
        } else {
            FinishReason::Length
        };
        let queued = s
            .admitted
            .map_or(Duration::ZERO, |a| a.duration_since(s.job.arrived));
        let _ = s.job.events.send(Event::Done {
            reason,
            prompt_tokens: s.job.request.prompt.len(),
            completion_tokens: s.generated,
            queued,
            first_token: s.first_token.unwrap_or_default(),
            engine: s.engine,
        });
        if self.config.batching == Batching::Static && room {
            s.padding = true;
            s.next = Some(token);
            return true;
        }
        false
    }

    /// What a decode step of one sequence takes, for a step that batches a decode with
    /// other work. Measured once on a throwaway sequence (a few milliseconds) if no step
    /// has run one sequence alone yet.
    fn solo_decode(&mut self, plan: &[(usize, Part, Vec<u32>)]) -> Option<Duration> {
        let decodes = plan
            .iter()
            .filter(|(_, part, _)| matches!(part, Part::Decode { .. }));
        if self.solo_decode.is_none() && decodes.count() > 0 {
            let mut cache = KvCache::with_capacity(&self.model.config, 2);
            let mut times = Vec::with_capacity(2);
            for token in [0, 0] {
                let started = Instant::now();
                let mut chunk = [Chunk {
                    tokens: &[token],
                    cache: &mut cache,
                    logits: 1,
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

    /// Ends running sequences `indices`: what they computed stays in the prefix cache,
    /// and their reservations are freed.
    fn remove(&mut self, indices: &[usize]) {
        for &i in indices {
            self.index(i, true);
        }
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
            priority: Priority::Interactive,
        }
    }

    /// `request`, as a batch line.
    fn batch(max_tokens: usize) -> Request {
        Request {
            priority: Priority::Batch,
            ..request(max_tokens)
        }
    }

    /// An engine whose worker the test turns by hand, one step at a time.
    fn by_hand(config: SchedulerConfig) -> (Engine, Worker) {
        let model = Model::from_gguf(test_model(), LoadOptions::default()).unwrap();
        Engine::new(model, config)
    }

    /// A request's events as a worker turned by hand sends them.
    struct Client {
        rx: events::UnboundedReceiver<Event>,
        tokens: Vec<u32>,
        /// The turn that brought the first token.
        first: Option<usize>,
        completion_tokens: Option<usize>,
        cached_tokens: Option<usize>,
        /// Each token's logprob and its top alternatives' bits: equal bits, equal logits.
        logprobs: Vec<Vec<u32>>,
    }

    impl Client {
        fn submit(e: &Engine, request: Request) -> Client {
            Client {
                rx: e.submit(request).unwrap(),
                tokens: Vec::new(),
                first: None,
                completion_tokens: None,
                cached_tokens: None,
                logprobs: Vec::new(),
            }
        }

        fn poll(&mut self, turn: usize) {
            while let Ok(e) = self.rx.try_recv() {
                match e {
                    Event::Token(s, _) => {
                        self.tokens.push(s.token);
                        let bits = s.top.iter().map(|(_, p)| p.to_bits());
                        self.logprobs
                            .push([s.logprob.to_bits()].into_iter().chain(bits).collect());
                        self.first.get_or_insert(turn);
                    }
                    Event::Admitted { cached_tokens } => self.cached_tokens = Some(cached_tokens),
                    Event::Done {
                        completion_tokens, ..
                    } => self.completion_tokens = Some(completion_tokens),
                    Event::Failed(e) => panic!("failed: {e}"),
                }
            }
        }

        fn done(&self) -> bool {
            self.completion_tokens.is_some()
        }
    }

    /// Turns `w` until every client is done, counting turns on from `turn`.
    fn finish(w: &mut Worker, clients: &mut [&mut Client], mut turn: usize) {
        while !clients.iter().all(|c| c.done()) {
            turn += 1;
            assert!(w.turn());
            clients.iter_mut().for_each(|c| c.poll(turn));
            let idle = w.running.is_empty() && w.waiting.is_empty() && w.waiting_batch.is_empty();
            assert!(
                !idle || clients.iter().all(|c| c.done()),
                "clients wait on an idle engine"
            );
        }
    }

    /// Tokens until `Done`, and the time the request waited for admission.
    fn drain(mut rx: events::UnboundedReceiver<Event>) -> (Vec<u32>, Duration) {
        let mut tokens = Vec::new();
        while let Some(e) = rx.blocking_recv() {
            match e {
                Event::Admitted { .. } => {}
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
        let (e, worker) = by_hand(SchedulerConfig {
            batching,
            max_batch: 2,
            max_queue: 8,
            ..SchedulerConfig::default()
        });
        // All three are queued before the worker runs: a worker that took the first alone
        // would batch them otherwise than the test means.
        let rxs: Vec<_> = [24, 4, 4]
            .into_iter()
            .map(|n| e.submit(request(n)).unwrap())
            .collect();
        std::thread::spawn(move || worker.run());
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

    #[test]
    fn an_interactive_request_preempts_batch_lines_for_its_first_token() {
        let (e, mut w) = by_hand(SchedulerConfig {
            max_batch: 2,
            ..SchedulerConfig::default()
        });
        let mut lines = [Client::submit(&e, batch(16)), Client::submit(&e, batch(16))];
        for turn in 1..=4 {
            assert!(w.turn());
            lines.iter_mut().for_each(|c| c.poll(turn));
        }
        assert_eq!(lines.each_ref().map(|c| c.tokens.len()), [4, 4]);
        let mut chat = Client::submit(&e, request(4));
        let before = e.stats().steps.load(Ordering::Relaxed);
        assert!(w.turn());
        chat.poll(5);
        // Without preemption it would wait 12 steps for a slot. On the engine thread, the
        // step in flight when it arrives comes on top.
        let steps = e.stats().steps.load(Ordering::Relaxed) - before;
        assert_eq!((chat.tokens.len(), steps), (1, 1));
        assert_eq!(e.stats().preempted.load(Ordering::Relaxed), 1);
        assert_eq!(e.stats().waiting_batch.load(Ordering::Relaxed), 1);
        let [first, second] = &mut lines;
        finish(&mut w, &mut [first, second, &mut chat], 5);
        // The later line was preempted: its client saw no gap and no repeat, and it kept
        // its greedy output.
        assert_eq!(lines[1].tokens, lines[0].tokens);
        assert_eq!(lines[1].completion_tokens, Some(16));
        assert_eq!(lines[1].tokens.len(), 16);
        assert_eq!(chat.tokens.len(), 4);
        assert_eq!(e.stats().preempted.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_batch_line_preempted_for_kv_room_resumes_with_its_sampler() {
        // Seeded sampling: the line's output is the same only if its sampler carries on.
        let line = || Request {
            sampling: SamplingParams {
                temperature: 0.8,
                seed: Some(7),
                ..SamplingParams::default()
            },
            ..batch(16)
        };
        let alone = drain(engine(Batching::Continuous, 4, 8).submit(line()).unwrap()).0;
        // Room for the line (21 positions) or the chat (13), not both; without the prefix
        // cache, which would hand the line its own blocks back instead of a recompute.
        let (e, mut w) = by_hand(SchedulerConfig {
            max_batch: 4,
            kv_positions: 30,
            prefix_cache: false,
            ..SchedulerConfig::default()
        });
        let mut batched = Client::submit(&e, line());
        for turn in 1..=6 {
            assert!(w.turn());
            batched.poll(turn);
        }
        let mut chat = Client::submit(&e, request(8));
        finish(&mut w, &mut [&mut batched, &mut chat], 6);
        let st = e.stats();
        assert_eq!(st.preempted.load(Ordering::Relaxed), 1);
        assert_eq!(batched.tokens, alone);
        assert_eq!(batched.completion_tokens, Some(16));
        // Six tokens sampled, five of them fed: the prompt and those five are recomputed,
        // and each prompt counts once.
        assert_eq!(st.recomputed_tokens.load(Ordering::Relaxed), 5 + 5);
        assert_eq!(st.prompt_tokens.load(Ordering::Relaxed), 5 + 5);
        assert_eq!(st.kv_reserved.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn waiting_interactive_requests_go_before_earlier_batch_lines() {
        let (e, mut w) = by_hand(SchedulerConfig {
            max_batch: 1,
            ..SchedulerConfig::default()
        });
        let mut running = Client::submit(&e, request(4));
        assert!(w.turn());
        running.poll(1);
        let mut lines = [Client::submit(&e, batch(2)), Client::submit(&e, batch(2))];
        let mut chat = Client::submit(&e, request(2));
        assert!(w.turn());
        let st = e.stats();
        assert_eq!(st.waiting.load(Ordering::Relaxed), 3);
        assert_eq!(st.waiting_batch.load(Ordering::Relaxed), 2);
        let [first, second] = &mut lines;
        finish(&mut w, &mut [&mut running, first, second, &mut chat], 2);
        assert!(running.first < chat.first);
        assert!(chat.first < lines[0].first);
        assert!(lines[0].first < lines[1].first);
        // Neither the running interactive request for another, nor a line for a line.
        assert_eq!(st.preempted.load(Ordering::Relaxed), 0);
        assert_eq!(st.waiting.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn batch_prefill_gets_only_the_budget_interactive_prefill_leaves() {
        let p = |priority, cached, context, pending| Progress {
            priority,
            cached,
            context,
            pending,
            drafts: 0,
        };
        let decode = |token, drafts| Part::Decode { token, drafts };
        let prefill = |start, end, logits| Part::Prefill { start, end, logits };
        let seqs = [
            // A batch line's long prompt, admitted first.
            p(Priority::Batch, 0, 100, None),
            p(Priority::Interactive, 0, 10, None),
            p(Priority::Interactive, 4, 4, Some(9)),
            p(Priority::Batch, 0, 7, Some(3)),
        ];
        // Decodes first, then the interactive prompt whole, then batch prefill.
        assert_eq!(
            plan_step(16, &seqs),
            [
                (0, prefill(0, 5, false)),
                (1, prefill(0, 10, true)),
                (2, decode(9, 0)),
            ]
        );
        assert_eq!(
            plan_step(8, &seqs),
            [(1, prefill(0, 7, false)), (2, decode(9, 0))]
        );
        // A preempted line recomputes without sampling, then feeds its pending token.
        let resumed = p(Priority::Batch, 0, 7, Some(3));
        assert_eq!(plan_step(16, &[resumed]), [(0, prefill(0, 7, false))]);
        let resumed = p(Priority::Batch, 7, 7, Some(3));
        assert_eq!(plan_step(16, &[resumed]), [(0, decode(3, 0))]);
    }

    #[test]
    fn drafted_tokens_take_only_what_decodes_and_prefill_leave() {
        let p = |cached, context, pending, drafts| Progress {
            priority: Priority::Interactive,
            cached,
            context,
            pending,
            drafts,
        };
        let decode = |token, drafts| Part::Decode { token, drafts };
        let seqs = [p(4, 4, Some(9), 5), p(0, 10, None, 0), p(6, 6, Some(3), 7)];
        // Two decodes and a prompt of ten in 16 tokens: four left, for the first's drafts.
        let prompt = Part::Prefill {
            start: 0,
            end: 10,
            logits: true,
        };
        assert_eq!(
            plan_step(16, &seqs),
            [(0, decode(9, 4)), (1, prompt), (2, decode(3, 0))]
        );
        assert_eq!(
            plan_step(256, &seqs),
            [(0, decode(9, 5)), (1, prompt), (2, decode(3, 7))]
        );
        // Eight decodes drafting seven each: the step stops at DRAFT_STEP_TOKENS.
        let many = [p(4, 4, Some(9), 7); 8];
        let drafts: Vec<usize> = plan_step(256, &many)
            .into_iter()
            .map(|(_, part)| part.logits() - 1)
            .collect();
        assert_eq!(drafts, [7, 7, 7, 3, 0, 0, 0, 0]);
    }

    /// A greedy request for `prompt` that reports its top logprobs.
    fn asking(prompt: Vec<u32>, max_tokens: usize) -> Request {
        Request {
            prompt,
            sampling: SamplingParams {
                temperature: 0.0,
                top_logprobs: 5,
                ..SamplingParams::default()
            },
            ..request(max_tokens)
        }
    }

    /// `n` tokens from `seed`, varied as text is (a prompt of one repeated token would hide
    /// a position mix-up).
    fn tokens(seed: u32, n: usize) -> Vec<u32> {
        (0..n as u32)
            .map(|i| 300 + (seed * 7919 + i * 104_729) % 40_000)
            .collect()
    }

    /// Runs `prompts` one after the other on a fresh worker with `config`; each client.
    fn one_by_one(config: SchedulerConfig, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Client> {
        let (e, mut w) = by_hand(config);
        let mut out = Vec::new();
        for p in prompts {
            let mut c = Client::submit(&e, asking(p.clone(), max_tokens));
            finish(&mut w, &mut [&mut c], 0);
            out.push(c);
        }
        out
    }

    fn prefix_off() -> SchedulerConfig {
        SchedulerConfig {
            prefix_cache: false,
            ..SchedulerConfig::default()
        }
    }

    /// A conversation's second turn starts with the first turn's prompt and answer: with the
    /// prefix cache it computes only what follows the answer's fed tokens, and its tokens and
    /// logprobs are bit for bit those of a run without the cache (8-bit KV too).
    #[test]
    fn a_later_turn_reuses_the_earlier_turn_and_answers_alike() {
        for kv in [crate::model::KvType::F32, crate::model::KvType::Q8_0] {
            let load = |config| {
                let options = LoadOptions {
                    kv,
                    ..LoadOptions::default()
                };
                Engine::new(Model::from_gguf(test_model(), options).unwrap(), config)
            };
            let first = tokens(1, 150);
            let run = |config: SchedulerConfig| {
                let (e, mut w) = load(config);
                let mut one = Client::submit(&e, asking(first.clone(), 8));
                finish(&mut w, &mut [&mut one], 0);
                let second = [first.clone(), one.tokens.clone(), tokens(2, 20)].concat();
                let mut two = Client::submit(&e, asking(second, 8));
                finish(&mut w, &mut [&mut two], 0);
                (one, two, e)
            };
            let (on1, on2, on) = run(SchedulerConfig::default());
            let (off1, off2, _) = run(prefix_off());
            assert_eq!(on1.cached_tokens, Some(0), "{kv:?}");
            // The cache holds the prompt and every answer token but the last, never fed.
            assert_eq!(on2.cached_tokens, Some(150 + 8 - 1), "{kv:?}");
            assert_eq!(off2.cached_tokens, Some(0), "{kv:?}");
            assert_eq!((&on1.tokens, &on2.tokens), (&off1.tokens, &off2.tokens));
            assert_eq!(
                (&on1.logprobs, &on2.logprobs),
                (&off1.logprobs, &off2.logprobs)
            );
            let st = on.stats();
            assert_eq!(st.prefix_lookups.load(Ordering::Relaxed), 2);
            assert_eq!(st.prefix_hits.load(Ordering::Relaxed), 1);
            assert_eq!(st.prefix_hit_tokens.load(Ordering::Relaxed), 157);
            // Prefilled: the first prompt whole, of the second only its 21 new tokens.
            assert_eq!(st.prompt_tokens.load(Ordering::Relaxed), 150 + 21);
        }
    }

    /// A prompt that diverges inside a block reuses the block up to the divergence (copied
    /// before it is written), at several split points, and leaves the cached original as it
    /// was: the original asked again answers as the first time.
    #[test]
    fn a_prefix_ending_inside_a_block_is_reused_to_its_last_common_token() {
        let base = tokens(3, 140);
        for split in [1usize, 63, 64, 65, 100, 128, 139] {
            let mut other = base.clone();
            other.truncate(split);
            other.extend(tokens(4, 30));
            let prompts = [base.clone(), other.clone(), base.clone()];
            let on = one_by_one(SchedulerConfig::default(), &prompts, 6);
            let off = one_by_one(prefix_off(), &prompts, 6);
            for (a, b) in on.iter().zip(&off) {
                assert_eq!(a.tokens, b.tokens, "split {split}");
                assert_eq!(a.logprobs, b.logprobs, "split {split}");
            }
            assert_eq!(on[1].cached_tokens, Some(split), "split {split}");
            assert_eq!(on[2].cached_tokens, Some(139), "split {split}");
        }
    }

    /// Two requests share a long prefix and the second arrives while the first is still
    /// prefilling it: the second takes the blocks the first has completed, and both answer
    /// as they would alone.
    #[test]
    fn a_request_reuses_the_blocks_of_one_still_prefilling() {
        let shared = tokens(5, 300);
        let a = [shared.clone(), tokens(6, 10)].concat();
        let b = [shared.clone(), tokens(7, 12)].concat();
        let config = SchedulerConfig {
            step_tokens: 64,
            ..SchedulerConfig::default()
        };
        let (e, mut w) = by_hand(config);
        let mut ca = Client::submit(&e, asking(a.clone(), 6));
        assert!(w.turn() && w.turn(), "two steps: 128 positions of a");
        let mut cb = Client::submit(&e, asking(b.clone(), 6));
        finish(&mut w, &mut [&mut ca, &mut cb], 2);
        assert_eq!(cb.cached_tokens, Some(128), "two full blocks were computed");
        let alone = one_by_one(prefix_off(), &[a, b], 6);
        assert_eq!(
            (&ca.tokens, &cb.tokens),
            (&alone[0].tokens, &alone[1].tokens)
        );
        assert_eq!(
            (&ca.logprobs, &cb.logprobs),
            (&alone[0].logprobs, &alone[1].logprobs)
        );
    }

    /// Under memory pressure the least recently used cached blocks go, and never those of a
    /// running request: a long answer keeps its prefix cached while other prompts churn the
    /// cache, blocks in use and cached stay within the budget, and every answer is the one
    /// computed without the cache.
    #[test]
    fn eviction_frees_cold_blocks_and_never_a_running_requests() {
        let config = SchedulerConfig {
            kv_positions: 10 * BLOCK,
            ..SchedulerConfig::default()
        };
        let (e, mut w) = by_hand(config);
        let long = tokens(8, 130);
        let mut held = Client::submit(&e, asking(long.clone(), 120));
        assert!(w.turn(), "the long request is admitted and prefilled");
        let mut turn = 1;
        let mut churn = Vec::new();
        for seed in 20..26 {
            let mut c = Client::submit(&e, asking(tokens(seed, 70), 4));
            while !c.done() {
                turn += 1;
                assert!(w.turn());
                c.poll(turn);
                held.poll(turn);
                let st = e.stats();
                let (used, cached) = (
                    st.kv_blocks_used.load(Ordering::Relaxed),
                    st.kv_blocks_cached.load(Ordering::Relaxed),
                );
                assert!(used + cached <= 10, "{used} used, {cached} cached");
            }
            churn.push(c);
        }
        assert!(!held.done(), "the long request still runs");
        let evicted = e.stats().prefix_evictions.load(Ordering::Relaxed);
        assert!(
            evicted > 0,
            "six prompts of two blocks each overflow the budget"
        );
        let mut again = Client::submit(&e, asking(long.clone(), 4));
        finish(&mut w, &mut [&mut held, &mut again], turn);
        assert!(
            again.cached_tokens >= Some(128),
            "the running request's blocks stayed: {:?}",
            again.cached_tokens
        );
        let mut prompts: Vec<Vec<u32>> = (20..26).map(|seed| tokens(seed, 70)).collect();
        prompts.push(long.clone());
        let alone = one_by_one(prefix_off(), &prompts, 4);
        for (c, a) in churn.iter().chain([&again]).zip(&alone) {
            assert_eq!(c.tokens, a.tokens);
        }
        let long_alone = one_by_one(prefix_off(), &[long], 120);
        assert_eq!(held.tokens, long_alone[0].tokens);
    }

    /// Among waiting requests the one with the longest cached prefix is admitted first, but
    /// a request passed over [`MAX_PASSED`] times goes next.
    #[test]
    fn the_longest_cached_prefix_goes_first_without_starving_the_rest() {
        let config = SchedulerConfig {
            max_batch: 1,
            ..SchedulerConfig::default()
        };
        let (e, mut w) = by_hand(config);
        let shared = tokens(9, 200);
        let mut warm = Client::submit(&e, asking(shared.clone(), 1));
        finish(&mut w, &mut [&mut warm], 0);
        // One slot, busy; then a cold request and nine that share the cached prefix.
        let mut busy = Client::submit(&e, asking(tokens(10, 5), 3));
        assert!(w.turn());
        let mut cold = Client::submit(&e, asking(tokens(11, 50), 1));
        let mut hot: Vec<Client> = (0..9)
            .map(|i| Client::submit(&e, asking([shared.clone(), tokens(30 + i, 5)].concat(), 1)))
            .collect();
        let mut order = Vec::new();
        let mut turn = 1;
        while !(cold.done() && hot.iter().all(Client::done)) {
            turn += 1;
            assert!(w.turn());
            busy.poll(turn);
            cold.poll(turn);
            if cold.done() && !order.contains(&"cold") {
                order.push("cold");
            }
            for c in hot.iter_mut() {
                let was = c.done();
                c.poll(turn);
                if c.done() && !was {
                    order.push("hot");
                }
            }
        }
        let at = order.iter().position(|&o| o == "cold").unwrap();
        assert_eq!(at, MAX_PASSED as usize, "{order:?}");
    }
}
