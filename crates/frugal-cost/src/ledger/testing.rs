//! Tests that run on both backends: a test opens its ledger with `fresh`, which is a
//! SQLite file unless `on_postgres` runs it, on a database of the shared test server.

use std::cell::Cell;
use std::path::Path;

use super::{Ledger, Location};

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
