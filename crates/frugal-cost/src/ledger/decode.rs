//! The ledger's reads, decoded once for both backends: each backend's result row is
//! `Columns` (typed reads by index), and the functions here build `Row`, `ReplicaSpan`,
//! `TrainingSegment` and `ExportRow` from it. The queries they decode are here too, with
//! `#n` where a backend writes its placeholder `n`.

use super::segments::ADVISED;
use super::{ExportRow, LedgerError, Row, TrainingSegment, from_code, span_key};
use crate::event::{Capacity, Kind, Outcome, Precision, ReplicaSpan, ReplicaState};
use crate::money::{Millis, Money};
use crate::rollup;

/// Why a row could not be decoded: the backend could not read a column (`E`), or a stored
/// value is one the schema does not allow (named).
pub(super) enum Unread<E> {
    Read(E),
    Corrupt(String),
}

impl<E> Unread<E> {
    /// The ledger's error: a read error through `read`, a stored value through `corrupt`.
    pub(super) fn into_error(
        self,
        read: impl FnOnce(E) -> LedgerError,
        corrupt: impl FnOnce(String) -> LedgerError,
    ) -> LedgerError {
        match self {
            Unread::Read(source) => read(source),
            Unread::Corrupt(what) => corrupt(what),
        }
    }
}

/// Typed reads of one result row's columns, by index.
pub(super) trait Columns {
    type Error;
    fn int(&self, i: usize) -> Result<i64, Unread<Self::Error>>;
    fn opt_int(&self, i: usize) -> Result<Option<i64>, Unread<Self::Error>>;
    fn opt_real(&self, i: usize) -> Result<Option<f64>, Unread<Self::Error>>;
    fn text(&self, i: usize) -> Result<String, Unread<Self::Error>>;
    fn opt_text(&self, i: usize) -> Result<Option<String>, Unread<Self::Error>>;
    fn opt_blob(&self, i: usize) -> Result<Option<Vec<u8>>, Unread<Self::Error>>;
}

/// Implements `Columns` for a backend's row through its `$get` (`get` or `try_get`).
macro_rules! columns {
    ($row:ty, $error:ty, $get:ident) => {
        impl Columns for $row {
            type Error = $error;
            fn int(&self, i: usize) -> Result<i64, Unread<$error>> {
                self.$get(i).map_err(Unread::Read)
            }
            fn opt_int(&self, i: usize) -> Result<Option<i64>, Unread<$error>> {
                self.$get(i).map_err(Unread::Read)
            }
            fn opt_real(&self, i: usize) -> Result<Option<f64>, Unread<$error>> {
                self.$get(i).map_err(Unread::Read)
            }
            fn text(&self, i: usize) -> Result<String, Unread<$error>> {
                self.$get(i).map_err(Unread::Read)
            }
            fn opt_text(&self, i: usize) -> Result<Option<String>, Unread<$error>> {
                self.$get(i).map_err(Unread::Read)
            }
            fn opt_blob(&self, i: usize) -> Result<Option<Vec<u8>>, Unread<$error>> {
                self.$get(i).map_err(Unread::Read)
            }
        }
    };
}
columns!(rusqlite::Row<'_>, rusqlite::Error, get);
columns!(postgres::Row, postgres::Error, try_get);

/// A decoding's `Err` for a stored value named `what`.
fn corrupt<E>(what: String) -> Unread<E> {
    Unread::Corrupt(what)
}

/// `sql` with each `#n` as the backend's placeholder `n` (`?n` or `$n`).
pub(super) fn placeholders(sql: &str, mark: &str) -> String {
    sql.replace('#', mark)
}

/// The events that start in `[#1, #2)`, as `row` reads them.
pub(super) const SCAN: &str = "SELECT ts_ms, duration_ms, kind, workload, model, run, instance,
        region, capacity, instances, requests, input_tokens, output_tokens, cached_tokens,
        utilization, cost, input_cost, list_cost, outcome, lost_ms, wait_ms, tenant,
        wrong_chance
 FROM events WHERE ts_ms >= #1 AND ts_ms < #2";

/// One row of `SCAN`.
pub(super) fn row<C: Columns>(r: &C) -> Result<Row, Unread<C::Error>> {
    let code = r.int(2)?;
    let kind = Kind::from_code(code).ok_or_else(|| corrupt(format!("kind {code}")))?;
    let capacity = from_code(r.opt_int(8)?, "capacity", Capacity::from_code).map_err(corrupt)?;
    let outcome = from_code(r.opt_int(18)?, "outcome", Outcome::from_code).map_err(corrupt)?;
    Ok(Row {
        ts_ms: r.int(0)?,
        duration_ms: r.int(1)?,
        kind,
        workload: r.int(3)? as u32,
        model: r.opt_int(4)?.map(|v| v as u32),
        run: r.opt_int(5)?.map(|v| v as u32),
        instance: r.opt_int(6)?.map(|v| v as u32),
        region: r.opt_int(7)?.map(|v| v as u32),
        capacity,
        instances: r.int(9)? as u32,
        requests: r.int(10)? as u64,
        input_tokens: r.int(11)? as u64,
        output_tokens: r.int(12)? as u64,
        cached_tokens: r.int(13)? as u64,
        utilization: r.opt_real(14)?,
        cost: Money::from_nanos(r.int(15)?),
        input_cost: r.opt_int(16)?.map(Money::from_nanos),
        list_cost: r.opt_int(17)?.map(Money::from_nanos),
        outcome,
        lost_ms: r.int(19)?,
        wait_ms: r.int(20)?,
        tenant: r.opt_int(21)?.map(|v| v as u32),
        wrong_chance: r.opt_real(22)?,
    })
}

/// The replica spans that start in `[#1, #2)`, in time order, as `span` reads them.
pub(super) const SPANS: &str = "SELECT s.ts_ms, s.duration_ms, w.name, p.name, s.replica,
        s.state, s.busy_ms, s.cost, i.name, s.min_replicas, s.max_replicas, s.need_bytes,
        s.failed, v.name, s.requests, s.input_tokens, s.output_tokens, s.row_hash
 FROM replica_spans s
 JOIN dims w ON w.id = s.workload
 JOIN dims p ON p.id = s.pool
 LEFT JOIN dims i ON i.id = s.instance
 LEFT JOIN dims v ON v.id = s.server
 WHERE s.ts_ms >= #1 AND s.ts_ms < #2
 ORDER BY s.ts_ms, s.id";

/// One row of `SPANS`.
pub(super) fn span<C: Columns>(r: &C) -> Result<ReplicaSpan, Unread<C::Error>> {
    let code = r.int(5)?;
    let state =
        ReplicaState::from_code(code).ok_or_else(|| corrupt(format!("replica state {code}")))?;
    let count = |i: usize| r.int(i).map(|v| v.max(0) as u64);
    Ok(ReplicaSpan {
        id: span_key(r.opt_blob(17)?).map_err(corrupt)?,
        ts_ms: r.int(0)?,
        duration_ms: r.int(1)?,
        workload: r.text(2)?,
        pool: r.text(3)?,
        replica: r.int(4)? as u32,
        state,
        busy_ms: r.int(6)?,
        cost: Money::from_nanos(r.int(7)?),
        instance_type: r.opt_text(8)?,
        min_replicas: r.int(9)? as u32,
        max_replicas: r.int(10)? as u32,
        need_bytes: r.opt_int(11)?.map(|b| b.max(0) as u64),
        failed: r.int(12)? != 0,
        server: r.opt_text(13)?,
        requests: count(14)?,
        input_tokens: count(15)?,
        output_tokens: count(16)?,
    })
}

/// The training segments with what their watchdog measured that overlap `[#1, #2)`, in
/// time order, as `segment` reads them; `#3` is `Kind::Training`'s code.
pub(super) fn segments_query() -> String {
    format!(
        "SELECT ts_ms, duration_ms,
                (SELECT name FROM dims WHERE id = workload),
                (SELECT name FROM dims WHERE id = run),
                (SELECT name FROM dims WHERE id = instance),
                (SELECT name FROM dims WHERE id = region),
                cost, mfu, precision, data_stall, sync_stall
         FROM events
         WHERE {ADVISED} AND kind = #3 AND ts_ms < #2 AND ts_ms + duration_ms > #1
         ORDER BY ts_ms, id"
    )
}

/// One row of `segments_query`.
pub(super) fn segment<C: Columns>(r: &C) -> Result<TrainingSegment, Unread<C::Error>> {
    let precision = from_code(r.opt_int(8)?, "precision", Precision::from_code).map_err(corrupt)?;
    Ok(TrainingSegment {
        ts_ms: r.int(0)?,
        duration_ms: r.int(1)?,
        workload: r.text(2)?,
        run: r.opt_text(3)?,
        instance_type: r.opt_text(4)?,
        region: r.opt_text(5)?,
        cost: Money::from_nanos(r.int(6)?),
        mfu: r.opt_real(7)?,
        precision,
        data_stall: r.opt_real(9)?,
        sync_stall: r.opt_real(10)?,
    })
}

/// One row of `EXPORT`, its columns read by type.
pub(super) fn export<C: Columns>(r: &C) -> Result<ExportRow, Unread<C::Error>> {
    let mut row = ExportRow {
        ints: [None; ExportRow::COLUMNS],
        names: Default::default(),
        floats: [None; 5],
        key: r.opt_blob(ExportRow::KEY)?,
    };
    for i in 0..ExportRow::COLUMNS {
        if ExportRow::NAMES.contains(&i) || ExportRow::FLOATS.contains(&i) || i == ExportRow::KEY {
            continue;
        }
        row.ints[i] = r.opt_int(i)?;
    }
    for (slot, &i) in ExportRow::NAMES.iter().enumerate() {
        row.names[slot] = r.opt_text(i)?;
    }
    for (slot, &i) in ExportRow::FLOATS.iter().enumerate() {
        row.floats[slot] = r.opt_real(i)?;
    }
    Ok(row)
}

/// A pool's requests that start in `[#1, #2)`: events of kind `#3` whose workload (axis
/// `#4`) is `#5` and model (axis `#6`) is `#7`, those with outcome `#8` left out; the
/// values are `PoolRequests`.
const POOL_REQUESTS: &str = "FROM events
     WHERE ts_ms >= #1 AND ts_ms < #2 AND kind = #3
       AND workload = (SELECT id FROM dims WHERE axis = #4 AND name = #5)
       AND model = (SELECT id FROM dims WHERE axis = #6 AND name = #7)
       AND (outcome IS NULL OR outcome <> #8)";

/// How many of a pool's requests there are, and how many of them waited.
pub(super) fn waits_counted() -> String {
    format!("SELECT count(*), count(CASE WHEN wait_ms > 0 THEN 1 END) {POOL_REQUESTS}")
}

/// The wait at offset `#9` among a pool's requests that waited, shortest first.
pub(super) fn wait_at() -> String {
    format!("SELECT wait_ms {POOL_REQUESTS} AND wait_ms > 0 ORDER BY wait_ms LIMIT 1 OFFSET #9")
}

/// The rollup rows of the hours in `[#1, #2)`, as `rollup` reads them.
pub(super) const ROLLUPS: &str = "SELECT * FROM rollup WHERE hour_ms >= #1 AND hour_ms < #2";

/// One row of `ROLLUPS`: its `rollup::COLUMNS` values.
pub(super) fn rollup<C: Columns>(r: &C) -> Result<[i64; rollup::COLUMNS], Unread<C::Error>> {
    let mut values = [0i64; rollup::COLUMNS];
    for (i, v) in values.iter_mut().enumerate() {
        *v = r.int(i)?;
    }
    Ok(values)
}

/// Nearest-rank percentiles (`percents` in 1..=100) of `all` waits of which `waited` are
/// above zero; `nth(offset)` reads the `offset`-th (from 0) of those above zero, in order.
pub(super) fn wait_ranks<E>(
    all: i64,
    waited: i64,
    percents: &[u32],
    mut nth: impl FnMut(i64) -> Result<Millis, E>,
) -> Result<Vec<Option<Millis>>, E> {
    let not_waited = all - waited;
    percents
        .iter()
        .map(|&p| {
            let rank = (u64::from(p.clamp(1, 100)) * all.max(0) as u64).div_ceil(100) as i64;
            Ok(if all == 0 {
                None
            } else if rank <= not_waited {
                Some(0)
            } else {
                Some(nth(rank - not_waited - 1)?)
            })
        })
        .collect()
}
