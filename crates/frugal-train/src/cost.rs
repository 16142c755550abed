//! What a training run costs at its machine's price ([`frugal_cloud::price`]): each segment
//! as a ledger event, and the run's totals.

use std::time::{Duration, UNIX_EPOCH};

use frugal_cloud::price::Pricing;
use frugal_cost::Money;
use frugal_cost::event::{Event, Kind, Outcome, derived_id};

use crate::supervisor::Segment;

/// A run's totals over its segments.
#[derive(Debug, Clone, PartialEq)]
pub struct RunCost {
    pub cost: Money,
    /// What the same hours cost on demand; `None` when any segment's is unknown.
    pub on_demand: Option<Money>,
    pub lost: Duration,
    pub preemptions: usize,
}

impl Segment {
    /// The segment as the ledger's training event of run `run_id`, its machine priced so.
    pub fn event(&self, run_id: &str, pricing: &Pricing) -> Event {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let duration_ms = ms(self.duration());
        let ts_ms = ms(self.started.duration_since(UNIX_EPOCH).unwrap_or_default());
        let cost = pricing.rate.cost(duration_ms, 1).unwrap_or(Money::ZERO);
        let mut e = Event::new(ts_ms, Kind::Training, run_id, cost);
        // A run's segments start one after another, so the start tells them apart; a segment
        // billed by its supervisor and again from its marker (a crash between the two) has
        // the same start and is stored once.
        e.id = Some(derived_id(
            "training segment",
            &[run_id.as_bytes(), &ts_ms.to_le_bytes()],
        ));
        e.duration_ms = duration_ms;
        e.run_id = Some(run_id.to_owned());
        e.instance_type.clone_from(&pricing.instance_type);
        e.region.clone_from(&pricing.region);
        e.capacity = Some(pricing.capacity);
        e.list_cost = pricing.on_demand.and_then(|r| r.cost(duration_ms, 1));
        e.outcome = Some(self.outcome);
        e.lost_ms = ms(self.lost);
        e.utilization = self.utilization;
        e.mfu = self.mfu;
        e.precision = self.precision;
        e.data_stall = self.data_stall;
        e.sync_stall = self.sync_stall;
        e
    }
}

impl RunCost {
    /// The totals of run `run_id` over `segments`, its machine priced so.
    pub fn of(pricing: &Pricing, run_id: &str, segments: &[Segment]) -> RunCost {
        let mut total = RunCost {
            cost: Money::ZERO,
            on_demand: Some(Money::ZERO),
            lost: Duration::ZERO,
            preemptions: 0,
        };
        for s in segments {
            let e = s.event(run_id, pricing);
            total.cost += e.cost;
            total.on_demand = total.on_demand.zip(e.list_cost).map(|(a, b)| a + b);
            total.lost += s.lost;
            total.preemptions += usize::from(s.outcome == Outcome::Preempted);
        }
        total
    }
}

#[allow(clippy::unwrap_used, clippy::expect_used)]
#[cfg(test)]
mod tests {
    use super::*;

    use frugal_cost::event::Capacity;
    use frugal_cost::money::HourlyRate;

    fn m(s: &str) -> Money {
        s.parse().unwrap()
    }

    fn segment(minutes: u64, outcome: Outcome, lost_s: u64) -> Segment {
        let started = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        Segment {
            attempt: 1,
            started,
            ended: started + Duration::from_secs(minutes * 60),
            outcome,
            cause: "exit 0".into(),
            resumed_from: None,
            last_checkpoint: None,
            first_step: None,
            last_step: None,
            lost: Duration::from_secs(lost_s),
            utilization: Some(0.5),
            diagnoses: Vec::new(),
            mfu: Some(0.031),
            precision: Some(frugal_cost::Precision::Fp32),
            data_stall: Some(0.4),
            sync_stall: None,
        }
    }

    #[test]
    fn segments_become_events_and_totals() {
        let p = Pricing {
            capacity: Capacity::Spot,
            rate: HourlyRate(m("1.20")),
            on_demand: Some(HourlyRate(m("3.00"))),
            instance_type: Some("g5.xlarge".into()),
            region: Some("us-east-1".into()),
        };
        let a = segment(30, Outcome::Preempted, 90);
        let e = a.event("r1", &p);
        assert_eq!(e.cost, m("0.60"));
        assert_eq!(e.list_cost, Some(m("1.50")));
        assert_eq!(e.duration_ms, 1_800_000);
        assert_eq!(e.lost_ms, 90_000);
        assert_eq!(e.run_id.as_deref(), Some("r1"));
        assert_eq!(e.capacity, Some(Capacity::Spot));
        assert_eq!(e.outcome, Some(Outcome::Preempted));
        assert_eq!(e.utilization, Some(0.5));
        assert_eq!(e.mfu, Some(0.031));
        assert_eq!(e.precision, Some(frugal_cost::Precision::Fp32));
        assert_eq!((e.data_stall, e.sync_stall), (Some(0.4), None));
        assert_eq!(e.instance_type.as_deref(), Some("g5.xlarge"));

        let total = RunCost::of(&p, "r1", &[a, segment(60, Outcome::Completed, 0)]);
        assert_eq!(
            total,
            RunCost {
                cost: m("1.80"),
                on_demand: Some(m("4.50")),
                lost: Duration::from_secs(90),
                preemptions: 1,
            }
        );
        let unknown = Pricing {
            on_demand: None,
            ..p
        };
        let total = RunCost::of(&unknown, "r1", &[segment(1, Outcome::Completed, 0)]);
        assert_eq!(total.on_demand, None);
    }

    fn pricing() -> Pricing {
        Pricing {
            capacity: Capacity::OnDemand,
            rate: HourlyRate(m("3.00")),
            on_demand: None,
            instance_type: None,
            region: None,
        }
    }

    /// Issue 31: a supervisor that bills a segment and dies before clearing its marker
    /// left the next start to bill it again from the marker. Billed from the marker the
    /// segment has the same start, so the same id: the ledger stores it once.
    #[test]
    fn a_training_segment_billed_twice_is_stored_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = frugal_cost::Ledger::open(dir.path().join("l.sqlite")).unwrap();
        let p = pricing();
        // Billed from the end of the one before: a start with a part of a millisecond.
        let mut billed = segment(30, Outcome::Completed, 0);
        billed.started += Duration::from_nanos(123_456);
        let marker = dir.path().join("segment");
        crate::orphan::mark(&marker, 0, None, billed.started);
        assert_eq!(
            ledger
                .append("frugal train", &[billed.event("r1", &p)])
                .unwrap(),
            1
        );
        let run = crate::orphan::Run {
            id: "r1",
            metrics: &dir.path().join("metrics.jsonl"),
            checkpoint_dir: &dir.path().join("checkpoints"),
            log: None,
        };
        let left = crate::orphan::settle(&marker, &run).unwrap();
        assert_eq!(
            ledger
                .append("frugal train", &[left.event("r1", &p)])
                .unwrap(),
            0
        );
        // The next segment, and another run's segment at the same start, are their own.
        let mut next = segment(10, Outcome::Completed, 0);
        next.started = billed.ended;
        assert_eq!(
            ledger
                .append("frugal train", &[next.event("r1", &p)])
                .unwrap(),
            1
        );
        assert_eq!(
            ledger
                .append("frugal train", &[billed.event("r2", &p)])
                .unwrap(),
            1
        );
        assert_eq!(ledger.info().unwrap().events, 3);
    }

    /// The tuner bills each trial's segment under the trial's run id (`{tune}-t{trial}`)
    /// and the search's workload: the same segment twice (billed, then again from its pid
    /// file after a crash) is stored once, and two trials' segments with the same start
    /// are both stored.
    #[test]
    fn a_tune_trial_segment_billed_twice_is_stored_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = frugal_cost::Ledger::open(dir.path().join("l.sqlite")).unwrap();
        let p = pricing();
        let s = segment(5, Outcome::Completed, 0);
        let trial = |run: &str| {
            let mut e = s.event(run, &p);
            e.workload = "tune-a".into();
            e
        };
        for run in ["tune-a-t001", "tune-a-t001", "tune-a-t002"] {
            ledger.append("frugal tune", &[trial(run)]).unwrap();
        }
        assert_eq!(ledger.info().unwrap().events, 2);
    }
}
