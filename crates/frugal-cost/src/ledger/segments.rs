//! Training segments that say how they used their accelerators (MFU, precision, stalls):
//! what the report's precision and input-pipeline levers read. They are few (one row per
//! segment of a supervised run) and a partial index holds just them, so reading them costs
//! nothing beside the rollups.

use serde::Serialize;

use crate::event::Precision;
use crate::money::{Millis, Money};

/// The rows the `events_advised` index holds; the query repeats it word for word, which is
/// how SQLite (and PostgreSQL) know the index covers it.
pub(super) const ADVISED: &str = "(mfu IS NOT NULL OR precision IS NOT NULL OR data_stall IS NOT NULL OR sync_stall IS NOT NULL)";

/// One training segment with what its watchdog measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainingSegment {
    pub ts_ms: Millis,
    pub duration_ms: Millis,
    pub workload: String,
    pub run: Option<String>,
    pub instance_type: Option<String>,
    pub region: Option<String>,
    pub cost: Money,
    pub mfu: Option<f64>,
    pub precision: Option<Precision>,
    pub data_stall: Option<f64>,
    pub sync_stall: Option<f64>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rusqlite::Connection;

    use super::super::sqlite::{APPLICATION_ID, MIGRATIONS, schema};
    use super::super::{Ledger, SCHEMA_VERSION, Window};
    use super::*;
    use crate::event::{Event, Kind};
    use crate::rollup::HOUR_MS;

    fn segment(ts: Millis, minutes: i64) -> Event {
        let mut e = Event::new(ts, Kind::Training, "lm", Money::from_cents(100));
        e.duration_ms = minutes * 60_000;
        e.run_id = Some("r1".into());
        e.instance_type = Some("p4d.24xlarge".into());
        e
    }

    #[test]
    fn a_v5_ledger_gains_the_watchdogs_figures_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.sqlite");
        {
            // A ledger as frugal wrote it before the advisor.
            let conn = Connection::open(&path).unwrap();
            for m in &MIGRATIONS[..5] {
                conn.execute_batch(&schema(m)).unwrap();
            }
            conn.execute_batch(&format!(
                "PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = 5;
                 INSERT INTO dims (id, axis, name) VALUES (1, 0, 'lm');
                 INSERT INTO imports (id, at_ms, source, format, rows)
                     VALUES (1, 1000, 'frugal train', 'api', 1);
                 INSERT INTO events (ts_ms, duration_ms, kind, workload, instances, requests,
                     input_tokens, output_tokens, cached_tokens, cost, lost_ms, import)
                     VALUES (5, 60000, 1, 1, 1, 0, 0, 0, 0, 7, 0, 1);"
            ))
            .unwrap();
        }
        let mut ledger = Ledger::open(&path).unwrap();
        let mut advised = segment(10, 30);
        advised.mfu = Some(0.031);
        advised.precision = Some(Precision::Fp32);
        advised.data_stall = Some(0.4);
        advised.sync_stall = Some(0.05);
        ledger.append("frugal train", &[advised]).unwrap();
        let info = ledger.info().unwrap();
        assert_eq!((info.schema_version, info.events), (SCHEMA_VERSION, 2));
        let mut seen = Vec::new();
        let n = ledger
            .training_segments(Window::default(), |s| seen.push(s.clone()))
            .unwrap();
        assert_eq!(n, 1, "the old row has no figures: {seen:?}");
        assert_eq!(
            seen[0],
            TrainingSegment {
                ts_ms: 10,
                duration_ms: 1_800_000,
                workload: "lm".into(),
                run: Some("r1".into()),
                instance_type: Some("p4d.24xlarge".into()),
                region: None,
                cost: Money::from_cents(100),
                mfu: Some(0.031),
                precision: Some(Precision::Fp32),
                data_stall: Some(0.4),
                sync_stall: Some(0.05),
            }
        );
    }

    #[test]
    fn segments_overlapping_the_windows_hours_are_read_through_their_index() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(dir.path().join("l.sqlite")).unwrap();
        let advised = |ts, minutes| {
            let mut e = segment(ts, minutes);
            e.data_stall = Some(0.1);
            e
        };
        // Before the window's hours; from the hour before into them; inside; after.
        let events = [
            advised(0, 30),
            advised(2 * HOUR_MS - 600_000, 20),
            advised(2 * HOUR_MS + 60_000, 5),
            advised(4 * HOUR_MS, 5),
            // Without figures: not an advised segment.
            segment(2 * HOUR_MS, 5),
        ];
        ledger.append("t", &events).unwrap();
        let window = Window {
            since_ms: Some(2 * HOUR_MS + 1),
            until_ms: Some(3 * HOUR_MS),
        };
        let mut starts = Vec::new();
        ledger
            .training_segments(window, |s| starts.push(s.ts_ms))
            .unwrap();
        assert_eq!(starts, [2 * HOUR_MS - 600_000, 2 * HOUR_MS + 60_000]);
        let plan: String = ledger
            .sqlite_conn()
            .prepare(&format!(
                "EXPLAIN QUERY PLAN SELECT cost FROM events
                 WHERE {ADVISED} AND ts_ms < 1 AND ts_ms + duration_ms > 0"
            ))
            .unwrap()
            .query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(plan.contains("events_advised"), "{plan}");
    }
}
