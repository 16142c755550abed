//! Tests that run on both backends: a test opens its ledger with `fresh`, which is a
//! SQLite file unless `on_postgres` runs it, on a database of the shared test server; and
//! the rows both backends' tests of the schema's upgrades write and check.

use std::cell::Cell;
use std::path::Path;

use super::{Ledger, Location, QualityRow, Window};
use crate::event::{Agreement, Event, Kind, Lever, Shadow, Verdict};
use crate::money::Money;
use crate::wrong::Chances;

thread_local! {
    static POSTGRES: Cell<bool> = const { Cell::new(false) };
}

/// A new, empty ledger: `dir/l.sqlite`, or a new database under `on_postgres`.
pub(crate) fn fresh(dir: &Path) -> Ledger {
    let location = if POSTGRES.get() {
        Location::Postgres(frugal_testkit::postgres::database())
    } else {
        Location::Sqlite(dir.join("l.sqlite"))
    };
    Ledger::open(location).unwrap()
}

/// Runs `test` with its ledgers on PostgreSQL.
pub(crate) fn run_on_postgres(test: fn()) {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            POSTGRES.set(false);
        }
    }
    POSTGRES.set(true);
    let _reset = Reset;
    test();
}

/// A semantic hit of workload `chat` (no model) that a verifier judged `wrong`.
pub(crate) fn semantic_hit(ts: i64, wrong: Option<f64>) -> Event {
    let mut e = crate::test_events::event(ts, 0);
    e.model = None;
    (e.saved, e.lever) = (Money::from_nanos(10), Some(Lever::SemanticCache));
    e.wrong_chance = wrong;
    e
}

/// The rollups' verified hits, expected wrong and variance, summed.
pub(crate) fn wrong_sums(ledger: &Ledger) -> (i64, Chances, Chances) {
    let mut sums = (0, Chances::ZERO, Chances::ZERO);
    ledger
        .rollups(Window::default(), |_, s| {
            sums.0 += s.verified_hits;
            sums.1 += s.expected_wrong;
            sums.2 += s.wrong_variance;
        })
        .unwrap();
    sums
}

/// A v9 ledger's rollup row: hour 0, inference, workload 1, no other names; one event
/// of 7 nano-dollars at 5 ms that the semantic cache saved 30 on (35 columns, in order).
pub(crate) const V9_ROLLUP: &str = "INSERT INTO rollup VALUES (0, 0, 1, 0, 0, 0,
    0, 0, 0, 1, 1, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 5, 5, 0, 30, 0, 0, 0);";

/// After the v9 ledger of `V9_ROLLUP` gained a hit of the same key, wrong with chance
/// 0.25: the old row reads without one, and its rollup row kept its sums.
pub(crate) fn v9_rows_kept(ledger: &Ledger) {
    let mut seen = Vec::new();
    ledger
        .scan(Window::default(), |r| {
            seen.push((r.ts_ms, r.cost, r.wrong_chance))
        })
        .unwrap();
    seen.sort_by_key(|(ts, ..)| *ts);
    assert_eq!(
        seen,
        [
            (5, Money::from_nanos(7), None),
            (10, Money::ZERO, Some(0.25))
        ]
    );
    let mut rows = Vec::new();
    ledger
        .rollups(Window::default(), |_, s| {
            rows.push((s.events, s.cost, s.saved_semantic, s.verified_hits));
        })
        .unwrap();
    let kept = (2, Money::from_nanos(7), Money::from_nanos(40), 1);
    assert_eq!(rows, [kept], "one key, its v9 sums kept");
    let (_, expected, variance) = wrong_sums(ledger);
    assert_eq!(expected, Chances::from_f64(0.25));
    assert_eq!(variance, Chances::from_f64(0.1875));
}

/// A shadow's rows of workload `chat` and model `route` at `ts`: the reference call's (its
/// cost, in nano-dollars) and, unless `verdict` is `None`, its sample's (cost 0).
pub(crate) fn shadow_rows(ts: i64, cost: i64, verdict: Option<Verdict>) -> Vec<Event> {
    let row = |cost, verdict| {
        let mut e = Event::new(ts, Kind::Inference, "chat", Money::from_nanos(cost));
        e.model = Some("route".into());
        e.requests = 0;
        e.shadow = Some(Shadow {
            lever: Lever::Routing,
            verdict,
        });
        e
    };
    let mut rows = vec![row(cost, None)];
    rows.extend(verdict.map(|v| row(0, Some(v))));
    rows
}

/// After `shadow_rows` at `ts` 1..=`n` (every third disagreeing by embedding, the rest
/// agreeing exactly; one call failed, with no sample), the ledger's quality line and its
/// export: what `append` stored, read back on either backend.
pub(crate) fn shadows_stored(ledger: &mut Ledger, n: i64) {
    let verdict = |i: i64| Verdict {
        agreed: i % 3 != 0,
        method: if i % 3 == 0 {
            Agreement::Embedding
        } else {
            Agreement::Exact
        },
    };
    let mut rows: Vec<Event> = (1..=n)
        .flat_map(|i| shadow_rows(i, 5, Some(verdict(i))))
        .collect();
    rows.extend(shadow_rows(n + 1, 7, None));
    ledger.append("meter", &rows).unwrap();
    let disagreed = (1..=n).filter(|i| i % 3 == 0).count() as u64;
    let got = ledger.quality(Window::default()).unwrap();
    assert_eq!(
        got,
        [QualityRow {
            lever: Lever::Routing,
            workload: "chat".into(),
            model: Some("route".into()),
            samples: n as u64,
            agreed: n as u64 - disagreed,
            cost: Money::from_nanos(5 * n + 7),
            methods: vec![Agreement::Exact, Agreement::Embedding],
        }]
    );
    let exported = ledger.store.export_events(i64::MIN, i64::MAX).unwrap();
    let shadows: Vec<_> = exported.iter().filter_map(|s| s.event.shadow).collect();
    assert_eq!(shadows.len(), 2 * n as usize + 1);
    assert_eq!(shadows[1].verdict, Some(verdict(1)));
}

/// `#[test]`s named after the given tests, running them on PostgreSQL.
macro_rules! on_postgres {
    ($($test:ident),+ $(,)?) => {
        mod on_postgres {
            $(
                #[test]
                fn $test() {
                    crate::ledger::testing::run_on_postgres(super::$test);
                }
            )+
        }
    };
}
pub(crate) use on_postgres;
