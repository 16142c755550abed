//! Tests that run on both backends: a test opens its ledger with `fresh`, which is a
//! SQLite file unless `on_postgres` runs it, on a database of the shared test server; and
//! the rows both backends' tests of the schema's upgrades write and check.

use std::cell::Cell;
use std::path::Path;

use super::{Ledger, Location, Window};
use crate::event::{Event, Lever};
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
