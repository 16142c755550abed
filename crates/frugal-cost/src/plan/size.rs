//! Right-sizing and scale to zero for serving workloads: the instance type that serves a
//! million tokens cheapest while meeting a latency SLO, from `frugal bench --json` runs on
//! each; and whether letting a pool's last replica go between requests pays, from the
//! gaps between the workload's arrivals against the pool's cold start.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::HOUR_MS;
use crate::event::{Kind, ReplicaState};
use crate::ledger::{Ledger, LedgerError, Window};
use crate::money::{HourlyRate, Millis, Money};

/// Scale to zero pays only while fewer requests than this share wait for a cold start.
pub const DEFAULT_MAX_WAITING_SHARE: f64 = 0.05;

#[derive(Debug, thiserror::Error)]
pub enum SizeError {
    #[error("not the JSON `frugal bench --json` writes: {0}")]
    BenchJson(#[source] serde_json::Error),
    #[error("the bench answered no request ({errors} errors), so it measured nothing")]
    NothingMeasured { errors: usize },
}

/// The figures of a `frugal bench --json` run that sizing reads; the rest is ignored.
#[derive(Debug, Clone, Deserialize)]
struct BenchJson {
    requests: usize,
    errors: usize,
    wall_s: f64,
    prompt_tokens: u64,
    output_tokens: u64,
    output_tokens_per_s: f64,
    ttft: BenchPercentiles,
    latency: BenchPercentiles,
}

#[derive(Debug, Clone, Deserialize)]
struct BenchPercentiles {
    p50: f64,
    p99: f64,
}

/// One instance type's measured serving figures, at its hourly price.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    pub instance_type: String,
    pub rate: HourlyRate,
    pub output_tokens_per_s: f64,
    /// Prompt and output tokens together.
    pub total_tokens_per_s: f64,
    /// `None` where the bench saw no first token: non-streamed requests have none.
    pub ttft_p99_s: Option<f64>,
    pub latency_p99_s: Option<f64>,
}

impl Measured {
    /// Reads the figures a `frugal bench --json` run wrote for `instance_type`.
    pub fn from_bench_json(
        instance_type: &str,
        rate: HourlyRate,
        json: &str,
    ) -> Result<Measured, SizeError> {
        let b: BenchJson = serde_json::from_str(json).map_err(SizeError::BenchJson)?;
        if b.requests <= b.errors {
            return Err(SizeError::NothingMeasured { errors: b.errors });
        }
        // The bench writes zeros for percentiles of nothing.
        let measured = |p: &BenchPercentiles| (p.p50 > 0.0 || p.p99 > 0.0).then_some(p.p99);
        Ok(Measured {
            instance_type: instance_type.to_owned(),
            rate,
            output_tokens_per_s: b.output_tokens_per_s,
            total_tokens_per_s: (b.prompt_tokens + b.output_tokens) as f64 / b.wall_s.max(1e-9),
            ttft_p99_s: measured(&b.ttft),
            latency_p99_s: measured(&b.latency),
        })
    }
}

/// The latency a serving workload promises; `None` promises nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Slo {
    pub ttft_p99_s: Option<f64>,
}

/// One candidate priced per million tokens, and whether it meets the SLO.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    #[serde(flatten)]
    pub measured: Measured,
    /// `None` where the bench served no tokens of that kind.
    pub per_1m_output_tokens: Option<Money>,
    pub per_1m_tokens: Option<Money>,
    /// Why it misses the SLO; `None` when it meets it.
    pub refused: Option<String>,
}

/// The candidates cheapest first (per 1M output tokens), and the cheapest that meets the SLO.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RightSizing {
    pub slo: Slo,
    pub candidates: Vec<Candidate>,
    pub recommended: Option<String>,
}

/// What serving one million tokens costs at `tokens_per_s`: the hour's price over the
/// hour's tokens, exact for the whole tokens an hour holds.
pub fn per_million_tokens(rate: HourlyRate, tokens_per_s: f64) -> Option<Money> {
    let per_hour = (tokens_per_s * 3600.0).round();
    if !(per_hour.is_finite() && per_hour >= 1.0) {
        return None;
    }
    rate.0.mul_div(1_000_000, per_hour as i128)
}

/// Prices each candidate per million tokens and recommends the cheapest that meets `slo`.
/// Ranked on output tokens: decoding is what an instance's capacity is spent on, while
/// prompt lengths are the bench's choice.
pub fn right_size(candidates: &[Measured], slo: Slo) -> RightSizing {
    let mut priced: Vec<Candidate> = candidates
        .iter()
        .map(|m| Candidate {
            measured: m.clone(),
            per_1m_output_tokens: per_million_tokens(m.rate, m.output_tokens_per_s),
            per_1m_tokens: per_million_tokens(m.rate, m.total_tokens_per_s),
            refused: refusal(m, slo),
        })
        .collect();
    // Unpriceable ones (no tokens served) last.
    priced.sort_by_key(|c| (c.per_1m_output_tokens.is_none(), c.per_1m_output_tokens));
    let recommended = priced
        .iter()
        .find(|c| c.refused.is_none() && c.per_1m_output_tokens.is_some())
        .map(|c| c.measured.instance_type.clone());
    RightSizing {
        slo,
        candidates: priced,
        recommended,
    }
}

fn refusal(m: &Measured, slo: Slo) -> Option<String> {
    if m.output_tokens_per_s <= 0.0 {
        return Some("the bench served no output tokens".into());
    }
    let limit = slo.ttft_p99_s?;
    match m.ttft_p99_s {
        None => Some(
            "the bench measured no time to first token (only streamed requests have one)".into(),
        ),
        Some(p99) if p99 > limit => Some(format!(
            "TTFT p99 {:.0} ms is above the SLO's {:.0} ms",
            p99 * 1000.0,
            limit * 1000.0
        )),
        Some(_) => None,
    }
}

/// How a pool scales to zero: its replica's cold start, how long an idle replica stays up,
/// and the share of requests allowed to wait for a start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ZeroPolicy {
    pub cold_start: ColdStart,
    pub grace: Duration,
    pub max_waiting_share: f64,
}

impl ZeroPolicy {
    pub fn new(cold_start: ColdStart, grace: Duration) -> ZeroPolicy {
        ZeroPolicy {
            cold_start,
            grace,
            max_waiting_share: DEFAULT_MAX_WAITING_SHARE,
        }
    }
}

/// Scale to zero replayed on a workload's arrivals, against one replica always on over the
/// same span (first arrival to last).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ZeroPlan {
    pub requests: usize,
    pub span_hours: f64,
    pub cold_start_s: f64,
    /// The replica starts in the ledger the cold start is the median of; zero where given.
    pub measured_cold_starts: u64,
    pub grace_s: f64,
    pub always_on_hours: f64,
    pub scaled_hours: f64,
    pub saved_hours: f64,
    pub always_on_cost: Money,
    pub saved: Money,
    pub cold_starts: usize,
    /// Requests that arrive while a replica is starting, and how long they wait.
    pub waiting_requests: usize,
    pub waiting_share: Option<f64>,
    pub mean_wait_s: Option<f64>,
    pub max_wait_s: f64,
    pub max_waiting_share: f64,
    pub pays: bool,
    pub verdict: String,
}

/// Replays `arrivals_ms` (any order) on one replica that stays up `policy.grace` after the
/// last request it served and takes `policy.cold_start` to come back. The span opens with
/// the replica up, as the always-on one is. Each gap longer than the grace saves the part
/// past the grace and makes the next request wait the cold start; requests that arrive
/// while the replica is still starting wait the rest of it.
pub fn scale_to_zero(arrivals_ms: &[Millis], policy: &ZeroPolicy, rate: HourlyRate) -> ZeroPlan {
    let mut arrivals = arrivals_ms.to_vec();
    arrivals.sort_unstable();
    let ms = |d: Duration| Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX);
    let (cold, grace) = (ms(policy.cold_start.duration), ms(policy.grace));
    let span_ms = match (arrivals.first(), arrivals.last()) {
        (Some(first), Some(last)) => last - first,
        _ => 0,
    };
    let (mut down_ms, mut cold_starts, mut waiting, mut wait_ms, mut max_wait_ms) = (0, 0, 0, 0, 0);
    let mut ready_at = arrivals.first().copied().unwrap_or(0);
    let mut last_served = ready_at;
    for &t in arrivals.iter().skip(1) {
        let down_at = last_served.saturating_add(grace);
        if t > down_at {
            down_ms += t - down_at;
            cold_starts += 1;
            ready_at = t.saturating_add(cold);
        }
        if t < ready_at {
            waiting += 1;
            wait_ms += ready_at - t;
            max_wait_ms = max_wait_ms.max(ready_at - t);
        }
        last_served = t.max(ready_at);
    }
    let hours = |ms: Millis| ms as f64 / HOUR_MS as f64;
    let cost = |ms: Millis| rate.cost(ms, 1).unwrap_or(Money::from_nanos(i64::MAX));
    let saved = cost(down_ms);
    let waiting_share = (!arrivals.is_empty()).then(|| waiting as f64 / arrivals.len() as f64);
    let (pays, verdict) = verdict(arrivals.len(), saved, waiting_share, policy);
    ZeroPlan {
        requests: arrivals.len(),
        span_hours: hours(span_ms),
        cold_start_s: policy.cold_start.duration.as_secs_f64(),
        measured_cold_starts: policy.cold_start.measured_starts,
        grace_s: policy.grace.as_secs_f64(),
        always_on_hours: hours(span_ms),
        scaled_hours: hours(span_ms - down_ms),
        saved_hours: hours(down_ms),
        always_on_cost: cost(span_ms),
        saved,
        cold_starts,
        waiting_requests: waiting,
        waiting_share,
        mean_wait_s: (waiting > 0).then(|| wait_ms as f64 / 1000.0 / waiting as f64),
        max_wait_s: max_wait_ms as f64 / 1000.0,
        max_waiting_share: policy.max_waiting_share,
        pays,
        verdict,
    }
}

fn verdict(
    requests: usize,
    saved: Money,
    waiting_share: Option<f64>,
    policy: &ZeroPolicy,
) -> (bool, String) {
    let limit = policy.max_waiting_share;
    match waiting_share {
        _ if requests < 2 => (false, "too few requests to have gaps".into()),
        _ if saved <= Money::ZERO => (
            false,
            "does not pay: no gap outlasts the grace, so the replica never goes".into(),
        ),
        Some(share) if share >= limit => (
            false,
            format!(
                "does not pay: {:.1}% of requests would wait for a cold start, the limit is {:.1}%",
                share * 100.0,
                limit * 100.0
            ),
        ),
        _ => (
            true,
            format!(
                "pays: saves {saved} and fewer than {:.1}% of requests wait",
                limit * 100.0
            ),
        ),
    }
}

/// When each request of `workload` arrived, from the ledger: one arrival per inference
/// event, as `frugal serve` writes one per request; oldest first.
pub fn ledger_arrivals(
    ledger: &Ledger,
    workload: &str,
    window: Window,
) -> Result<Vec<Millis>, LedgerError> {
    let names = ledger.names()?;
    let mut arrivals = Vec::new();
    ledger.scan(window, |row| {
        if row.kind == Kind::Inference && names.get(row.workload) == workload {
            arrivals.push(row.ts_ms);
        }
    })?;
    arrivals.sort_unstable();
    Ok(arrivals)
}

/// A replica's start where neither the caller nor the ledger says: a model server pulling
/// its image and loading a few GB of weights.
pub const DEFAULT_COLD_START: Duration = Duration::from_secs(30);

/// Scale to zero replayed on the ledger's arrivals of `workload` at `rate` ([`ZeroPolicy`]'s
/// `grace` and `max_waiting_share`): the cold start `cold_start` where given, else the median
/// of the ledger's, else [`DEFAULT_COLD_START`].
/// `None` when the ledger holds no request of the workload.
pub fn ledger_scale_to_zero(
    ledger: &Ledger,
    workload: &str,
    cold_start: Option<Duration>,
    grace: Duration,
    max_waiting_share: f64,
    rate: HourlyRate,
) -> Result<Option<ZeroPlan>, LedgerError> {
    let arrivals = ledger_arrivals(ledger, workload, Window::default())?;
    if arrivals.is_empty() {
        return Ok(None);
    }
    let cold_start = match cold_start {
        Some(d) => ColdStart::given(d),
        None => ledger_cold_start(ledger, workload, DEFAULT_COLD_START)?,
    };
    let policy = ZeroPolicy {
        max_waiting_share,
        ..ZeroPolicy::new(cold_start, grace)
    };
    Ok(Some(scale_to_zero(&arrivals, &policy, rate)))
}

/// A cold start and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColdStart {
    pub duration: Duration,
    /// The replica starts it is the median of; zero when it is the caller's default.
    pub measured_starts: u64,
}

impl ColdStart {
    pub fn given(duration: Duration) -> ColdStart {
        ColdStart {
            duration,
            measured_starts: 0,
        }
    }
}

/// The median of `workload`'s replicas' starts in the ledger (its `starting` spans), else
/// `default`. Failed starts never served, so they are left out.
pub fn ledger_cold_start(
    ledger: &Ledger,
    workload: &str,
    default: Duration,
) -> Result<ColdStart, LedgerError> {
    let mut starts = Vec::new();
    ledger.spans(Window::default(), |s| {
        if s.state == ReplicaState::Starting && !s.failed && s.workload == workload {
            starts.push(s.duration_ms.max(0).unsigned_abs());
        }
    })?;
    starts.sort_unstable();
    let n = starts.len();
    let median_ms = match n {
        0 => return Ok(ColdStart::given(default)),
        _ if n % 2 == 1 => starts[n / 2],
        _ => (starts[n / 2 - 1] + starts[n / 2]) / 2,
    };
    Ok(ColdStart {
        duration: Duration::from_millis(median_ms),
        measured_starts: n as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, ReplicaSpan};

    fn rate(dollars: &str) -> HourlyRate {
        HourlyRate(dollars.parse().unwrap())
    }

    fn measured(name: &str, dollars: &str, tokens_per_s: f64, ttft: Option<f64>) -> Measured {
        Measured {
            instance_type: name.into(),
            rate: rate(dollars),
            output_tokens_per_s: tokens_per_s,
            total_tokens_per_s: tokens_per_s * 2.0,
            ttft_p99_s: ttft,
            latency_p99_s: None,
        }
    }

    #[test]
    fn a_million_tokens_cost_the_hours_they_take() {
        // $1.006/h at 1,000 tokens/s: 3.6M tokens an hour, $0.279444... per 1M.
        assert_eq!(
            per_million_tokens(rate("1.006"), 1000.0),
            Some("0.279444444".parse().unwrap())
        );
        // $3.60/h at 100 tokens/s: 360,000 an hour, $10 per 1M exactly.
        assert_eq!(
            per_million_tokens(rate("3.6"), 100.0),
            Some(Money::from_cents(1000))
        );
        assert_eq!(per_million_tokens(rate("1"), 0.0), None);
    }

    #[test]
    fn the_cheapest_per_token_that_meets_the_slo_is_recommended() {
        let candidates = [
            // $2/h at 1,000/s: $0.5556 per 1M, cheapest, but its TTFT p99 is 0.8 s.
            measured("fast-but-late", "2", 1000.0, Some(0.8)),
            // $1/h at 250/s: $1.1111 per 1M, meets 0.5 s.
            measured("small", "1", 250.0, Some(0.3)),
            // $3.6/h at 100/s: $10 per 1M.
            measured("big", "3.6", 100.0, Some(0.1)),
            measured("unstreamed", "0.5", 1000.0, None),
        ];
        let slo = Slo {
            ttft_p99_s: Some(0.5),
        };
        let s = right_size(&candidates, slo);
        assert_eq!(s.recommended.as_deref(), Some("small"));
        let order: Vec<_> = s
            .candidates
            .iter()
            .map(|c| c.measured.instance_type.as_str())
            .collect();
        assert_eq!(order, ["unstreamed", "fast-but-late", "small", "big"]);
        assert_eq!(
            s.candidates[1].refused.as_deref(),
            Some("TTFT p99 800 ms is above the SLO's 500 ms")
        );
        assert!(
            s.candidates[0]
                .refused
                .as_ref()
                .unwrap()
                .contains("no time to first")
        );
        assert_eq!(
            s.candidates[2].per_1m_output_tokens,
            Some("1.111111111".parse().unwrap())
        );
        assert_eq!(
            s.candidates[2].per_1m_tokens,
            Some("0.555555556".parse().unwrap())
        );
        // Without an SLO the cheapest wins, measured TTFT or not.
        let free = right_size(&candidates, Slo::default());
        assert_eq!(free.recommended.as_deref(), Some("unstreamed"));
        assert!(right_size(&candidates[..1], slo).recommended.is_none());
    }

    #[test]
    fn bench_json_is_read_and_empty_percentiles_are_unmeasured() {
        let json = r#"{"requests": 10, "errors": 0, "wall_s": 2.0, "prompt_tokens": 600,
            "output_tokens": 400, "requests_per_s": 5.0, "output_tokens_per_s": 200.0,
            "ttft": {"p50": 0.1, "p90": 0.2, "p99": 0.25, "mean": 0.12},
            "tpot": {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0},
            "latency": {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0}, "cost": 0}"#;
        let m = Measured::from_bench_json("g5.xlarge", rate("1"), json).unwrap();
        assert_eq!(m.output_tokens_per_s, 200.0);
        assert_eq!(m.total_tokens_per_s, 500.0);
        assert_eq!(m.ttft_p99_s, Some(0.25));
        assert_eq!(m.latency_p99_s, None);
        let failed = json.replace(r#""errors": 0"#, r#""errors": 10"#);
        assert!(matches!(
            Measured::from_bench_json("g5.xlarge", rate("1"), &failed),
            Err(SizeError::NothingMeasured { errors: 10 })
        ));
        assert!(Measured::from_bench_json("g5.xlarge", rate("1"), "{}").is_err());
    }

    const MIN: Millis = 60_000;

    #[test]
    fn gaps_past_the_grace_are_saved_and_each_costs_a_cold_start() {
        // Grace 5 min, cold start 30 s, $3.60/h. Arrivals at 0, 2, 30, 30.25, 100 min:
        // the 28-minute gap saves 23 min and starts a replica at 30 min (ready at 30.5),
        // so the requests at 30 and 30.25 wait 30 s and 15 s; the 69.75-minute gap from
        // 30.25 (served at 30.5) saves 100 - 35.5 = 64.5 min and makes 100 wait 30 s.
        let arrivals = [100 * MIN, 0, 2 * MIN, 30 * MIN, 30 * MIN + 15_000];
        let policy = ZeroPolicy::new(
            ColdStart::given(Duration::from_secs(30)),
            Duration::from_secs(300),
        );
        let z = scale_to_zero(&arrivals, &policy, rate("3.6"));
        assert_eq!(z.requests, 5);
        assert_eq!(z.cold_starts, 2);
        assert_eq!(z.span_hours, 100.0 / 60.0);
        assert!((z.saved_hours - 87.5 / 60.0).abs() < 1e-12);
        // 87.5 min at $3.60/h = $5.25; the span costs $6.
        assert_eq!(z.saved, Money::from_cents(525));
        assert_eq!(z.always_on_cost, Money::from_cents(600));
        assert_eq!(z.waiting_requests, 3);
        assert_eq!(z.waiting_share, Some(0.6));
        assert_eq!(z.mean_wait_s, Some(25.0));
        assert_eq!(z.max_wait_s, 30.0);
        assert!(!z.pays, "60% wait");
        assert!(z.verdict.contains("60.0% of requests"), "{}", z.verdict);
        // Allowed to make most wait, it pays.
        let lenient = ZeroPolicy {
            max_waiting_share: 0.75,
            ..policy
        };
        assert!(scale_to_zero(&arrivals, &lenient, rate("3.6")).pays);
    }

    #[test]
    fn busy_traffic_never_scales_to_zero_and_sparse_traffic_pays() {
        let policy = ZeroPolicy::new(
            ColdStart::given(Duration::from_secs(30)),
            Duration::from_secs(300),
        );
        let busy: Vec<Millis> = (0..100).map(|i| i * MIN).collect();
        let z = scale_to_zero(&busy, &policy, rate("1"));
        assert_eq!((z.cold_starts, z.saved), (0, Money::ZERO));
        assert!(!z.pays);
        // 100 requests a minute apart, then an hour's gap, then one more: one cold start,
        // one request in 101 waits, 55 minutes saved at $1/h.
        let mut sparse = busy;
        sparse.push(99 * MIN + 60 * MIN);
        let z = scale_to_zero(&sparse, &policy, rate("1"));
        assert_eq!(z.cold_starts, 1);
        assert_eq!(z.saved, "0.916666667".parse().unwrap());
        assert!(z.pays, "{}", z.verdict);
        assert!(!scale_to_zero(&[5], &policy, rate("1")).pays);
        assert_eq!(scale_to_zero(&[], &policy, rate("1")).waiting_share, None);
    }

    #[test]
    fn arrivals_and_the_median_cold_start_come_from_the_ledger() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(dir.path().join("l.sqlite")).unwrap();
        let event = |ts: Millis, kind: Kind, workload: &str| {
            Event::new(ts, kind, workload, Money::from_cents(1))
        };
        let span = |ts: Millis, secs: i64, state: ReplicaState, failed: bool| ReplicaSpan {
            id: None,
            ts_ms: ts,
            duration_ms: secs * 1000,
            workload: "chat".into(),
            pool: "qwen".into(),
            replica: 1,
            state,
            busy_ms: 0,
            cost: Money::from_cents(1),
            instance_type: None,
            min_replicas: 0,
            max_replicas: 2,
            need_bytes: None,
            failed,
            server: None,
            requests: 0,
            input_tokens: 0,
            output_tokens: 0,
        };
        let t0 = 1_792_998_000_000;
        ledger
            .append_with_spans(
                "test",
                &[
                    event(t0 + 5 * MIN, Kind::Inference, "chat"),
                    event(t0, Kind::Inference, "chat"),
                    event(t0, Kind::Idle, "chat"),
                    event(t0, Kind::Inference, "other"),
                ],
                &[
                    span(t0, 20, ReplicaState::Starting, false),
                    span(t0, 40, ReplicaState::Starting, false),
                    span(t0, 600, ReplicaState::Starting, true),
                    span(t0, 900, ReplicaState::Ready, false),
                ],
            )
            .unwrap();
        assert_eq!(
            ledger_arrivals(&ledger, "chat", Window::default()).unwrap(),
            [t0, t0 + 5 * MIN]
        );
        let fallback = Duration::from_secs(30);
        assert_eq!(
            ledger_cold_start(&ledger, "chat", fallback).unwrap(),
            ColdStart {
                duration: Duration::from_secs(30),
                measured_starts: 2
            }
        );
        assert_eq!(
            ledger_cold_start(&ledger, "other", Duration::from_secs(7)).unwrap(),
            ColdStart::given(Duration::from_secs(7))
        );
    }
}
