//! The work done between two readings, and the ledger events that bill it.
//!
//! Counters only ever grow while a server lives, so the difference of two readings is the
//! work between them; a counter that went backwards means the server restarted, and what
//! it counts now was counted from zero. Anything that makes the difference meaningless (a
//! counter gone, a clock that went back, a kind that changed) is a [`Gap`]: the interval
//! is not billed rather than billed wrong.

use frugal_cost::event::{
    Capacity, Event, Kind as EventKind, ReplicaSpan, ReplicaState, derived_id,
};
use frugal_cost::money::{HourlyRate, Millis};

use crate::reading::Reading;

/// A reading and when it was taken.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// Milliseconds since the Unix epoch.
    pub at_ms: Millis,
    pub reading: Reading,
}

/// Why two readings give no interval.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Gap {
    #[error("the clock went backwards or stood still ({from_ms} ms, then {to_ms} ms)")]
    Clock { from_ms: Millis, to_ms: Millis },
    #[error("the counter `{0}` vanished between two scrapes")]
    Vanished(&'static str),
    #[error("the counter `{counter}` is not a count ({value})")]
    NotACount { counter: &'static str, value: f64 },
    #[error("the target changed from {from} to {to}")]
    KindChanged {
        from: &'static str,
        to: &'static str,
    },
}

/// The work between two snapshots.
#[derive(Debug, Clone, PartialEq)]
pub struct Interval {
    pub duration_ms: Millis,
    pub seconds: f64,
    pub requests: u64,
    /// Whether the server counts requests at all (llama.cpp does not): 0 is then a count.
    pub counts_requests: bool,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The share of the interval the capacity was busy, in [0, 1], where it can be told.
    pub busy_share: Option<f64>,
    /// The most GPU memory held at either end, where DCGM said.
    pub gpu_mem_used_bytes: Option<f64>,
    /// The server restarted within the interval: counts are from zero at the restart.
    pub reset: bool,
    /// The model, where the later reading names it.
    pub model: Option<String>,
}

impl Interval {
    pub fn between(prev: &Snapshot, next: &Snapshot) -> Result<Interval, Gap> {
        let (a, b) = (&prev.reading, &next.reading);
        if a.kind != b.kind {
            return Err(Gap::KindChanged {
                from: a.kind.as_str(),
                to: b.kind.as_str(),
            });
        }
        if next.at_ms <= prev.at_ms {
            return Err(Gap::Clock {
                from_ms: prev.at_ms,
                to_ms: next.at_ms,
            });
        }
        let counters = [
            ("requests", a.requests_total, b.requests_total),
            (
                "prompt_tokens",
                a.prompt_tokens_total,
                b.prompt_tokens_total,
            ),
            (
                "generation_tokens",
                a.generation_tokens_total,
                b.generation_tokens_total,
            ),
        ];
        for (name, before, after) in counters {
            for v in [before, after].into_iter().flatten() {
                if !v.is_finite() || v < 0.0 {
                    return Err(Gap::NotACount {
                        counter: name,
                        value: v,
                    });
                }
            }
            if before.is_some() && after.is_none() {
                return Err(Gap::Vanished(name));
            }
        }
        // A restart zeroes every counter at once, so one that went back means all
        // restarted: one that has since passed its old value must not be differenced.
        let reset = counters
            .iter()
            .any(|(_, before, after)| matches!((before, after), (Some(x), Some(y)) if y < x));
        // A counter that appears (a series created on first use) counted from zero.
        let delta = |before: Option<f64>, after: Option<f64>| -> u64 {
            let after = after.unwrap_or(0.0);
            let d = if reset {
                after
            } else {
                after - before.unwrap_or(0.0)
            };
            d.max(0.0).round() as u64
        };
        let duration_ms = next.at_ms - prev.at_ms;
        Ok(Interval {
            duration_ms,
            seconds: duration_ms as f64 / 1000.0,
            requests: delta(a.requests_total, b.requests_total),
            counts_requests: b.requests_total.is_some(),
            input_tokens: delta(a.prompt_tokens_total, b.prompt_tokens_total),
            output_tokens: delta(a.generation_tokens_total, b.generation_tokens_total),
            busy_share: busy_share(a, b, duration_ms, reset),
            gpu_mem_used_bytes: match (a.gpu_mem_used_bytes, b.gpu_mem_used_bytes) {
                (Some(x), Some(y)) => Some(x.max(y)),
                (x, y) => x.or(y),
            },
            reset,
            model: b.model.clone().or_else(|| a.model.clone()),
        })
    }
}

/// The busy share, from the best source the readings have:
/// 1. GPU utilization (the mean of both ends, or the one end that has it): the device's
///    own count, which sees work from any process;
/// 2. the engine's busy-seconds counter, differenced over the interval (from zero after a
///    restart): exact for engines that run one batch at a time;
/// 3. the share of the two ends with work running: 0, ½ or 1. Two samples cannot see what
///    happened between them, but a sample at a time the load does not know of is busy with
///    the probability the server is, so over many intervals the shares average to the duty
///    cycle; each one sharpens as scrapes come closer together.
fn busy_share(a: &Reading, b: &Reading, duration_ms: Millis, reset: bool) -> Option<f64> {
    let util = match (a.gpu_util, b.gpu_util) {
        (Some(x), Some(y)) => Some((x + y) / 2.0),
        (x, y) => x.or(y),
    };
    if let Some(u) = util.filter(|u| u.is_finite()) {
        return Some(u.clamp(0.0, 1.0));
    }
    if let (Some(before), Some(after)) = (a.busy_seconds_total, b.busy_seconds_total) {
        let busy = if reset || after < before {
            after
        } else {
            after - before
        };
        if busy.is_finite() {
            return Some((busy * 1000.0 / duration_ms as f64).clamp(0.0, 1.0));
        }
    }
    let ends = [a.running, b.running];
    let seen = ends.iter().flatten().filter(|r| r.is_finite()).count();
    let busy = ends.iter().flatten().filter(|r| **r > 0.0).count();
    (seen > 0).then(|| busy as f64 / seen as f64)
}

/// What a watched target is, for the rows it writes to the ledger.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetMeta {
    /// The target's name in the config (the scrape URL's owner).
    pub name: String,
    pub workload: String,
    /// The model, where the config names it; else the one the server reports.
    pub model: Option<String>,
    pub instance_type: Option<String>,
    pub region: Option<String>,
    pub capacity: Option<Capacity>,
}

/// Why an interval cannot be priced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the cost of {duration_ms} ms at the target's rate does not fit in the ledger")]
pub struct Overflow {
    pub duration_ms: Millis,
}

/// What one interval writes to the ledger: its money as events, its shape as a span.
#[derive(Debug, Clone, PartialEq)]
pub struct Bill {
    pub events: Vec<Event>,
    /// The interval as a span of the server (busy time, requests, tokens, GPU memory), for
    /// the report's table of watched servers; its cost repeats the events', not adds to it.
    pub span: ReplicaSpan,
}

/// The ledger rows for one interval: its work as an inference event, at the busy share of
/// the interval's cost, and the rest as an idle event. The two costs sum to exactly the
/// interval's cost: the idle part is what the busy part leaves, not a second rounding.
///
/// The inference event's utilization is 1 (it pays only for busy time) so the report
/// counts the waste once, in the idle event. Without a busy share the whole interval is
/// the inference event's, with no utilization.
pub fn bill(
    target: &TargetMeta,
    rate: HourlyRate,
    start_ms: Millis,
    interval: &Interval,
) -> Result<Bill, Overflow> {
    let total = rate.cost(interval.duration_ms, 1).ok_or(Overflow {
        duration_ms: interval.duration_ms,
    })?;
    let busy = match interval.busy_share {
        Some(share) => total.scale(share.clamp(0.0, 1.0)),
        None => total,
    };
    let model = target.model.clone().or_else(|| interval.model.clone());
    // A server's intervals chain (each starts at the reading the last one ended on), so its
    // name and the start tell a row apart: an interval billed again after a crash before
    // the state was saved has the same start, and the ledger stores it once (the time from
    // the crash to the next reading is then not billed, as a gap is not).
    let id = |row: &str| {
        derived_id(
            "frugal watch",
            &[
                target.name.as_bytes(),
                &start_ms.to_le_bytes(),
                row.as_bytes(),
            ],
        )
    };
    let row = |kind: EventKind, cost| {
        let mut e = Event::new(start_ms, kind, target.workload.clone(), cost);
        e.id = Some(id(kind.as_str()));
        e.duration_ms = interval.duration_ms;
        e.model = model.clone();
        e.instance_type = target.instance_type.clone();
        e.region = target.region.clone();
        e.capacity = target.capacity;
        e
    };
    let mut work = row(EventKind::Inference, busy);
    work.requests = interval.requests;
    work.input_tokens = interval.input_tokens;
    work.output_tokens = interval.output_tokens;
    let share = interval.busy_share.map_or(1.0, |s| s.clamp(0.0, 1.0));
    let span = ReplicaSpan {
        id: Some(id("span")),
        ts_ms: start_ms,
        duration_ms: interval.duration_ms,
        workload: target.workload.clone(),
        pool: model.clone().unwrap_or_else(|| target.name.clone()),
        replica: 1,
        state: ReplicaState::Ready,
        busy_ms: (interval.duration_ms as f64 * share).round() as Millis,
        cost: total,
        instance_type: target.instance_type.clone(),
        min_replicas: 1,
        max_replicas: 1,
        need_bytes: interval.gpu_mem_used_bytes.map(|b| b.max(0.0) as u64),
        failed: false,
        server: Some(target.name.clone()),
        requests: interval.requests,
        input_tokens: interval.input_tokens,
        output_tokens: interval.output_tokens,
    };
    let Some(_) = interval.busy_share else {
        return Ok(Bill {
            events: vec![work],
            span,
        });
    };
    work.utilization = Some(1.0);
    let mut idle = row(EventKind::Idle, total - busy);
    idle.utilization = Some(0.0);
    Ok(Bill {
        events: vec![work, idle],
        span,
    })
}

#[cfg(test)]
mod tests {
    use frugal_cost::Money;

    use crate::reading::Kind;

    use super::*;

    fn reading(req: f64, prompt: f64, generated: f64, running: f64) -> Reading {
        Reading {
            kind: Kind::Vllm,
            requests_total: Some(req),
            prompt_tokens_total: Some(prompt),
            generation_tokens_total: Some(generated),
            running: Some(running),
            waiting: Some(0.0),
            busy_seconds_total: None,
            gpu_util: None,
            gpu_mem_used_bytes: None,
            model: Some("m".into()),
            hostname: None,
        }
    }

    fn snap(at_ms: Millis, reading: Reading) -> Snapshot {
        Snapshot { at_ms, reading }
    }

    #[test]
    fn deltas_of_growing_counters() {
        let i = Interval::between(
            &snap(1_000, reading(10.0, 100.0, 50.0, 0.0)),
            &snap(61_000, reading(15.0, 400.0, 90.0, 2.0)),
        )
        .unwrap();
        assert_eq!(i.duration_ms, 60_000);
        assert_eq!(i.seconds, 60.0);
        assert_eq!((i.requests, i.input_tokens, i.output_tokens), (5, 300, 40));
        assert_eq!(i.busy_share, Some(0.5));
        assert!(!i.reset);
        assert_eq!(i.model.as_deref(), Some("m"));
    }

    #[test]
    fn a_restart_counts_from_zero_for_every_counter() {
        // Requests went back; prompt tokens already passed their old value.
        let i = Interval::between(
            &snap(0, reading(100.0, 1_000.0, 500.0, 1.0)),
            &snap(10_000, reading(3.0, 1_200.0, 20.0, 1.0)),
        )
        .unwrap();
        assert!(i.reset);
        assert_eq!(
            (i.requests, i.input_tokens, i.output_tokens),
            (3, 1_200, 20)
        );
        assert_eq!(i.busy_share, Some(1.0));
    }

    #[test]
    fn gaps_are_errors_never_bills() {
        let a = snap(5_000, reading(1.0, 1.0, 1.0, 0.0));
        let same = Interval::between(&a, &snap(5_000, reading(2.0, 2.0, 2.0, 0.0)));
        assert_eq!(
            same,
            Err(Gap::Clock {
                from_ms: 5_000,
                to_ms: 5_000
            })
        );
        let back = Interval::between(&a, &snap(4_000, reading(2.0, 2.0, 2.0, 0.0)));
        assert!(matches!(back, Err(Gap::Clock { .. })));
        let mut gone = reading(2.0, 2.0, 2.0, 0.0);
        gone.generation_tokens_total = None;
        assert_eq!(
            Interval::between(&a, &snap(6_000, gone)),
            Err(Gap::Vanished("generation_tokens"))
        );
        let mut nan = reading(2.0, 2.0, 2.0, 0.0);
        nan.requests_total = Some(f64::NAN);
        assert!(matches!(
            Interval::between(&a, &snap(6_000, nan)),
            Err(Gap::NotACount {
                counter: "requests",
                ..
            })
        ));
        let mut other = reading(2.0, 2.0, 2.0, 0.0);
        other.kind = Kind::Tgi;
        assert_eq!(
            Interval::between(&a, &snap(6_000, other))
                .unwrap_err()
                .to_string(),
            "the target changed from vllm to tgi"
        );
    }

    #[test]
    fn a_counter_that_appears_counts_from_zero() {
        let mut before = reading(0.0, 0.0, 0.0, 0.0);
        before.requests_total = None;
        let i =
            Interval::between(&snap(0, before), &snap(1_000, reading(4.0, 9.0, 9.0, 0.0))).unwrap();
        assert_eq!((i.requests, i.reset), (4, false));
        assert_eq!(i.busy_share, Some(0.0));
    }

    #[test]
    fn busy_share_prefers_gpu_utilization() {
        let mut a = reading(0.0, 0.0, 0.0, 0.0);
        let mut b = reading(0.0, 0.0, 0.0, 0.0);
        a.gpu_util = Some(0.2);
        b.gpu_util = Some(0.6);
        let i = Interval::between(&snap(0, a.clone()), &snap(1, b)).unwrap();
        assert!((i.busy_share.unwrap_or_default() - 0.4).abs() < 1e-12);
        let mut none = reading(0.0, 0.0, 0.0, 0.0);
        none.running = None;
        a.gpu_util = None;
        a.running = None;
        let i = Interval::between(&snap(0, a), &snap(1, none)).unwrap();
        assert_eq!(i.busy_share, None);
    }

    #[test]
    fn busy_share_from_a_busy_counter_before_running_samples() {
        let (mut a, mut b) = (reading(0.0, 0.0, 0.0, 0.0), reading(1.0, 1.0, 1.0, 0.0));
        (a.busy_seconds_total, b.busy_seconds_total) = (Some(10.0), Some(25.0));
        let i = Interval::between(&snap(0, a.clone()), &snap(30_000, b.clone())).unwrap();
        assert_eq!(
            i.busy_share,
            Some(0.5),
            "15 s busy of 30, though neither end ran"
        );
        // After a restart the counter counts from zero: 4 s of 8.
        let mut restarted = reading(0.5, 0.5, 0.5, 1.0);
        restarted.busy_seconds_total = Some(4.0);
        let i = Interval::between(&snap(0, b.clone()), &snap(8_000, restarted)).unwrap();
        assert_eq!((i.reset, i.busy_share), (true, Some(0.5)));
        // A counter over the interval (clock skew, several engines) is full, not more.
        b.busy_seconds_total = Some(100.0);
        let i = Interval::between(&snap(0, a.clone()), &snap(30_000, b.clone())).unwrap();
        assert_eq!(i.busy_share, Some(1.0));
        // One end without it: the running samples.
        b.busy_seconds_total = None;
        let i = Interval::between(&snap(0, a), &snap(30_000, b)).unwrap();
        assert_eq!(i.busy_share, Some(0.0));
    }

    fn target() -> TargetMeta {
        TargetMeta {
            name: "vllm-1".into(),
            workload: "chat".into(),
            model: None,
            instance_type: Some("g6.xlarge".into()),
            region: Some("us-east-1".into()),
            capacity: Some(Capacity::OnDemand),
        }
    }

    fn interval(ms: Millis, busy: Option<f64>) -> Interval {
        Interval {
            duration_ms: ms,
            seconds: ms as f64 / 1000.0,
            requests: 12,
            counts_requests: true,
            input_tokens: 3_000,
            output_tokens: 800,
            busy_share: busy,
            gpu_mem_used_bytes: Some(5e9),
            reset: false,
            model: Some("m".into()),
        }
    }

    #[test]
    fn busy_and_idle_costs_sum_exactly_to_the_interval() {
        let rate = HourlyRate("0.8048".parse::<Money>().unwrap());
        for (ms, share) in [
            (15_000, 1.0 / 3.0),
            (7_001, 0.123456789),
            (60_000, 0.0),
            (1, 1.0),
        ] {
            let i = interval(ms, Some(share));
            let Bill { events: ev, span } = bill(&target(), rate, 42, &i).unwrap();
            assert_eq!(ev.len(), 2);
            let (work, idle) = (&ev[0], &ev[1]);
            assert_eq!(work.cost + idle.cost, rate.cost(ms, 1).unwrap());
            assert_eq!(work.kind, EventKind::Inference);
            assert_eq!(idle.kind, EventKind::Idle);
            assert_eq!((work.ts_ms, work.duration_ms), (42, ms));
            assert_eq!(
                (work.requests, work.input_tokens, work.output_tokens),
                (12, 3_000, 800)
            );
            assert_eq!((idle.requests, idle.input_tokens), (0, 0));
            assert_eq!(work.model.as_deref(), Some("m"));
            assert_eq!(idle.region.as_deref(), Some("us-east-1"));
            // Waste is counted once: the idle row, all of it.
            assert_eq!(work.waste() + idle.waste(), idle.cost);
            // The span repeats the interval's whole cost, its busy part as time.
            assert_eq!((span.cost, span.duration_ms), (work.cost + idle.cost, ms));
            assert_eq!(span.busy_ms, (ms as f64 * share).round() as Millis);
            assert_eq!(span.server.as_deref(), Some("vllm-1"));
            assert_eq!((span.pool.as_str(), span.requests), ("m", 12));
            assert_eq!(
                (span.need_bytes, span.output_tokens),
                (Some(5_000_000_000), 800)
            );
        }
        // An hour at $0.8048, a quarter busy.
        let ev = bill(&target(), rate, 0, &interval(3_600_000, Some(0.25)))
            .unwrap()
            .events;
        assert_eq!(ev[0].cost, "0.2012".parse::<Money>().unwrap());
        assert_eq!(ev[1].cost, "0.6036".parse::<Money>().unwrap());
    }

    #[test]
    fn without_a_busy_share_the_whole_interval_is_inference() {
        let rate = HourlyRate(Money::from_cents(360));
        let mut t = target();
        t.model = Some("configured".into());
        let Bill { events: ev, span } = bill(&t, rate, 0, &interval(60_000, None)).unwrap();
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].cost, Money::from_cents(6));
        assert_eq!(ev[0].utilization, None);
        assert_eq!(ev[0].model.as_deref(), Some("configured"));
        assert_eq!((span.pool.as_str(), span.busy_ms), ("configured", 60_000));
    }

    /// Issue 31: an interval billed, then billed again after a crash left the state file
    /// unsaved (the same start, a later end), is stored once: its events and its span.
    #[test]
    fn an_interval_billed_twice_is_stored_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = frugal_cost::Ledger::open(dir.path().join("l.sqlite")).unwrap();
        let rate = HourlyRate(Money::from_cents(360));
        let billed = bill(&target(), rate, 42, &interval(60_000, Some(0.5))).unwrap();
        let again = bill(&target(), rate, 42, &interval(90_000, Some(0.25))).unwrap();
        let next = bill(&target(), rate, 60_042, &interval(60_000, Some(0.5))).unwrap();
        let mut other = target();
        other.name = "vllm-2".into();
        let elsewhere = bill(&other, rate, 42, &interval(60_000, Some(0.5))).unwrap();
        let stored: Vec<u64> = [&billed, &again, &next, &elsewhere]
            .iter()
            .map(|b| {
                ledger
                    .append_with_spans("frugal watch", &b.events, std::slice::from_ref(&b.span))
                    .unwrap()
            })
            .collect();
        // Two events and a span each; none of the repeat.
        assert_eq!(stored, [3, 0, 3, 3]);
        assert_eq!(ledger.info().unwrap().events, 6);
    }

    #[test]
    fn a_cost_past_the_ledger_is_an_error() {
        let rate = HourlyRate(Money::from_nanos(i64::MAX));
        let err = bill(&target(), rate, 0, &interval(Millis::MAX, None)).unwrap_err();
        assert_eq!(err.duration_ms, Millis::MAX);
    }
}
