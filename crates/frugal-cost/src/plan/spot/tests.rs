use super::*;
use crate::catalog::Catalog;
use crate::plan::TestRng;

fn money(s: &str) -> Money {
    s.parse().unwrap()
}

fn prices() -> SpotPrices {
    SpotPrices {
        spot: HourlyRate(money("1")),
        on_demand: HourlyRate(money("3")),
    }
}

/// Quarter-hour ticks: `pattern` as 1 for spot, 0 for none.
fn quarter_hours(pattern: &[u8]) -> SpotTrace {
    SpotTrace::from_ticks(0.25, pattern.iter().map(|&p| p == 1).collect()).unwrap()
}

/// Spot for `up` quarter hours, gone for `down`, then back for `back`.
fn gap(up: usize, down: usize, back: usize) -> SpotTrace {
    let pattern: Vec<u8> = [(1, up), (0, down), (1, back)]
        .iter()
        .flat_map(|&(p, n)| std::iter::repeat_n(p, n))
        .collect();
    quarter_hours(&pattern)
}

/// `job` replayed on spot alone from hour 0.
fn spot_only(trace: &SpotTrace, job: &Job) -> Result<Replay, SpotError> {
    replay(trace, job, Policy::SpotOnly, &prices(), 0.0)
}

fn job(work: f64, checkpoint: f64, restart: f64, interval: f64) -> Job {
    Job {
        work_hours: work,
        checkpoint_hours: checkpoint,
        restart_hours: restart,
        interval_hours: interval,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

/// The shipped V100 preemption traces (data/spot-traces/PROVENANCE.md).
fn shipped(zone: &str) -> SpotTrace {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/spot-traces/preemption/1-node/aws-04-22-2023")
        .join(format!("{zone}_v100_1.json"));
    SpotTrace::read(&path, TraceReading::Unavailable).unwrap()
}

const ZONES: [&str; 4] = ["us-east-1c", "us-east-1f", "us-west-2b", "us-west-2c"];

#[test]
fn reads_a_trace_either_way() {
    let text =
        r#"{"metadata": {"gap_seconds": 1800}, "data": [0, 1, 4, 0], "prices": [1, 1, 1, 1]}"#;
    let unavailable = SpotTrace::from_json(text, TraceReading::Unavailable).unwrap();
    assert_eq!(unavailable.up, [true, false, false, true]);
    assert_eq!(unavailable.gap_hours(), 0.5);
    assert_eq!(unavailable.hours(), 2.0);
    let four = SpotTrace::from_json(text, TraceReading::Available { nodes: 4 }).unwrap();
    assert_eq!(four.up, [false, false, true, false]);
    assert!(matches!(
        SpotTrace::from_json(text, TraceReading::Available { nodes: 0 }),
        Err(SpotError::Invalid(_))
    ));
}

#[test]
fn a_bad_trace_is_refused() {
    let bad = |text: &str| SpotTrace::from_json(text, TraceReading::Unavailable).unwrap_err();
    assert!(matches!(bad("{}"), SpotError::Json(_)));
    assert!(matches!(
        bad(r#"{"metadata": {"gap_seconds": 30}, "data": [-1]}"#),
        SpotError::Json(_)
    ));
    assert_eq!(
        bad(r#"{"metadata": {"gap_seconds": 0}, "data": [0]}"#).to_string(),
        "the trace's tick must be a positive number of hours, got 0"
    );
    assert_eq!(
        bad(r#"{"metadata": {"gap_seconds": 30}, "data": []}"#).to_string(),
        "spot trace: no ticks"
    );
    let missing = SpotTrace::read(
        Path::new("/nonexistent/trace.json"),
        TraceReading::Unavailable,
    );
    assert_eq!(
        missing.unwrap_err().to_string(),
        "cannot read spot trace /nonexistent/trace.json"
    );
}

#[test]
fn stats_by_hand() {
    // Spot for 2 h, gone 1 h, back 3 h, gone 2 h, back 1 h: 6 h with spot, 2 preemptions.
    let trace =
        SpotTrace::from_ticks(1.0, [1, 1, 0, 1, 1, 1, 0, 0, 1].map(|v| v == 1).to_vec()).unwrap();
    let s = trace.stats();
    assert_eq!(s.hours, 9.0);
    assert!(close(s.available_share, 6.0 / 9.0));
    assert_eq!(s.preemptions, 2);
    assert_eq!(s.mtbf_hours, Some(3.0));
    assert!(close(s.interruptions_per_hour, 1.0 / 3.0));
    assert_eq!(s.mean_outage_hours, Some(1.5));
    let always = SpotTrace::from_ticks(1.0, vec![true; 5]).unwrap().stats();
    assert_eq!((always.mtbf_hours, always.mean_outage_hours), (None, None));
}

#[test]
fn young_daly_by_hand() {
    // 3 minutes to checkpoint, a preemption every 5 hours: sqrt(2 x 0.05 x 5) = 0.707 h.
    assert!(close(young_daly_interval(0.05, 5.0), 0.5_f64.sqrt()));
}

#[test]
fn a_replay_without_preemptions_by_hand() {
    // Restart 0.5 h, work 1 h, checkpoint 0.25 h, work 1 h: done at 2.75 h, all billed.
    let trace = quarter_hours(&[1; 40]);
    let r = spot_only(&trace, &job(2.0, 0.25, 0.5, 1.0)).unwrap();
    assert!(r.finished);
    assert!(close(r.finish_hours, 2.75));
    assert!(close(r.spot_hours, 2.75));
    assert_eq!(r.cost, money("2.75"));
    assert_eq!((r.checkpoints, r.restarts, r.preemptions), (1, 1, 0));
    assert_eq!(r.deadline_met, None);
}

#[test]
fn a_preemption_loses_the_work_since_the_checkpoint_by_hand() {
    // Spot for 2 h, gone for 1 h, then back. Restart 0.5, work 1 (checkpointed by 1.75),
    // 0.25 h more work lost at 2.0; wait to 3.0, restart to 3.5, the last hour of work
    // ends at 4.5. Billed: 2 h + 1.5 h.
    let trace = gap(8, 4, 40);
    let r = spot_only(&trace, &job(2.0, 0.25, 0.5, 1.0)).unwrap();
    assert!(close(r.finish_hours, 4.5), "{r:?}");
    assert!(close(r.spot_hours, 3.5));
    assert!(close(r.lost_work_hours, 0.25));
    assert!(close(r.waiting_hours, 1.0));
    assert!(close(r.restart_hours, 1.0));
    assert!(close(r.checkpoint_hours, 0.25));
    assert_eq!((r.preemptions, r.restarts, r.checkpoints), (1, 2, 1));
    assert_eq!(r.cost, money("3.5"));
}

#[test]
fn a_preemption_during_a_checkpoint_loses_the_interval() {
    // Spot for 1.75 h: the checkpoint due at 1.5 h needs until 2.0 h and never finishes.
    let trace = gap(7, 1, 40);
    let r = spot_only(&trace, &job(2.0, 0.5, 0.5, 1.0)).unwrap();
    assert!(close(r.lost_work_hours, 1.0));
    assert_eq!(r.checkpoints, 1);
    // Restarts at 2.0: 0.5 h, 1 h of work, a 0.5 h checkpoint, 1 h of work.
    assert!(close(r.finish_hours, 5.0), "{r:?}");
}

#[test]
fn a_trace_shorter_than_the_run_repeats_and_a_hopeless_one_gives_up() {
    let r = spot_only(&quarter_hours(&[1; 4]), &job(3.0, 0.0, 0.0, 10.0)).unwrap();
    assert!(r.finished);
    assert!(close(r.finish_hours, 3.0));
    // Spot never lasts past the restart: no work is ever done.
    let never = spot_only(&quarter_hours(&[1, 0]), &job(1.0, 0.0, 0.5, 1.0)).unwrap();
    assert!(!never.finished);
    assert!(never.finish_hours >= GIVE_UP_FACTOR);
}

#[test]
fn on_demand_only_by_hand() {
    let r = replay(
        &quarter_hours(&[0; 4]),
        &job(10.0, 0.25, 0.5, 1.0),
        Policy::OnDemandOnly,
        &prices(),
        0.0,
    )
    .unwrap();
    assert!(close(r.finish_hours, 10.5));
    assert!(close(r.on_demand_hours, 10.5));
    assert_eq!(r.checkpoints, 0);
    assert_eq!(r.cost, money("31.5"));
}

#[test]
fn bad_jobs_and_deadlines_are_refused() {
    let trace = quarter_hours(&[1; 4]);
    let err = spot_only(&trace, &job(0.0, 0.1, 0.1, 1.0)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the work must be a positive number of hours, got 0"
    );
    let err = spot_only(&trace, &job(1.0, -0.1, 0.1, 1.0)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the checkpoint cost must be a number of hours >= 0, got -0.1"
    );
    let err = plan_deadline(&trace, &job(10.0, 0.1, 0.5, 1.0), &prices(), 10.0, 0.0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the deadline (10 h) is shorter than the work plus one restart (10.5 h): no policy meets it"
    );
}

#[test]
fn uniform_progress_uses_spot_while_it_lasts_then_meets_the_deadline_on_demand() {
    // Spot for the first 4 h, then never again; 8 h of work due in 12 h.
    let trace = gap(16, 200, 0);
    let plan = plan_deadline(&trace, &job(8.0, 0.1, 0.25, 1.0), &prices(), 12.0, 0.0).unwrap();
    // Spot alone waits for the trace to come round again.
    assert!(!plan.spot_only_meets);
    assert!(plan.spot_only.finish_hours > 50.0);
    let up = &plan.uniform_progress;
    assert_eq!(up.deadline_met, Some(true), "{up:?}");
    assert!(up.finish_hours <= 12.0);
    assert!(up.spot_hours > 3.0 && up.on_demand_hours > 0.0);
    assert!(
        up.cost < plan.on_demand.cost,
        "{} vs {}",
        up.cost,
        plan.on_demand.cost
    );
}

#[test]
fn uniform_progress_waits_for_spot_while_ahead() {
    // Spot for 2 h, gone for 1 h, back: with a loose deadline the gap is waited out.
    let trace = gap(8, 4, 100);
    let plan = plan_deadline(&trace, &job(4.0, 0.0, 0.25, 0.5), &prices(), 20.0, 0.0).unwrap();
    let up = &plan.uniform_progress;
    assert_eq!(up.on_demand_hours, 0.0, "{up:?}");
    assert!(close(up.waiting_hours, 1.0));
    assert_eq!(up.cost, plan.spot_only.cost);
    assert!(plan.spot_only_meets);
}

#[test]
fn uniform_progress_without_any_spot_runs_on_demand() {
    let plan = plan_deadline(
        &quarter_hours(&[0; 8]),
        &job(4.0, 0.1, 0.25, 1.0),
        &prices(),
        6.0,
        0.0,
    )
    .unwrap();
    let up = &plan.uniform_progress;
    assert_eq!(up.deadline_met, Some(true));
    assert_eq!(up.spot_hours, 0.0);
    // One restart and the work, billed on demand, started a tick late at most.
    assert!(close(up.on_demand_hours, 4.25), "{up:?}");
}

#[test]
fn uniform_progress_meets_every_deadline_on_the_shipped_traces() {
    // The policy bounds time, not cost: on a trace whose spot rarely lasts, tries on spot
    // can cost more than on demand alone, so only the deadline is asserted per start.
    let job = job(24.0, 1.0 / 30.0, 0.1, 0.5);
    let starts = 12;
    for zone in ZONES {
        let trace = shipped(zone);
        for deadline in [24.2, 30.0, 36.0, 48.0] {
            let (mut cost, mut on_demand, mut spot_meets) = (Money::ZERO, Money::ZERO, 0);
            for i in 0..starts {
                let start = trace.hours() * f64::from(i) / f64::from(starts);
                let plan = plan_deadline(&trace, &job, &prices(), deadline, start).unwrap();
                let up = &plan.uniform_progress;
                assert_eq!(
                    up.deadline_met,
                    Some(true),
                    "{zone} from {start} h by {deadline} h"
                );
                cost += up.cost;
                on_demand += plan.on_demand.cost;
                spot_meets += u32::from(plan.spot_only_meets);
            }
            println!(
                "{zone}, 24 h of work due in {deadline} h, {starts} starts: uniform progress \
                 costs {:.0}% of on demand; spot alone meets it {spot_meets} times",
                cost.as_f64() / on_demand.as_f64() * 100.0
            );
        }
    }
}

/// A synthetic trace with exponential stretches of spot (mean `mtbf` hours) and of none
/// (mean `outage` hours), in ticks of 36 s.
fn exponential(seed: u64, hours: f64, mtbf: f64, outage: f64) -> SpotTrace {
    let (gap, mut rng) = (0.01, TestRng(seed));
    let mut up = Vec::new();
    while (up.len() as f64) * gap < hours {
        let on = (-mtbf * rng.unit().ln() / gap).round().max(1.0) as usize;
        let off = (-outage * rng.unit().ln() / gap).round().max(1.0) as usize;
        up.extend(std::iter::repeat_n(true, on));
        up.extend(std::iter::repeat_n(false, off));
    }
    SpotTrace::from_ticks(gap, up).unwrap()
}

/// The sweep's cheapest interval and the cost at Young/Daly's, over `intervals` spread
/// geometrically from a quarter to four times Young/Daly's.
fn sweep_against_young_daly(trace: &SpotTrace, job: &Job, starts: usize) -> (f64, Money, Money) {
    let mtbf = trace.stats().mtbf_hours.unwrap();
    let yd = young_daly_interval(job.checkpoint_hours, mtbf);
    let grid: Vec<f64> = (0..=24)
        .map(|i| yd * 16f64.powf(f64::from(i) / 24.0) / 4.0)
        .collect();
    let sweep = sweep_intervals(trace, job, &prices(), &grid, starts).unwrap();
    assert!(sweep.iter().all(|p| p.unfinished == 0));
    let at_yd = sweep[12].mean_cost;
    let best = sweep.iter().min_by_key(|p| p.mean_cost).unwrap();
    (best.interval_hours, best.mean_cost, at_yd)
}

#[test]
fn young_daly_matches_a_simulated_sweep_on_exponential_preemptions() {
    // MTBF 5 h, 3-minute checkpoints: Young/Daly says 0.71 h.
    let trace = exponential(7, 3000.0, 5.0, 0.5);
    let job = job(24.0, 0.05, 0.1, 1.0);
    let (best, best_cost, at_yd) = sweep_against_young_daly(&trace, &job, 48);
    let mtbf = trace.stats().mtbf_hours.unwrap();
    println!(
        "exponential, MTBF {mtbf:.2} h: Young/Daly {:.3} h costs {at_yd}, sweep best {best:.3} h costs {best_cost}",
        young_daly_interval(0.05, mtbf)
    );
    assert!(at_yd.as_f64() <= best_cost.as_f64() * 1.02);
}

#[test]
fn young_daly_matches_a_simulated_sweep_on_the_shipped_traces() {
    let job = job(24.0, 1.0 / 30.0, 0.1, 1.0);
    for zone in ZONES {
        let trace = shipped(zone);
        let s = trace.stats();
        let mtbf = s.mtbf_hours.unwrap();
        let (best, best_cost, at_yd) = sweep_against_young_daly(&trace, &job, 48);
        println!(
            "{zone}: {:.1} h, spot {:.0}% of it, {} preemptions, MTBF {mtbf:.2} h; \
             Young/Daly {:.3} h costs {at_yd} a run, sweep best {best:.3} h costs {best_cost}",
            s.hours,
            s.available_share * 100.0,
            s.preemptions,
            young_daly_interval(job.checkpoint_hours, mtbf)
        );
        assert!(at_yd.as_f64() <= best_cost.as_f64() * 1.05, "{zone}");
    }
}

/// The issue's spot replay: 24 hours of work on p3.2xlarge at the built-in catalog's prices,
/// 2-minute checkpoints at the trace's Young/Daly interval, 6-minute restarts, from the
/// start of each shipped trace; and with a 36-hour deadline.
#[test]
fn replays_a_24_hour_training_run_on_the_shipped_traces() {
    let catalog = Catalog::builtin().unwrap();
    let offer = catalog.instance("p3.2xlarge", None).unwrap();
    let prices = SpotPrices {
        spot: offer.spot.unwrap(),
        on_demand: offer.on_demand,
    };
    for zone in ZONES {
        let trace = shipped(zone);
        let mtbf = trace.stats().mtbf_hours.unwrap();
        let interval = young_daly_interval(1.0 / 30.0, mtbf);
        let job = job(24.0, 1.0 / 30.0, 0.1, interval);
        let plan = plan_deadline(&trace, &job, &prices, 36.0, 0.0).unwrap();
        let (spot, up, od) = (&plan.spot_only, &plan.uniform_progress, &plan.on_demand);
        println!(
            "{zone} (MTBF {mtbf:.2} h, checkpoint every {interval:.2} h): spot alone finishes in \
             {:.1} h for {} ({} preemptions, {:.2} h of work lost, {} checkpoints, {:.1} h \
             waiting); on demand {:.1} h for {}; by 36 h: spot alone {}, uniform progress \
             {:.1} h for {} ({:.1} h spot, {:.1} h on demand)",
            spot.finish_hours,
            spot.cost,
            spot.preemptions,
            spot.lost_work_hours,
            spot.checkpoints,
            spot.waiting_hours,
            od.finish_hours,
            od.cost,
            if plan.spot_only_meets {
                "meets it"
            } else {
                "misses it"
            },
            up.finish_hours,
            up.cost,
            up.spot_hours,
            up.on_demand_hours,
        );
        assert!(spot.finished);
        assert!(spot.cost < od.cost);
        assert!(spot.finish_hours >= od.finish_hours);
        assert_eq!(up.deadline_met, Some(true));
        assert!(up.cost <= od.cost);
    }
}
