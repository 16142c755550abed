//! Copying a ledger into another (`frugal ledger migrate`: a SQLite file into PostgreSQL),
//! resumably. Events go over in batches, each one transaction on the destination, keyed so
//! a rerun after a kill stores only what is missing: an imported row keeps its content
//! hash, any other event gets a key derived from its row id and content in the source.
//! The record of imported files follows (so a file imported into the source is refused by
//! the destination too), each file once; then spans, with their ids (the gateway's meter
//! gives each one since schema 8), in one transaction recorded under a hash of them all, so
//! older spans, which have none, are copied once too. A copy stopped anywhere (killed, the
//! network gone) is finished by running it again.

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{Ledger, LedgerError, Stored, Window};
use crate::Progress;
use crate::money::Money;

/// What a copy did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Migrated {
    /// Events read from the source.
    pub events: u64,
    /// Of them, stored now; the rest were in the destination already.
    pub copied: u64,
    pub skipped: u64,
    /// Records of imported files stored now (0 when an earlier copy stored them).
    pub files: u64,
    /// Spans stored now (0 when an earlier copy stored them).
    pub spans: u64,
    /// The cost of the events read.
    pub cost: Money,
}

/// The source written on the destination's imports.
const SOURCE: &str = "frugal ledger migrate";

/// A key for an event the source holds without one: the same on every run over the same
/// source, different for every row of it.
fn derived_key(s: &Stored) -> [u8; 16] {
    let mut h = Sha256::new();
    h.update(b"frugal ledger migrate\0");
    h.update(s.row_id.to_le_bytes());
    h.update(s.event.ts_ms.to_le_bytes());
    h.update(s.event.cost.nanos().to_le_bytes());
    h.update(s.event.workload.as_bytes());
    let digest = h.finalize();
    let mut key = [0u8; 16];
    key.copy_from_slice(&digest[..16]);
    key
}

/// Copies every event and span of `from` into `to`, `batch` events a transaction,
/// reporting events read to `progress`.
pub fn migrate(
    from: &Ledger,
    to: &mut Ledger,
    batch: usize,
    progress: &dyn Progress,
) -> Result<Migrated, LedgerError> {
    let mut done = Migrated::default();
    progress.start(from.info()?.events);
    let mut after = i64::MIN;
    loop {
        let rows = from.store.export_events(after, batch.max(1) as i64)?;
        let Some(last) = rows.last() else { break };
        after = last.row_id;
        let (copied, ()) = to.import(SOURCE, "api", |sink| {
            for s in &rows {
                let mut e = s.event.clone();
                e.id = Some(s.key.unwrap_or_else(|| derived_key(s)));
                sink.push(&e)?;
            }
            Ok::<_, LedgerError>(())
        })?;
        done.events += rows.len() as u64;
        done.copied += copied;
        done.skipped += rows.len() as u64 - copied;
        done.cost += rows.iter().map(|s| s.event.cost).sum::<Money>();
        progress.advance(rows.len() as u64);
    }
    let files = from.info()?.files;
    if !files.is_empty() {
        let (_, copied) = to.import(SOURCE, "api", |sink| {
            let mut copied = 0;
            for file in &files {
                copied += u64::from(sink.copy_import(file)?);
            }
            Ok::<_, LedgerError>(copied)
        })?;
        done.files = copied;
    }
    let mut spans = Vec::new();
    from.spans(Window::default(), |s| spans.push(s.clone()))?;
    if !spans.is_empty() {
        let mut h = Sha256::new();
        h.update(b"frugal ledger migrate spans\0");
        for s in &spans {
            h.update(format!("{s:?}\n").as_bytes());
        }
        let mark: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        let (stored, ()) = to.import(SOURCE, "api", |sink| {
            if sink.file_imported(&mark)?.is_some() {
                return Ok::<_, LedgerError>(());
            }
            sink.set_file_sha256(mark.clone());
            for s in &spans {
                sink.push_span(s)?;
            }
            Ok(())
        })?;
        done.spans = stored;
    }
    progress.finish();
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NoProgress;
    use crate::event::{Event, Kind, ReplicaSpan};
    use crate::ledger::{Location, RowHash};
    use crate::report::Report;

    fn event(ts: i64, cents: i64) -> Event {
        Event {
            tenant: Some("acme".into()),
            requests: 2,
            ..crate::test_events::event(ts, cents)
        }
    }

    fn totals(ledger: &Ledger) -> (u64, Money, Vec<(String, Money)>, u64) {
        let info = ledger.info().unwrap();
        let mut rolled = Money::ZERO;
        ledger
            .rollups(Window::default(), |_, s| rolled += s.cost)
            .unwrap();
        assert_eq!(rolled, info.total_cost, "rollups agree with the events");
        let spans = ledger.spans(Window::default(), |_| {}).unwrap();
        (
            info.events,
            info.total_cost,
            ledger.tenant_spend(0).unwrap(),
            spans,
        )
    }

    #[test]
    fn a_sqlite_ledger_is_copied_once_and_a_rerun_copies_only_what_is_new() {
        let dir = tempfile::tempdir().unwrap();
        let mut from = Ledger::open(dir.path().join("l.sqlite")).unwrap();
        let mut advised = event(3_600_000, 7);
        advised.kind = Kind::Training;
        advised.duration_ms = 7_200_000;
        advised.mfu = Some(0.4);
        // A semantic hit a verifier judged: its chance of being wrong goes over too.
        let mut judged = event(2, 6);
        judged.lever = Some(crate::event::Lever::SemanticCache);
        judged.wrong_chance = Some(0.1);
        from.append("serve", &[event(1, 5), judged, advised])
            .unwrap();
        from.import("f.csv", "csv", |sink| {
            sink.push_row(&event(5, 1), RowHash([1; 16]))?;
            sink.push_span(&ReplicaSpan {
                id: Some([5; 16]),
                busy_ms: 10,
                instance_type: Some("g5.xlarge".into()),
                max_replicas: 2,
                ..crate::test_events::span(1, Money::from_cents(1))
            })
        })
        .unwrap();
        let url = frugal_testkit::postgres::database();
        let mut to = Ledger::open(Location::Postgres(url)).unwrap();
        let first = migrate(&from, &mut to, 2, &NoProgress).unwrap();
        assert_eq!(
            (first.events, first.copied, first.skipped, first.spans),
            (4, 4, 0, 1)
        );
        assert_eq!(totals(&from), totals(&to));
        let mut ids = Vec::new();
        to.spans(Window::default(), |s| ids.push(s.id)).unwrap();
        assert_eq!(ids, [Some([5; 16])], "a span keeps its id");
        let catalog = crate::Catalog::builtin().unwrap();
        let report = |l: &Ledger| {
            serde_json::to_value(Report::build(l, &catalog, Window::default()).unwrap()).unwrap()
        };
        assert_eq!(
            report(&from),
            report(&to),
            "the report over both is the same"
        );
        assert_eq!(report(&to)["semantic"]["verified_hits"], 1);
        // A rerun (as after a kill) copies nothing again; new events in the source go over.
        from.append("serve", &[event(9, 3)]).unwrap();
        let again = migrate(&from, &mut to, 2, &NoProgress).unwrap();
        assert_eq!(
            (again.events, again.copied, again.skipped, again.spans),
            (5, 1, 4, 0)
        );
        assert_eq!(totals(&from), totals(&to));
        // The imported row kept its content hash: importing it again is refused there too.
        let (_, found) = to
            .import("again.csv", "csv", |sink| {
                sink.push_row(&event(5, 1), RowHash([1; 16]))
            })
            .unwrap();
        assert!(!found);
    }

    /// Stops after its first batches, as a kill would.
    struct StopAfter(std::cell::Cell<u64>);

    impl Progress for StopAfter {
        fn advance(&self, delta: u64) {
            let left = self.0.get().saturating_sub(delta);
            self.0.set(left);
            if left == 0 {
                std::panic::panic_any("stopped midway");
            }
        }
    }

    /// A copy stopped midway keeps the batches it committed, and running it again copies
    /// the rest, the record of the imported file with them: importing that file into the
    /// destination is then refused, as it is in the source.
    #[test]
    fn a_copy_stopped_midway_finishes_on_rerun_and_refuses_the_file_again() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("usage.csv");
        let mut text = String::from("ts,kind,workload,model,cost_usd\n");
        for i in 0..50 {
            text.push_str(&format!("{},inference,chat,m,0.0{}\n", 1_000 + i, i % 10));
        }
        std::fs::write(&csv, text).unwrap();
        let catalog = crate::Catalog::builtin().unwrap();
        let import = |ledger: &mut Ledger| {
            crate::import::import_file(
                ledger,
                &catalog,
                &csv,
                crate::import::ImportOptions::default(),
                &NoProgress,
            )
        };
        let mut from = Ledger::open(dir.path().join("l.sqlite")).unwrap();
        import(&mut from).unwrap();
        from.append("serve", &[event(9, 3)]).unwrap();
        let url = frugal_testkit::postgres::database();
        let mut to = Ledger::open(Location::Postgres(url)).unwrap();

        let stopped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            migrate(&from, &mut to, 10, &StopAfter(std::cell::Cell::new(20)))
        }));
        assert!(stopped.is_err());
        assert_eq!(
            to.info().unwrap().events,
            20,
            "two batches of ten committed"
        );
        let rest = migrate(&from, &mut to, 10, &NoProgress).unwrap();
        assert_eq!(
            (rest.events, rest.copied, rest.skipped, rest.files),
            (51, 31, 20, 1)
        );
        assert_eq!(totals(&from), totals(&to));
        let again = migrate(&from, &mut to, 10, &NoProgress).unwrap();
        assert_eq!(
            (again.copied, again.files),
            (0, 0),
            "each file recorded once"
        );
        assert_eq!(from.info().unwrap().files, to.info().unwrap().files);
        match import(&mut to) {
            Err(crate::import::ImportError::AlreadyImported { prior, .. }) => {
                assert_eq!(prior.source, csv.display().to_string());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(to.info().unwrap().events, 51);
    }
}
