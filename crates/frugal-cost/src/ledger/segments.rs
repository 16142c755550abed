//! Training segments that say how they used their accelerators (MFU, precision, stalls):
//! what the report's precision and input-pipeline levers read. They are few (one row per
//! segment of a supervised run) and a partial index holds just them, so reading them costs
//! nothing beside the rollups.

use rusqlite::params;
use serde::Serialize;

use super::{Ledger, LedgerError, Window};
use crate::event::{Kind, Precision};
use crate::money::{Millis, Money};

/// The rows the `events_advised` index holds; the query repeats it word for word, which is
/// how SQLite knows the index covers it.
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

impl Ledger {
    /// Calls `visit` for each training segment with watchdog figures that overlaps the whole
    /// hours `window` touches (as the rollups count it), in time order.
    pub fn training_segments(
        &self,
        window: Window,
        mut visit: impl FnMut(&TrainingSegment),
    ) -> Result<u64, LedgerError> {
        let read_err = self.read_err();
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT ts_ms, duration_ms,
                        (SELECT name FROM dims WHERE id = workload),
                        (SELECT name FROM dims WHERE id = run),
                        (SELECT name FROM dims WHERE id = instance),
                        (SELECT name FROM dims WHERE id = region),
                        cost, mfu, precision, data_stall, sync_stall
                 FROM events
                 WHERE {ADVISED} AND kind = ?3 AND ts_ms < ?2 AND ts_ms + duration_ms > ?1
                 ORDER BY ts_ms, id"
            ))
            .map_err(read_err)?;
        let (since, until) = window.whole_hours().bounds();
        let training = Kind::Training.code();
        let mut rows = stmt
            .query(params![since, until, training])
            .map_err(read_err)?;
        let mut n = 0;
        while let Some(r) = rows.next().map_err(read_err)? {
            let precision = match r.get::<_, Option<i64>>(8).map_err(read_err)? {
                None => None,
                Some(c) => Some(Precision::from_code(c).ok_or_else(|| LedgerError::Corrupt {
                    path: self.path.clone(),
                    what: format!("precision {c}"),
                })?),
            };
            let segment = TrainingSegment {
                ts_ms: r.get(0).map_err(read_err)?,
                duration_ms: r.get(1).map_err(read_err)?,
                workload: r.get(2).map_err(read_err)?,
                run: r.get(3).map_err(read_err)?,
                instance_type: r.get(4).map_err(read_err)?,
                region: r.get(5).map_err(read_err)?,
                cost: Money::from_nanos(r.get(6).map_err(read_err)?),
                mfu: r.get(7).map_err(read_err)?,
                precision,
                data_stall: r.get(9).map_err(read_err)?,
                sync_stall: r.get(10).map_err(read_err)?,
            };
            visit(&segment);
            n += 1;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rusqlite::Connection;

    use super::super::{APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION, schema};
    use super::*;
    use crate::event::Event;
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
        let mut ledger = Ledger::open(&dir.path().join("l.sqlite")).unwrap();
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
            .conn
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
