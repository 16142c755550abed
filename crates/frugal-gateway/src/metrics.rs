//! Prometheus metrics: counters, and histograms of time to first token and time per
//! output token. A handful of atomics; a metrics library would add more than it saves.

use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use frugal_cost::Lever;
use frugal_semantic::Veto;
use frugal_semantic::budget::Served;

/// Bucket upper bounds in seconds; the sub-millisecond ones are for cache hits.
const BUCKETS: [f64; 18] = [
    0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 10.0, 30.0,
];

pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    /// Sum in microseconds.
    sum_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram::with_bounds(&BUCKETS)
    }
}

impl Histogram {
    /// A histogram over bucket upper bounds `bounds` (seconds, ascending).
    pub fn with_bounds(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, seconds: f64) {
        if let Some(i) = self.bounds.iter().position(|b| seconds <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        self.render_series(name, "", out);
    }

    /// The series' lines without the header, with `labels` (`pool="qwen"`) on each.
    pub fn render_series(&self, name: &str, labels: &str, out: &mut String) {
        let sep = if labels.is_empty() { "" } else { "," };
        let braces = |l: &str| {
            if l.is_empty() {
                String::new()
            } else {
                format!("{{{l}}}")
            }
        };
        let mut cumulative = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cumulative += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum{} {}",
            braces(labels),
            self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{} {count}", braces(labels));
    }
}

/// Milliseconds since the epoch.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The ledger writer's health: updated by the meter, read by `/metrics`.
pub struct LedgerHealth {
    /// Whether the last write to the ledger succeeded.
    up: AtomicBool,
    /// Rows waiting in the spool for the ledger.
    spooled: AtomicU64,
    replayed: AtomicU64,
    /// Rows dropped because neither the ledger nor the spool could take them, and their
    /// cost in nano-dollars.
    lost: AtomicU64,
    lost_nanos: AtomicI64,
    /// Answers that went out before their row was durable (the disk was slow or failing).
    undurable: AtomicU64,
    /// When the journal last went from empty to holding rows (ms since the epoch; 0: empty).
    behind_since_ms: AtomicU64,
    /// Each group commit to the ledger (a shipped batch too), failed ones included.
    pub commit: Histogram,
}

impl Default for LedgerHealth {
    fn default() -> LedgerHealth {
        LedgerHealth {
            up: AtomicBool::new(true),
            spooled: AtomicU64::new(0),
            replayed: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            lost_nanos: AtomicI64::new(0),
            undurable: AtomicU64::new(0),
            behind_since_ms: AtomicU64::new(0),
            commit: Histogram::default(),
        }
    }
}

impl LedgerHealth {
    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
    }

    pub fn up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    pub fn set_spooled(&self, rows: u64) {
        self.spooled.store(rows, Ordering::Relaxed);
    }

    pub fn spooled(&self) -> u64 {
        self.spooled.load(Ordering::Relaxed)
    }

    pub fn add_replayed(&self, rows: u64) {
        self.replayed.fetch_add(rows, Ordering::Relaxed);
    }

    pub fn replayed(&self) -> u64 {
        self.replayed.load(Ordering::Relaxed)
    }

    pub fn add_undurable(&self) {
        self.undurable.fetch_add(1, Ordering::Relaxed);
    }

    pub fn undurable(&self) -> u64 {
        self.undurable.load(Ordering::Relaxed)
    }

    /// Whether the journal holds rows not yet in the ledger; the lag counts from when it
    /// began to.
    pub fn set_behind(&self, behind: bool) {
        match behind {
            true if self.behind_since_ms.load(Ordering::Relaxed) == 0 => {
                // Never 0, which means "not behind".
                self.behind_since_ms
                    .store(now_ms().max(1), Ordering::Relaxed);
            }
            false => self.behind_since_ms.store(0, Ordering::Relaxed),
            true => {}
        }
    }

    /// Seconds since the journal last held no row waiting for the ledger.
    pub fn lag_seconds(&self) -> f64 {
        match self.behind_since_ms.load(Ordering::Relaxed) {
            0 => 0.0,
            since => now_ms().saturating_sub(since) as f64 / 1000.0,
        }
    }

    pub fn add_lost(&self, rows: u64, cost: frugal_cost::Money) {
        self.lost.fetch_add(rows, Ordering::Relaxed);
        self.lost_nanos.fetch_add(cost.nanos(), Ordering::Relaxed);
    }

    /// Rows lost, and their cost.
    pub fn lost(&self) -> (u64, frugal_cost::Money) {
        (
            self.lost.load(Ordering::Relaxed),
            frugal_cost::Money::from_nanos(self.lost_nanos.load(Ordering::Relaxed)),
        )
    }

    pub fn render(&self, out: &mut String) {
        let (lost, lost_cost) = self.lost();
        let lines: [(&str, &str, &str, String); 7] = [
            (
                "frugal_ledger_up",
                "Whether the last write to the ledger succeeded (0: rows wait in the journal).",
                "gauge",
                u8::from(self.up()).to_string(),
            ),
            (
                "frugal_ledger_spooled_events",
                "Rows (events and replica spans) waiting in the local journal for the ledger.",
                "gauge",
                self.spooled().to_string(),
            ),
            (
                "frugal_ledger_lag_seconds",
                "Seconds since the journal last held no row waiting for the ledger.",
                "gauge",
                format!("{:.3}", self.lag_seconds()),
            ),
            (
                "frugal_ledger_replayed_events_total",
                "Rows shipped into the ledger after it was away, or left by an earlier run.",
                "counter",
                self.replayed().to_string(),
            ),
            (
                "frugal_ledger_undurable_answers_total",
                "Answers that completed before their row was on disk (the disk was slow or failing).",
                "counter",
                self.undurable().to_string(),
            ),
            (
                "frugal_ledger_lost_events_total",
                "Rows dropped because neither the ledger nor its journal could take them.",
                "counter",
                lost.to_string(),
            ),
            (
                "frugal_ledger_lost_usd_total",
                "The cost of the dropped rows, in US dollars.",
                "counter",
                lost_cost.to_string_places(9),
            ),
        ];
        for (name, help, kind, value) in lines {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        self.commit.render(
            "frugal_ledger_commit_seconds",
            "Latency of each group commit to the ledger, failed ones and replayed batches included.",
            out,
        );
    }
}

#[derive(Default)]
pub struct Metrics {
    pub requests_ok: AtomicU64,
    pub requests_failed: AtomicU64,
    /// Left by their client part-way (billed for what was produced).
    pub requests_cancelled: AtomicU64,
    pub requests_rejected: AtomicU64,
    pub cache_hits: AtomicU64,
    pub semantic_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    /// What each lever saved per served name (the model a cache hit replayed, the route
    /// whose cheap tier answered, the local model for batching), in nano-dollars.
    saved: std::sync::Mutex<std::collections::BTreeMap<(Lever, String), i64>>,
    /// What was spent per model (the local engine's time, upstream calls), in nano-dollars.
    spend: std::sync::Mutex<std::collections::BTreeMap<String, i64>>,
    pub ttft: Histogram,
    pub tpot: Histogram,
    pub latency: Histogram,
    /// Index search and guard time of a semantic lookup (embedding not included).
    pub semantic_lookup: Histogram,
    /// Semantic lookups whose nearest similar-enough entry the guard turned away, by reason
    /// (indexed as `Veto::ALL`).
    pub semantic_vetoes: [AtomicU64; Veto::ALL.len()],
    /// Shadows' quality samples by lever, served name and whether they agreed; shadows
    /// drawn and dropped for want of a slot; what shadows' calls cost, in nano-dollars.
    shadows: std::sync::Mutex<std::collections::BTreeMap<(Lever, String, bool), u64>>,
    shadow_dropped: AtomicU64,
    shadow_cost: AtomicI64,
    /// Requests per cascade route and the tier whose answer was sent.
    routes: std::sync::Mutex<std::collections::BTreeMap<(String, String), u64>>,
    /// Keys reloaded (SIGHUP), and reloads refused (a config that did not parse or check).
    pub reloads_ok: AtomicU64,
    pub reloads_failed: AtomicU64,
    /// Of those, reloads that would have dropped every key (opened the API).
    pub reloads_refused_open: AtomicU64,
    /// Budgets without Redis on a shared ledger: when they last read the other replicas'
    /// spend from it (epoch ms; 0: never), and whether the last try did.
    pub catch_up_at_ms: AtomicI64,
    pub catch_up_failing: AtomicBool,
}

/// Engine gauges read at scrape time.
pub struct Gauges {
    pub waiting: usize,
    pub running: usize,
    pub batch: usize,
    pub kv_reserved: usize,
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    pub padding_tokens: u64,
    pub steps: u64,
    /// Seconds spent in forward steps.
    pub busy_seconds: f64,
    /// Batch lines among `waiting`.
    pub waiting_batch: usize,
    /// Batch lines preempted for interactive requests, and the positions they prefilled again.
    pub preempted: u64,
    pub recomputed_tokens: u64,
    /// The prefix cache: requests looked up, those that reused a prefix, the prompt tokens
    /// reused, and the cached blocks evicted.
    pub prefix_lookups: u64,
    pub prefix_hits: u64,
    pub prefix_hit_tokens: u64,
    pub prefix_evictions: u64,
    /// Tokens drafted by speculative decoding, and those of them accepted.
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
    /// KV blocks held by running sequences, held only by the prefix cache, and free.
    pub kv_blocks: [usize; 3],
    /// The integer kernel the engine runs, its weight prefetch, its threads, and how they
    /// were chosen (`measured` at start, `cached`, `flags`, `fixed`).
    pub kernel: (&'static str, &'static str, usize, &'static str),
}

impl Metrics {
    pub fn count_veto(&self, v: Veto) {
        if let Some(i) = Veto::ALL.iter().position(|&x| x == v) {
            self.semantic_vetoes[i].fetch_add(1, Ordering::Relaxed);
        }
    }
    pub fn add_spend(&self, model: &str, cost: frugal_cost::Money) {
        let mut spend = self.spend.lock().unwrap_or_else(|p| p.into_inner());
        *spend.entry(model.to_owned()).or_default() += cost.nanos();
    }

    pub fn add_saving(&self, lever: Lever, model: &str, saved: frugal_cost::Money) {
        let mut map = self.saved.lock().unwrap_or_else(|p| p.into_inner());
        *map.entry((lever, model.to_owned())).or_default() += saved.nanos();
    }

    pub fn count_shadow(&self, lever: Lever, model: &str, agreed: bool) {
        let mut shadows = self.shadows.lock().unwrap_or_else(|p| p.into_inner());
        *shadows
            .entry((lever, model.to_owned(), agreed))
            .or_default() += 1;
    }

    pub fn count_shadow_dropped(&self) {
        self.shadow_dropped.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add_shadow_cost(&self, cost: frugal_cost::Money) {
        self.shadow_cost.fetch_add(cost.nanos(), Ordering::Relaxed);
    }

    pub fn count_route(&self, route: &str, tier: &str) {
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        *routes
            .entry((route.to_owned(), tier.to_owned()))
            .or_default() += 1;
    }

    /// The metrics as Prometheus text; `g`, the local engine's gauges, when there is one.
    pub fn render(&self, g: Option<&Gauges>) -> String {
        let mut out = String::new();
        if let Some(g) = g {
            Self::render_engine(&mut out, g);
        }
        self.render_requests(&mut out);
        let _ = writeln!(
            out,
            "# HELP frugal_config_reloads_total Reloads of the keys and budgets from the config file (SIGHUP).\n# TYPE frugal_config_reloads_total counter\nfrugal_config_reloads_total{{result=\"ok\"}} {}\nfrugal_config_reloads_total{{result=\"error\"}} {}\n# HELP frugal_key_reloads_refused_total Reloads refused because they would drop every key and open the API (no `allow_open`).\n# TYPE frugal_key_reloads_refused_total counter\nfrugal_key_reloads_refused_total {}",
            self.reloads_ok.load(Ordering::Relaxed),
            self.reloads_failed.load(Ordering::Relaxed),
            self.reloads_refused_open.load(Ordering::Relaxed)
        );
        out
    }

    /// The semantic cache's error budgets, one series per bound in use: the bound, the
    /// candidates the verifier read, the hits served, the wrong hits expected among them and
    /// the estimated wrong-hit rate with its 95% interval.
    pub fn render_semantic_budgets(out: &mut String, budgets: &[(f64, Served)]) {
        if budgets.is_empty() {
            return;
        }
        type Value = dyn Fn(f64, &Served) -> String;
        let series = |out: &mut String, name: &str, kind: &str, help: &str, v: &Value| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (bound, served) in budgets {
                let _ = writeln!(out, "{name}{{max_error=\"{bound}\"}} {}", v(*bound, served));
            }
        };
        series(
            out,
            "frugal_semantic_max_error",
            "gauge",
            "The share of served semantic hits that may be wrong (semantic_max_error).",
            &|bound, _| bound.to_string(),
        );
        series(
            out,
            "frugal_semantic_candidates_total",
            "counter",
            "Near questions through the hard vetoes that the paraphrase verifier read.",
            &|_, s| s.candidates.to_string(),
        );
        series(
            out,
            "frugal_semantic_budget_hits_total",
            "counter",
            "Semantic hits the error budget served.",
            &|_, s| s.hits.to_string(),
        );
        series(
            out,
            "frugal_semantic_expected_wrong_hits",
            "counter",
            "Wrong hits expected among them: the sum of 1 - P(same) over the hits served.",
            &|_, s| s.expected_wrong.to_string(),
        );
        let _ = writeln!(
            out,
            "# HELP frugal_semantic_wrong_rate_estimate The estimated share of served semantic hits that were wrong, with its 95% interval.\n# TYPE frugal_semantic_wrong_rate_estimate gauge"
        );
        for (bound, served) in budgets {
            let e = served.estimate();
            for (which, v) in [("estimate", e.rate), ("low", e.low), ("high", e.high)] {
                let _ = writeln!(
                    out,
                    "frugal_semantic_wrong_rate_estimate{{max_error=\"{bound}\",bound=\"{which}\"}} {v}"
                );
            }
        }
    }

    /// Whether budgets are shared (`frugal_budget_shared`: 1 while the last call reached
    /// Redis, 0 while admission is on the local view) and how many admissions fell back.
    pub fn render_budgets(
        out: &mut String,
        shared: bool,
        fallbacks: u64,
        (unsettled, unreleased): (usize, usize),
    ) {
        let _ = writeln!(
            out,
            "# HELP frugal_budget_shared 1 when the last budget call reached Redis, 0 when admission uses this gateway's local view.\n# TYPE frugal_budget_shared gauge\nfrugal_budget_shared {}\n# HELP frugal_budget_fallbacks_total Admissions decided on this gateway's local view because Redis was unreachable or slow.\n# TYPE frugal_budget_fallbacks_total counter\nfrugal_budget_fallbacks_total {fallbacks}\n# HELP frugal_budget_unsettled Requests' costs not yet added to the shared totals in Redis.\n# TYPE frugal_budget_unsettled gauge\nfrugal_budget_unsettled {unsettled}\n# HELP frugal_budget_unreleased Holds in Redis of requests that are over (or never placed for sure: the call timed out), not yet removed.\n# TYPE frugal_budget_unreleased gauge\nfrugal_budget_unreleased {unreleased}",
            u8::from(shared)
        );
    }

    /// Budgets that catch up from a shared ledger (no Redis): whether the last catch-up
    /// read it, and how old the other replicas' spend they count is.
    pub fn render_catch_up(&self, out: &mut String, now_ms: i64) {
        let at = self.catch_up_at_ms.load(Ordering::Relaxed);
        if at == 0 && !self.catch_up_failing.load(Ordering::Relaxed) {
            return;
        }
        let shared = !self.catch_up_failing.load(Ordering::Relaxed);
        let age = if at == 0 {
            f64::INFINITY
        } else {
            (now_ms - at).max(0) as f64 / 1000.0
        };
        let _ = writeln!(
            out,
            "# HELP frugal_budget_shared 1 when the last budget catch-up read the other replicas' spend from the shared ledger, 0 when admission uses this gateway's local view.\n# TYPE frugal_budget_shared gauge\nfrugal_budget_shared {}\n# HELP frugal_budget_catch_up_age_seconds Since budgets last read the other replicas' spend from the shared ledger.\n# TYPE frugal_budget_catch_up_age_seconds gauge\nfrugal_budget_catch_up_age_seconds {age}",
            u8::from(shared)
        );
    }

    fn render_shadows(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP frugal_shadow_samples_total Cheap answers checked on the reference path, by lever, served name (route) and agreement.\n# TYPE frugal_shadow_samples_total counter"
        );
        let shadows = self.shadows.lock().unwrap_or_else(|p| p.into_inner());
        for ((lever, route, agree), n) in shadows.iter() {
            let _ = writeln!(
                out,
                "frugal_shadow_samples_total{{lever=\"{}\",route=\"{route}\",agree=\"{agree}\"}} {n}",
                lever.as_str()
            );
        }
        drop(shadows);
        let _ = writeln!(
            out,
            "# HELP frugal_shadow_dropped_total Shadows drawn and dropped: every slot was busy.\n# TYPE frugal_shadow_dropped_total counter\nfrugal_shadow_dropped_total {}",
            self.shadow_dropped.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP frugal_shadow_cost_usd_total What shadows' calls cost, in dollars.\n# TYPE frugal_shadow_cost_usd_total counter\nfrugal_shadow_cost_usd_total {}",
            self.shadow_cost.load(Ordering::Relaxed) as f64 / 1e9
        );
    }

    fn render_engine(out: &mut String, g: &Gauges) {
        let gauge = |out: &mut String, name: &str, help: &str, kind: &str, v: f64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        };
        let (kernel, prefetch, threads, chosen) = g.kernel;
        let _ = writeln!(
            out,
            "# HELP frugal_engine_info The engine's integer kernel, its weight prefetch, its threads, and how they were chosen.\n# TYPE frugal_engine_info gauge\nfrugal_engine_info{{kernel=\"{kernel}\",prefetch=\"{prefetch}\",threads=\"{threads}\",chosen=\"{chosen}\"}} 1"
        );
        gauge(
            out,
            "frugal_queue_depth",
            "Requests waiting for admission.",
            "gauge",
            g.waiting as f64,
        );
        gauge(
            out,
            "frugal_queue_depth_batch",
            "Batch lines among the requests waiting for admission (admitted after interactive ones).",
            "gauge",
            g.waiting_batch as f64,
        );
        gauge(
            out,
            "frugal_batch_preemptions_total",
            "Batch lines preempted to admit interactive requests (resumed later by recomputing).",
            "counter",
            g.preempted as f64,
        );
        gauge(
            out,
            "frugal_recomputed_tokens_total",
            "Positions prefilled again by preempted batch lines: what preemption cost.",
            "counter",
            g.recomputed_tokens as f64,
        );
        gauge(
            out,
            "frugal_prefix_cache_lookups_total",
            "Requests looked up in the engine's prefix cache.",
            "counter",
            g.prefix_lookups as f64,
        );
        gauge(
            out,
            "frugal_prefix_cache_hits_total",
            "Requests that reused a cached prompt prefix.",
            "counter",
            g.prefix_hits as f64,
        );
        gauge(
            out,
            "frugal_prefix_cache_hit_tokens_total",
            "Prompt tokens whose KV came from the prefix cache instead of being prefilled.",
            "counter",
            g.prefix_hit_tokens as f64,
        );
        gauge(
            out,
            "frugal_prefix_cache_evictions_total",
            "Cached KV blocks evicted (least recently used) to make room.",
            "counter",
            g.prefix_evictions as f64,
        );
        gauge(
            out,
            "frugal_speculation_drafted_tokens_total",
            "Tokens drafted by speculative decoding ([serve] speculate) and verified in decode steps.",
            "counter",
            g.drafted_tokens as f64,
        );
        gauge(
            out,
            "frugal_speculation_accepted_tokens_total",
            "Drafted tokens accepted: each a generated token that took no decode step of its own.",
            "counter",
            g.accepted_tokens as f64,
        );
        let _ = writeln!(
            out,
            "# HELP frugal_kv_blocks KV-cache blocks by state: held by running sequences, held only by the prefix cache (evictable), free.\n# TYPE frugal_kv_blocks gauge"
        );
        for (state, n) in ["used", "cached", "free"].iter().zip(g.kv_blocks) {
            let _ = writeln!(out, "frugal_kv_blocks{{state=\"{state}\"}} {n}");
        }
        gauge(
            out,
            "frugal_running_sequences",
            "Sequences in the running batch.",
            "gauge",
            g.running as f64,
        );
        gauge(
            out,
            "frugal_batch_size",
            "Sequences in the last forward step.",
            "gauge",
            g.batch as f64,
        );
        gauge(
            out,
            "frugal_kv_reserved_positions",
            "KV-cache positions reserved.",
            "gauge",
            g.kv_reserved as f64,
        );
        gauge(
            out,
            "frugal_prompt_tokens_total",
            "Prompt tokens prefilled.",
            "counter",
            g.prompt_tokens as f64,
        );
        gauge(
            out,
            "frugal_generated_tokens_total",
            "Tokens generated.",
            "counter",
            g.generated_tokens as f64,
        );
        gauge(
            out,
            "frugal_padding_tokens_total",
            "Tokens computed as static batching's padding (only with --batching static).",
            "counter",
            g.padding_tokens as f64,
        );
        gauge(
            out,
            "frugal_engine_steps_total",
            "Forward steps run.",
            "counter",
            g.steps as f64,
        );
        gauge(
            out,
            "frugal_engine_busy_seconds_total",
            "Wall time spent in forward steps: the engine's busy time.",
            "counter",
            g.busy_seconds,
        );
    }

    fn render_requests(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP frugal_requests_total Requests by outcome.\n# TYPE frugal_requests_total counter"
        );
        for (status, c) in [
            ("ok", &self.requests_ok),
            ("failed", &self.requests_failed),
            ("cancelled", &self.requests_cancelled),
            ("rejected", &self.requests_rejected),
        ] {
            let _ = writeln!(
                out,
                "frugal_requests_total{{status=\"{status}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP frugal_cache_requests_total Cacheable requests by cache result.\n# TYPE frugal_cache_requests_total counter"
        );
        for (result, c) in [
            ("hit-exact", &self.cache_hits),
            ("hit-semantic", &self.semantic_hits),
            ("miss", &self.cache_misses),
        ] {
            let _ = writeln!(
                out,
                "frugal_cache_requests_total{{result=\"{result}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP frugal_semantic_vetoes_total Semantic lookups a guard veto turned into a miss, by reason.\n# TYPE frugal_semantic_vetoes_total counter"
        );
        for (v, c) in Veto::ALL.iter().zip(&self.semantic_vetoes) {
            let _ = writeln!(
                out,
                "frugal_semantic_vetoes_total{{reason=\"{}\"}} {}",
                v.name(),
                c.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP frugal_saved_usd_total What each lever saved, per model or route, in dollars.\n# TYPE frugal_saved_usd_total counter"
        );
        let saved = self.saved.lock().unwrap_or_else(|p| p.into_inner());
        for ((lever, model), nanos) in saved.iter() {
            let _ = writeln!(
                out,
                "frugal_saved_usd_total{{lever=\"{}\",model=\"{model}\"}} {}",
                lever.as_str(),
                *nanos as f64 / 1e9
            );
        }
        drop(saved);
        let spend = self.spend.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(
            out,
            "# HELP frugal_spend_usd_total What answering cost, per model, in dollars.\n# TYPE frugal_spend_usd_total counter"
        );
        for (model, nanos) in spend.iter() {
            let _ = writeln!(
                out,
                "frugal_spend_usd_total{{model=\"{model}\"}} {}",
                *nanos as f64 / 1e9
            );
        }
        drop(spend);
        self.render_shadows(out);
        let routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        if !routes.is_empty() {
            let _ = writeln!(
                out,
                "# HELP frugal_route_requests_total Cascade requests by route and the tier that answered.\n# TYPE frugal_route_requests_total counter"
            );
            for ((route, tier), n) in routes.iter() {
                let _ = writeln!(
                    out,
                    "frugal_route_requests_total{{route=\"{route}\",tier=\"{tier}\"}} {n}"
                );
            }
        }
        drop(routes);
        self.semantic_lookup.render(
            "frugal_semantic_search_seconds",
            "Semantic cache index search and guard, per lookup.",
            out,
        );
        self.ttft.render(
            "frugal_time_to_first_token_seconds",
            "Time to first token.",
            out,
        );
        self.tpot.render(
            "frugal_time_per_output_token_seconds",
            "Time per output token after the first.",
            out,
        );
        self.latency.render(
            "frugal_request_duration_seconds",
            "Whole request time.",
            out,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative() {
        let h = Histogram::default();
        for s in [0.004, 0.02, 0.02, 40.0] {
            h.observe(s);
        }
        let mut out = String::new();
        h.render("t", "help", &mut out);
        assert!(out.contains("t_bucket{le=\"0.005\"} 1\n"), "{out}");
        assert!(out.contains("t_bucket{le=\"0.025\"} 3\n"), "{out}");
        assert!(out.contains("t_bucket{le=\"30\"} 3\n"), "{out}");
        assert!(out.contains("t_bucket{le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("t_count 4\n"), "{out}");
    }
}
