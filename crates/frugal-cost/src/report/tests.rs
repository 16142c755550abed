use super::*;
use crate::catalog::PriceSource;
use crate::event::{Event, ReplicaSpan, ReplicaState};
use crate::present::utc;

fn m(s: &str) -> Money {
    s.parse().unwrap()
}

/// On an hour: rollups and windows are hourly.
const T0: Millis = 1_792_998_000_000;

fn ledger_with(events: &[Event]) -> (tempfile::TempDir, Ledger) {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = crate::ledger::testing::fresh(dir.path());
    ledger.append("test", events).unwrap();
    (dir, ledger)
}

fn inference(workload: &str, model: &str, requests: u64, cost: &str) -> Event {
    let mut e = Event::new(T0, Kind::Inference, workload, m(cost));
    e.model = Some(model.into());
    e.requests = requests;
    e
}

fn segment(run: &str, capacity: Capacity, hours: i64, cost: &str, list: &str) -> Event {
    let mut e = Event::new(T0, Kind::Training, "pretrain", m(cost));
    e.run_id = Some(run.into());
    e.capacity = Some(capacity);
    e.duration_ms = hours * HOUR_MS;
    e.list_cost = Some(m(list));
    e
}

/// The worked example of the report: every figure below is computed by hand.
fn worked_example() -> Vec<Event> {
    // chat/small, pay per token at $0.5 in / $1.5 out per million: 4 requests of 1,000 in
    // and 200 out are 4 x ($0.0005 + $0.0003) = $0.0032.
    let mut chat = inference("chat", "small", 4, "0.0032");
    chat.input_tokens = 4000;
    chat.output_tokens = 800;
    chat.input_cost = Some(m("0.002"));
    // api/llama on its own instance: 1,000 requests for $7, then $3 of the same replica idle.
    let mut api = inference("api", "llama", 1000, "7");
    api.instance_type = Some("g5.xlarge".into());
    api.input_tokens = 500_000;
    api.output_tokens = 200_000;
    let mut idle = Event::new(T0 + HOUR_MS, Kind::Idle, "api", m("3"));
    idle.instance_type = Some("g5.xlarge".into());
    // Run r1 on spot: preempted after 2 h with 30 min since the last checkpoint, then
    // completed in 2 h more at 50% GPU utilization. $2 + $2 against $6 + $6 on demand.
    let mut s1 = segment("r1", Capacity::Spot, 2, "2", "6");
    s1.outcome = Some(Outcome::Preempted);
    s1.lost_ms = HOUR_MS / 2;
    let mut s2 = segment("r1", Capacity::Spot, 2, "2", "6");
    s2.ts_ms += 2 * HOUR_MS;
    s2.outcome = Some(Outcome::Completed);
    s2.utilization = Some(0.5);
    // Run r2: one hour of p3.2xlarge on demand ($3.06), which spot would have done for less.
    let mut r2 = segment("r2", Capacity::OnDemand, 1, "3.06", "3.06");
    r2.instance_type = Some("p3.2xlarge".into());
    r2.outcome = Some(Outcome::Completed);
    vec![chat, api, idle, s1, s2, r2]
}

#[test]
fn unit_costs_by_hand() {
    let (_dir, ledger) = ledger_with(&worked_example());
    let catalog = Catalog::builtin().unwrap();
    let r = Report::build(&ledger, &catalog, Window::default()).unwrap();
    assert_eq!(r.events, 6);
    // 0.0032 + 7 + 3 + 2 + 2 + 3.06
    assert_eq!(r.total, m("17.0632"));

    let chat = r
        .inference
        .iter()
        .find(|l| l.workload.as_deref() == Some("chat"))
        .unwrap();
    assert_eq!(chat.per_1k, Some(m("0.8")));
    assert_eq!(chat.per_m_input, Some(m("0.5")));
    assert_eq!(chat.per_m_output, Some(m("1.5")));
    assert_eq!(chat.utilization, None, "pay-per-token has no utilization");

    let api = r
        .inference
        .iter()
        .find(|l| l.workload.as_deref() == Some("api"))
        .unwrap();
    assert_eq!(
        api.idle_cost,
        m("3"),
        "the workload's idle time is charged to its requests"
    );
    // ($7 + $3) / 1,000 requests x 1,000; ($7 + $3) / 700,000 tokens x 1M = $14.285714286.
    assert_eq!(api.per_1k, Some(m("10")));
    assert_eq!(api.per_m_tokens, Some(m("14.285714286")));
    assert_eq!(api.utilization, Some(0.7));
    assert_eq!(
        utilization_note(0.35).as_deref(),
        Some("at 35% utilization you pay 2.9x per unit of work")
    );

    let r1 = r.training.iter().find(|l| l.run == "r1").unwrap();
    assert_eq!((r1.segments, r1.preemptions, r1.completed), (2, 1, true));
    assert_eq!(r1.cost, m("4"));
    assert_eq!(r1.on_demand_cost, Some(m("12")));
    assert_eq!(r1.saving, Some(m("8")));
    // 30 of the first segment's 120 minutes were redone: a quarter of $2.
    assert_eq!(r1.lost_cost, m("0.5"));
    assert_eq!(r1.waste, m("1"));
    assert_eq!(r1.utilization, Some(0.5));
    assert_eq!(r1.spot_share, 1.0);

    // Waste: $3 idle + $1 of r1's second segment.
    assert_eq!(r.waste, m("4"));
    let training = r.by_kind.iter().find(|k| k.kind == Kind::Training).unwrap();
    assert_eq!(training.cost, m("7.06"));
    assert_eq!(
        r.by_kind[0].kind,
        Kind::Training,
        "by kind alone: 7.06 > 7.0032"
    );
    let dominant = r.dominant.clone().unwrap();
    // Inference with its idle replica: 0.0032 + 7 + 3 = 10.0032, 59%; training 7.06, 41%.
    assert_eq!(r.areas[0].area, "inference");
    assert_eq!((r.areas[0].cost, r.areas[0].idle), (m("10.0032"), m("3")));
    assert!(
        dominant.starts_with(
            "inference is 59% of the $17.06 spent ($3.00 of it idle capacity), training 41%"
        ),
        "{dominant}"
    );
    assert!(dominant.contains("inference `api` at $7.00"), "{dominant}");

    // Levers, by dollars: idle serving $3, spot for r2 (3.06 - median spot), r1's waste $1.
    let spot = catalog
        .instance("p3.2xlarge", None)
        .unwrap()
        .spot
        .unwrap()
        .0;
    let names: Vec<(&str, Money)> = r.levers.iter().map(|l| (l.lever, l.dollars)).collect();
    assert_eq!(names[0], ("cut idle serving capacity", m("3")));
    assert!(
        names.contains(&("train on spot with checkpoints", m("3.06") - spot)),
        "{names:?}"
    );
    assert!(
        names.contains(&("keep training GPUs busy", m("1"))),
        "{names:?}"
    );
    assert!(
        r.levers.windows(2).all(|w| w[0].dollars >= w[1].dollars),
        "ranked by dollars"
    );
}

#[test]
fn a_window_counts_the_cost_incurred_inside_it() {
    let (_dir, ledger) = ledger_with(&worked_example());
    let catalog = Catalog::builtin().unwrap();
    let window = Window {
        since_ms: Some(T0 + HOUR_MS),
        until_ms: Some(T0 + 3 * HOUR_MS),
    };
    let r = Report::build(&ledger, &catalog, window).unwrap();
    // Hours 1 and 2: the idle hour ($3), the second half of r1's first segment ($1) and
    // the first half of its second ($1). Counts go with the hour an event starts in.
    assert_eq!(r.total, m("5"));
    assert_eq!(
        r.events, 2,
        "the idle event and the second segment start inside"
    );
    let r1 = r.training.iter().find(|l| l.run == "r1").unwrap();
    assert_eq!(r1.cost, m("2"));
    // A window that is not on the hour takes the whole hours it touches.
    let ragged = Window {
        since_ms: Some(T0 + HOUR_MS + 1),
        until_ms: Some(T0 + 2 * HOUR_MS + 1),
    };
    assert_eq!(
        Report::build(&ledger, &catalog, ragged).unwrap().total,
        m("5")
    );
}

#[test]
fn the_series_spreads_long_segments_over_hours() {
    let (_dir, ledger) = ledger_with(&worked_example());
    let r = Report::build(&ledger, &Catalog::builtin().unwrap(), Window::default()).unwrap();
    assert_eq!(r.series.bucket_ms, HOUR_MS);
    let pretrain = &r
        .series
        .lines
        .iter()
        .find(|(w, _)| w == "pretrain")
        .unwrap()
        .1;
    let total: f64 = pretrain.iter().sum();
    assert!((total - 7.06).abs() < 1e-9, "{total}");
    let sum_all: f64 = r.series.lines.iter().flat_map(|(_, v)| v).sum();
    assert!((sum_all - r.total.as_f64()).abs() < 1e-9);
}

#[test]
fn a_steady_on_demand_baseline_is_priced_at_the_reserved_rate() {
    let mut catalog = Catalog::builtin().unwrap();
    let prices = "[[instance]]\nprovider='aws'\ninstance_type='p3.2xlarge'\nregion='us-east-1'\non_demand=3.06\nreserved_1y_discount=0.4\n";
    catalog
        .extend_from_toml(prices, PriceSource::Builtin)
        .unwrap();
    // Two replicas every hour for 15 days (a 1-year term wants 14), a third in the busy
    // hours only.
    let mut events = Vec::new();
    for h in 0..15 * 24 {
        let mut e = Event::new(
            T0 - T0.rem_euclid(HOUR_MS) + h * HOUR_MS,
            Kind::Inference,
            "api",
            m("6.12"),
        );
        e.instance_type = Some("p3.2xlarge".into());
        e.capacity = Some(Capacity::OnDemand);
        e.instances = if h % 24 < 12 { 3 } else { 2 };
        e.duration_ms = HOUR_MS;
        e.requests = 100;
        events.push(e);
    }
    let (_dir, ledger) = ledger_with(&events);
    let r = Report::build(&ledger, &catalog, Window::default()).unwrap();
    let lever = r
        .levers
        .iter()
        .find(|l| l.lever == "reserve the steady baseline")
        .unwrap();
    // The planner's answer on the workload's 360 hours: the third replica runs in half
    // the hours, under the 60% a reserved hour costs: 2 committed, 3.06 - 1.836 = 1.224
    // saved per replica-hour.
    assert_eq!(lever.dollars, m("881.28"), "{}", lever.basis);
    assert!(
        lever.basis.starts_with(
            "workload `api`: 2 x p3.2xlarge on a 1-year term over its 360 h would have been 100% busy"
        ),
        "{}",
        lever.basis
    );
    assert!(
        lever
            .action
            .contains("`frugal plan --workload api --instance p3.2xlarge --fit 7d --test 7d`"),
        "{}",
        lever.action
    );
}

#[test]
fn an_empty_ledger_reports_nothing_without_failing() {
    let (_dir, ledger) = ledger_with(&[]);
    let r = Report::build(&ledger, &Catalog::builtin().unwrap(), Window::default()).unwrap();
    assert_eq!((r.events, r.total), (0, Money::ZERO));
    assert!(r.dominant.is_none() && r.levers.is_empty());
}

/// The rollups agree with the raw events to the nano-dollar, however events cross hours.
#[test]
fn rollups_match_the_raw_events_exactly() {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let kinds = [Kind::Inference, Kind::Training, Kind::Idle, Kind::Other];
    let events: Vec<Event> = (0..2000)
        .map(|_| {
            let kind = kinds[next(4) as usize];
            let mut e = Event::new(
                T0 + next(30 * HOUR_MS as u64) as i64,
                kind,
                "w",
                Money::from_nanos(next(50_000_000_000) as i64 + 1),
            );
            e.duration_ms = next(5 * HOUR_MS as u64) as i64;
            e.requests = next(100);
            e.utilization = (next(2) == 0).then(|| next(101) as f64 / 100.0);
            e.run_id = (kind == Kind::Training).then(|| format!("r{}", next(3)));
            e
        })
        .collect();
    let (_dir, ledger) = ledger_with(&events);
    let r = Report::build(&ledger, &Catalog::builtin().unwrap(), Window::default()).unwrap();
    let raw_cost: Money = events.iter().map(|e| e.cost).sum();
    let raw_waste: Money = events.iter().map(Event::waste).sum();
    assert_eq!((r.events, r.total, r.waste), (2000, raw_cost, raw_waste));
    let run_cost: Money = r.training.iter().map(|l| l.cost).sum();
    let raw_run: Money = events
        .iter()
        .filter(|e| e.kind == Kind::Training)
        .map(|e| e.cost)
        .sum();
    assert_eq!(run_cost, raw_run);
    let requests: u64 = r.inference.iter().map(|l| l.requests).sum();
    let raw_requests: u64 = events
        .iter()
        .filter(|e| e.kind == Kind::Inference)
        .map(|e| e.requests)
        .sum();
    assert_eq!(requests, raw_requests);
    let series: f64 = r.series.lines.iter().flat_map(|(_, v)| v).sum();
    assert!((series - raw_cost.as_f64()).abs() < 1e-6 * raw_cost.as_f64());
}

const MINUTE_MS: Millis = 60_000;

/// A span of pool `qwen` at $1 an hour, its cost exact for whole tenths of an hour.
fn span(at_min: i64, replica: u32, state: ReplicaState, min: i64, busy_min: i64) -> ReplicaSpan {
    crate::test_events::pool_span(T0, at_min, replica, state, min, busy_min)
}

/// Pool `qwen`, worked by hand: three cold starts (one failed), two replicas ready for
/// 30 minutes each, one draining; 90 replica-minutes for $1.50, 24 of them busy.
fn pool_example() -> (Vec<Event>, Vec<ReplicaSpan>) {
    let mut failed_start = span(6, 2, ReplicaState::Starting, 6, 0);
    failed_start.failed = true;
    let spans = vec![
        span(0, 1, ReplicaState::Starting, 6, 0),
        span(6, 1, ReplicaState::Ready, 30, 18),
        failed_start,
        span(12, 3, ReplicaState::Starting, 12, 0),
        span(24, 3, ReplicaState::Ready, 30, 6),
        span(36, 1, ReplicaState::Draining, 6, 0),
    ];
    // 40 requests at a cent (the busy $0.40): 36 not held, the first held through the
    // 6-minute cold start, three held 1-3 s; two failed requests held long.
    let mut events: Vec<Event> = (0..42)
        .map(|i| {
            let mut e = inference("chat", "qwen", 1, "0.01");
            e.ts_ms = T0 + i * MINUTE_MS;
            e.wait_ms = match i {
                0 => 6 * MINUTE_MS,
                1..=3 => i * 1000,
                40.. => 600_000,
                _ => 0,
            };
            if i >= 40 {
                (e.outcome, e.cost) = (Some(Outcome::Failed), Money::ZERO);
            }
            e
        })
        .collect();
    let mut idle = Event::new(T0, Kind::Idle, "chat", m("1.10"));
    idle.model = Some("qwen".into());
    events.push(idle);
    (events, spans)
}

fn ledger_with_pool() -> (tempfile::TempDir, Ledger) {
    let (events, spans) = pool_example();
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = crate::ledger::testing::fresh(dir.path());
    ledger.append_with_spans("test", &events, &spans).unwrap();
    (dir, ledger)
}

#[test]
fn a_pool_by_hand_against_a_fixed_pool_of_its_largest_size() {
    let (_dir, ledger) = ledger_with_pool();
    let r = Report::build(&ledger, &Catalog::builtin().unwrap(), Window::default()).unwrap();
    assert_eq!(r.total, m("1.5"), "spans add nothing to the events' money");
    let [pool] = &r.pools[..] else {
        panic!("{:?}", r.pools)
    };
    assert_eq!(
        (pool.workload.as_str(), pool.pool.as_str()),
        ("chat", "qwen")
    );
    assert_eq!((pool.min_replicas, pool.max_replicas), (0, 4));
    assert_eq!(pool.replica_hours, 1.5);
    assert_eq!(pool.cost, m("1.5"));
    assert_eq!(pool.busy_share, Some(24.0 / 90.0));
    assert_eq!(pool.requests, 40, "failed requests are not served");
    // $1.50 / 40 requests x 1,000.
    assert_eq!(pool.per_1k, Some(m("37.5")));
    assert_eq!((pool.cold_starts, pool.failed_starts), (3, 1));
    assert_eq!(
        (pool.cold_start_p50_s, pool.cold_start_p99_s),
        (Some(360.0), Some(720.0))
    );
    // 36 of 40 did not wait; the 40th is the one held through the cold start.
    assert_eq!(
        (pool.wait_p50_ms, pool.wait_p99_ms),
        (Some(0), Some(360_000))
    );
    // 4 replicas from the first start (T0) to the last end (T0 + 54 min) at the replicas'
    // $1 an hour: 4 x 0.9 h = $3.60, against $1.50 paid.
    assert_eq!(pool.fixed_cost, Some(m("3.6")));
    assert_eq!(pool.saving_vs_fixed, Some(m("2.1")));
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["pools"][0]["fixed_cost"], 3_600_000_000_i64);
    assert_eq!(
        json["pools"][0]["right_sizing"][0]["flag"],
        "low_busy_share"
    );
    assert_eq!(json["pool_busy_below"], 0.3);
}

#[test]
fn pools_busy_below_the_threshold_and_on_oversized_instances_are_flagged() {
    let (_dir, ledger) = ledger_with_pool();
    let catalog = Catalog::builtin().unwrap();
    let r = Report::build(&ledger, &catalog, Window::default()).unwrap();
    let flags = &r.pools[0].right_sizing;
    let idle = flags
        .iter()
        .find(|f| f.flag == Sizing::LowBusyShare)
        .unwrap();
    // Busy 24 of 90 minutes: the other 66 minutes' share of $1.50.
    assert_eq!(idle.dollars, m("1.1"));
    assert!(
        idle.basis
            .contains("busy 27% of 1.5 replica-hours (flagged below 30%)"),
        "{}",
        idle.basis
    );
    assert!(
        idle.action.contains("target_in_flight") && idle.action.contains("scale_to_zero_after")
    );
    // 3 GiB with 20% headroom on a p4d.24xlarge (8 x A100): one T4 (16 GiB) holds it.
    let big = flags
        .iter()
        .find(|f| f.flag == Sizing::OversizedInstance)
        .unwrap();
    assert_eq!(big.instead.as_deref(), Some("g5g.xlarge"));
    // ($21.957642 - $0.42) an hour over 1.5 replica-hours.
    assert_eq!(big.dollars, m("32.306463"));
    assert!(
        big.basis.contains("needs 3.0 GiB") && big.basis.contains("has 320 GiB"),
        "{}",
        big.basis
    );
    let lever = |name: &str| r.levers.iter().find(|l| l.lever == name).unwrap();
    assert_eq!(lever("scale idle pools in").dollars, m("1.1"));
    let sizing = lever("right-size pool instances");
    assert_eq!(sizing.dollars, m("32.306463"));
    assert_eq!(sizing.basis, "pool `qwen` on p4d.24xlarge fits g5g.xlarge");

    // A lower threshold flags no idle pool; a pool whose need is unknown is not resized.
    let options = Options {
        pool_busy_below: 0.2,
        ..Options::default()
    };
    let r = Report::build_with(&ledger, &catalog, Window::default(), options.clone()).unwrap();
    assert_eq!(r.pool_busy_below, 0.2);
    let flags: Vec<Sizing> = r.pools[0].right_sizing.iter().map(|f| f.flag).collect();
    assert_eq!(flags, [Sizing::OversizedInstance]);
    let (events, mut spans) = pool_example();
    spans.iter_mut().for_each(|s| s.need_bytes = None);
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = crate::ledger::testing::fresh(dir.path());
    ledger.append_with_spans("t", &events, &spans).unwrap();
    let r = Report::build_with(&ledger, &catalog, Window::default(), options).unwrap();
    assert!(r.pools[0].right_sizing.is_empty());
}

#[test]
fn a_window_without_spans_has_no_pools_and_one_cuts_them_by_the_hour() {
    let (_dir, ledger) = ledger_with_pool();
    let catalog = Catalog::builtin().unwrap();
    let later = Window {
        since_ms: Some(T0 + HOUR_MS),
        until_ms: None,
    };
    let r = Report::build(&ledger, &catalog, later).unwrap();
    assert!(r.pools.is_empty());
    assert!(!r.levers.iter().any(|l| l.lever == "scale idle pools in"));
    // A window inside the first hour takes all of it, as the rollups do.
    let inside = Window {
        since_ms: Some(T0 + 30 * MINUTE_MS),
        until_ms: Some(T0 + 31 * MINUTE_MS),
    };
    let r = Report::build(&ledger, &catalog, inside).unwrap();
    assert_eq!((r.pools[0].cost, r.pools[0].requests), (m("1.5"), 40));
}

#[test]
fn a_batch_job_on_spot_is_priced_per_unit_beside_the_models_interactive_traffic() {
    // Interactive: 100 requests of 1,000 tokens for $1, and $1 idle on the same model.
    let mut chat = inference("serve", "llama", 100, "1");
    chat.input_tokens = 80_000;
    chat.output_tokens = 20_000;
    chat.instance_type = Some("g5.xlarge".into());
    let mut idle = Event::new(T0, Kind::Idle, "serve", m("1"));
    idle.model = Some("llama".into());
    // A batch job on spot: 400 lines of 1,000 tokens for $1, $3 on demand.
    let mut lines = inference("batch", "llama", 400, "1");
    lines.input_tokens = 300_000;
    lines.output_tokens = 100_000;
    lines.run_id = Some("batch_1".into());
    lines.capacity = Some(Capacity::Spot);
    lines.list_cost = Some(m("3"));
    let (_dir, ledger) = ledger_with(&[chat, idle, lines]);
    let catalog = Catalog::builtin().unwrap();
    let r = Report::build(&ledger, &catalog, Window::default()).unwrap();
    let [job] = r.batch.as_slice() else {
        panic!("{:?}", r.batch)
    };
    assert_eq!(job.job, "batch_1");
    assert_eq!(job.workload, "batch");
    assert_eq!(job.model.as_deref(), Some("llama"));
    assert_eq!(job.lines, 400);
    assert_eq!(job.per_1k, Some(m("2.5")));
    assert_eq!(job.per_m_tokens, Some(m("2.5")));
    assert_eq!(job.spot_share, 1.0);
    assert_eq!(job.on_demand_cost, Some(m("3")));
    assert_eq!(job.saving, Some(m("2")));
    // Interactive paid $2 (idle included) for 100 requests and 100,000 tokens.
    assert_eq!(job.interactive_per_1k, Some(m("20")));
    assert_eq!(job.interactive_per_m_tokens, Some(m("20")));
}

/// A scrape interval of a watched server on a p4d.24xlarge, priced by hand: `minutes` at
/// `cents_an_hour`.
fn watched(
    server: &str,
    model: &str,
    at_min: i64,
    minutes: i64,
    cents_an_hour: i64,
) -> ReplicaSpan {
    let mut s = span(at_min, 1, ReplicaState::Ready, minutes, 0);
    s.pool = model.into();
    s.server = Some(server.into());
    s.cost = Money::from_cents(cents_an_hour * minutes / 60);
    (s.min_replicas, s.max_replicas) = (1, 1);
    s
}

#[test]
fn watched_servers_by_hand_with_their_levers() {
    let mut spans = Vec::new();
    // `a` and `b` serve llama for an hour in 15-minute scrapes at $1 an hour: `a` busy 6
    // minutes of each with 10 requests, `b` 1.5 minutes with 2.
    for i in 0..4 {
        let mut a = watched("a", "llama", i * 15, 15, 100);
        (a.busy_ms, a.requests) = (6 * MINUTE_MS, 10);
        (a.input_tokens, a.output_tokens) = (1000, 250);
        let mut b = watched("b", "llama", i * 15, 15, 100);
        (b.busy_ms, b.requests) = (90_000, 2);
        spans.extend([a, b]);
    }
    // `c` serves qwen in 10-minute scrapes at $1.20 an hour: 50 quiet minutes, 10 busy ones,
    // 20 quiet ones; then, after a scrape gap, 10 quiet minutes (too short to count).
    for i in 0..8 {
        let mut c = watched("c", "qwen", i * 10, 10, 120);
        if i == 5 {
            (c.busy_ms, c.requests) = (5 * MINUTE_MS, 10);
        }
        spans.push(c);
    }
    spans.push(watched("c", "qwen", 100, 10, 120));
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = crate::ledger::testing::fresh(dir.path());
    ledger.append_with_spans("watch", &[], &spans).unwrap();
    let r = Report::build(&ledger, &Catalog::builtin().unwrap(), Window::default()).unwrap();
    assert_eq!(
        r.total,
        Money::ZERO,
        "spans add nothing to the events' money"
    );
    assert!(r.pools.is_empty(), "watched servers are not pools");
    let names: Vec<&str> = r.servers.iter().map(|s| s.server.as_str()).collect();
    assert_eq!(names, ["c", "a", "b"], "dearest first");
    let a = &r.servers[1];
    assert_eq!((a.workload.as_str(), a.model.as_str()), ("chat", "llama"));
    assert_eq!((a.hours, a.cost, a.busy_share), (1.0, m("1"), Some(0.4)));
    assert_eq!((a.idle_cost, a.requests), (m("0.6"), 40));
    assert_eq!((a.input_tokens, a.output_tokens), (4000, 1000));
    assert_eq!(a.per_1k, Some(m("25")));
    assert_eq!(a.per_m_tokens, Some(m("200")));
    assert_eq!(a.busy_per_1k, Some(m("10")), "the busy part only");
    assert_eq!(a.gpu_memory_gib, Some(3.0));
    // llama's load is 0.4 + 0.1 server-hours: one server carries it at 70%, so `b`, the
    // less busy, goes, at its whole cost; `a` keeps only its instance flag.
    let flags = |s: &ServerLine| s.right_sizing.iter().map(|f| f.flag).collect::<Vec<_>>();
    let b = &r.servers[2];
    assert_eq!(flags(b), [Sizing::Consolidate]);
    assert_eq!(b.right_sizing[0].dollars, m("1"));
    assert!(b.right_sizing[0].action.contains("to a and stop it"));
    assert_eq!(flags(a), [Sizing::OversizedInstance]);
    assert_eq!(a.right_sizing[0].instead.as_deref(), Some("g5g.xlarge"));
    // `c`: a pool stops 5 minutes into each quiet stretch of 15 or more: 45 of the first
    // 50 minutes ($1.00) and 15 of the next 20 ($0.40) are $0.90 + $0.30.
    let c = &r.servers[0];
    assert_eq!(flags(c), [Sizing::ScaleToZero, Sizing::OversizedInstance]);
    assert_eq!(c.right_sizing[0].dollars, m("1.2"));
    assert_eq!((c.hours, c.cost, c.requests), (1.5, m("1.8"), 10));
    let lever = |name: &str| r.levers.iter().find(|l| l.lever == name).map(|l| l.dollars);
    assert_eq!(lever("consolidate watched servers"), Some(m("1")));
    assert_eq!(lever("scale watched servers to zero"), Some(m("1.2")));
    assert!(lever("right-size watched servers").is_some());
}

/// Issue 34: the report estimates the wrong-hit rate of the semantic hits a verifier let
/// through, per workload and model, beside the bound each was served under.
#[test]
fn verified_semantic_hits_give_a_wrong_hit_rate_with_its_interval_and_bound() {
    let hit = |workload: &str, model: &str, ts: Millis, wrong: Option<f64>| {
        let mut e = inference(workload, model, 1, "0");
        (e.ts_ms, e.saved, e.lever) = (ts, m("0.001"), Some(crate::event::Lever::SemanticCache));
        e.wrong_chance = wrong;
        e
    };
    // chat/small: 100 hits at 2% each, over two hours; one hit no verifier judged.
    let mut events: Vec<Event> = (0..100)
        .map(|i| hit("chat", "small", T0 + i * 60_000, Some(0.02)))
        .collect();
    events.push(hit("chat", "small", T0, None));
    // api/llama: 10,000 hits at 2%, under a bound of its own.
    events.extend((0..10_000).map(|i| hit("api", "llama", T0 + i, Some(0.02))));
    events.push(inference("api", "plain", 5, "1"));
    let (_dir, ledger) = ledger_with(&events);
    let options = Options {
        error_budgets: ErrorBudgets {
            default: Some(0.01),
            by_model: [("llama".to_owned(), 0.03)].into(),
        },
        ..Options::default()
    };
    let catalog = Catalog::builtin().unwrap();
    let r = Report::build_with(&ledger, &catalog, Window::default(), options).unwrap();
    let line = |model: &str| {
        r.inference
            .iter()
            .find(|l| l.model.as_deref() == Some(model))
            .unwrap()
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    let small = line("small").semantic.unwrap();
    assert_eq!(small.verified_hits, 100);
    assert!(close(small.expected_wrong, 2.0), "{small:?}");
    assert!(close(small.wrong_rate, 0.02), "{small:?}");
    // ± 1.96 · sqrt(100 · 0.02 · 0.98) / 100 = ± 2.744%, clamped at 0.
    assert_eq!(small.wrong_low, 0.0);
    assert!(close(small.wrong_high, 0.04744), "{small:?}");
    assert_eq!(small.max_error, Some(0.01));
    let llama = line("llama").semantic.unwrap();
    assert_eq!(llama.verified_hits, 10_000);
    assert!(close(llama.wrong_rate, 0.02), "{llama:?}");
    assert!(close(llama.wrong_low, 0.017256), "{llama:?}");
    assert!(close(llama.wrong_high, 0.022744), "{llama:?}");
    assert_eq!(llama.max_error, Some(0.03));
    assert!(
        line("plain").semantic.is_none(),
        "no verified hits, no estimate"
    );
    // The whole window: 10,100 hits at 2%; the lines' bounds differ, so none is shown.
    let all = r.semantic.unwrap();
    assert_eq!(all.verified_hits, 10_100);
    assert!(close(all.wrong_rate, 0.02), "{all:?}");
    assert_eq!(all.max_error, None);
    let by_model = r
        .models
        .iter()
        .find(|l| l.model.as_deref() == Some("llama"));
    assert_eq!(by_model.unwrap().semantic, Some(llama));
    // JSON carries the fields docs/json.md names.
    let json = serde_json::to_value(&r).unwrap();
    let lines = json["inference"].as_array().unwrap();
    let llama_json = lines.iter().find(|l| l["model"] == "llama").unwrap();
    let fields = &llama_json["semantic"];
    for key in [
        "verified_hits",
        "expected_wrong",
        "wrong_rate",
        "wrong_low",
        "wrong_high",
        "max_error",
    ] {
        assert!(!fields[key].is_null(), "{key} in {fields}");
    }
    // Without a bound the report shows none.
    let r = Report::build(&ledger, &catalog, Window::default()).unwrap();
    assert_eq!(r.semantic.unwrap().max_error, None);
}

crate::ledger::testing::on_postgres!(
    verified_semantic_hits_give_a_wrong_hit_rate_with_its_interval_and_bound,
    unit_costs_by_hand,
    a_window_counts_the_cost_incurred_inside_it,
    the_series_spreads_long_segments_over_hours,
    a_steady_on_demand_baseline_is_priced_at_the_reserved_rate,
    an_empty_ledger_reports_nothing_without_failing,
    rollups_match_the_raw_events_exactly,
    a_pool_by_hand_against_a_fixed_pool_of_its_largest_size,
    pools_busy_below_the_threshold_and_on_oversized_instances_are_flagged,
    a_window_without_spans_has_no_pools_and_one_cuts_them_by_the_hour,
    a_batch_job_on_spot_is_priced_per_unit_beside_the_models_interactive_traffic,
    watched_servers_by_hand_with_their_levers,
);

/// Several tenants, models, workloads and days, one request without a key: each way of
/// grouping adds up, to the nano-dollar, to the report's total.
#[test]
fn spend_by_tenant_model_workload_and_day_adds_up_to_the_total() {
    let event = |day: i64, tenant: Option<&str>, workload: &str, model: &str, cost: &str| {
        let mut e = inference(workload, model, 1, cost);
        e.ts_ms = T0 + day * DAY_MS;
        e.tenant = tenant.map(Into::into);
        e.input_tokens = 100;
        e
    };
    let events = [
        event(0, Some("acme"), "chat", "small", "0.003802071"),
        event(0, Some("acme"), "chat", "large", "1.25"),
        event(1, Some("acme"), "code", "large", "0.000000450"),
        event(0, Some("globex"), "code", "large", "2.5"),
        event(1, Some("globex"), "chat", "small", "0.000012"),
        event(1, None, "chat", "small", "0.75"),
    ];
    let (_dir, ledger) = ledger_with(&events);
    let catalog = Catalog::builtin().unwrap();
    let spend = |by| {
        let options = Options {
            by: Some(by),
            ..Options::default()
        };
        let r = Report::build_with(&ledger, &catalog, Window::default(), options).unwrap();
        let spend = r.spend.unwrap();
        let sum: Money = spend.lines.iter().map(|l| l.cost).sum();
        assert_eq!((sum, spend.total), (r.total, r.total), "{by:?}");
        spend
            .lines
            .iter()
            .map(|l| {
                (
                    l.name.clone().unwrap_or_default(),
                    l.cost.to_decimal(),
                    l.events,
                )
            })
            .collect::<Vec<_>>()
    };
    let rows = |r: &[(&str, &str, u64)]| {
        r.iter()
            .map(|(n, c, e)| (n.to_string(), c.to_string(), *e))
            .collect::<Vec<_>>()
    };
    assert_eq!(m("4.503814521"), events.iter().map(|e| e.cost).sum());
    assert_eq!(
        spend(By::Tenant),
        rows(&[
            ("globex", "2.500012", 2),
            ("acme", "1.253802521", 3),
            ("", "0.75", 1)
        ])
    );
    assert_eq!(
        spend(By::Model),
        rows(&[("large", "3.75000045", 3), ("small", "0.753814071", 3)])
    );
    assert_eq!(
        spend(By::Workload),
        rows(&[("code", "2.50000045", 2), ("chat", "2.003814071", 4)])
    );
    let day = |d: i64| utc(T0 + d * DAY_MS, "%Y-%m-%d");
    assert_eq!(
        spend(By::Day),
        rows(&[(&day(0), "3.753802071", 3), (&day(1), "0.75001245", 3)])
    );
}
