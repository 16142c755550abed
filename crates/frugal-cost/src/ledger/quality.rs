//! Shadows' rows in the ledger (`Event::shadow`): their three columns, and the read that
//! sums them per lever, workload and model for the report's quality line.

use super::decode::{Columns, Unread};
use super::from_code;
use crate::event::{Agreement, Event, Lever, Shadow, Verdict};
use crate::money::Money;

/// `Event::shadow` as its columns: `shadow_lever`, `shadow_agreed` (0 or 1),
/// `shadow_method`.
pub(super) fn shadow_codes(e: &Event) -> [Option<i64>; 3] {
    let Some(s) = e.shadow else {
        return [None; 3];
    };
    let verdict = s.verdict;
    [
        Some(s.lever.code()),
        verdict.map(|v| i64::from(v.agreed)),
        verdict.map(|v| v.method.code()),
    ]
}

/// The columns read back; `Err` names a value the schema does not allow.
pub(super) fn shadow_from_codes(codes: [Option<i64>; 3]) -> Result<Option<Shadow>, String> {
    let Some(lever) = from_code(codes[0], "shadow lever", Lever::from_code)? else {
        return Ok(None);
    };
    let method = from_code(codes[2], "shadow method", Agreement::from_code)?;
    let verdict = match (codes[1], method) {
        (None, None) => None,
        (Some(a @ (0 | 1)), Some(method)) => Some(Verdict {
            agreed: a == 1,
            method,
        }),
        (a, m) => return Err(format!("shadow verdict {a:?} by {m:?}")),
    };
    Ok(Some(Shadow { lever, verdict }))
}

/// What the shadows of one lever found for one workload and model (a cascade's route, or
/// the served name a cache answered for), over a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QualityRow {
    pub lever: Lever,
    pub workload: String,
    pub model: Option<String>,
    /// Quality samples (comparisons made), and of them those that agreed.
    pub samples: u64,
    pub agreed: u64,
    /// What the reference calls cost.
    pub cost: Money,
    /// How the samples were compared, each method once.
    pub methods: Vec<Agreement>,
}

/// The shadows' rows that start in `[#1, #2)`, summed per lever, workload and model.
pub(super) const QUALITY: &str = "SELECT e.shadow_lever, w.name, m.name,
        COUNT(e.shadow_agreed), CAST(COALESCE(SUM(e.shadow_agreed), 0) AS BIGINT),
        CAST(SUM(e.cost) AS BIGINT), MIN(e.shadow_method), MAX(e.shadow_method)
    FROM events e
    JOIN dims w ON w.id = e.workload
    LEFT JOIN dims m ON m.id = e.model
    WHERE e.shadow_lever IS NOT NULL AND e.ts_ms >= #1 AND e.ts_ms < #2
    GROUP BY e.shadow_lever, w.name, m.name
    ORDER BY e.shadow_lever, w.name, m.name";

/// One row of `QUALITY`.
pub(super) fn quality<C: Columns>(r: &C) -> Result<QualityRow, Unread<C::Error>> {
    let code = |i| -> Result<Option<Agreement>, Unread<C::Error>> {
        from_code(r.opt_int(i)?, "shadow method", Agreement::from_code).map_err(Unread::Corrupt)
    };
    let lever = from_code(Some(r.int(0)?), "shadow lever", Lever::from_code)
        .map_err(Unread::Corrupt)?
        .unwrap_or(Lever::Routing);
    let mut methods: Vec<Agreement> = [code(6)?, code(7)?].into_iter().flatten().collect();
    methods.dedup();
    Ok(QualityRow {
        lever,
        workload: r.text(1)?,
        model: r.opt_text(2)?,
        samples: r.int(3)?.max(0) as u64,
        agreed: r.int(4)?.max(0) as u64,
        cost: Money::from_nanos(r.int(5)?),
        methods,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::testing::{fresh, shadows_stored};

    /// Issue 35, on both backends: shadows' rows stored by a batch big enough for
    /// PostgreSQL's COPY and by a small one, summed per lever, workload and model.
    #[test]
    fn shadows_are_stored_and_summed_by_a_big_batch_and_a_small_one() {
        for n in [200, 4] {
            let dir = tempfile::tempdir().unwrap();
            shadows_stored(&mut fresh(dir.path()), n);
        }
    }

    crate::ledger::testing::on_postgres!(
        shadows_are_stored_and_summed_by_a_big_batch_and_a_small_one
    );

    #[test]
    fn shadows_go_through_their_columns_and_bad_ones_are_named() {
        let mut e = Event::new(0, crate::event::Kind::Inference, "w", Money::ZERO);
        assert_eq!(shadow_codes(&e), [None; 3]);
        for verdict in [
            None,
            Some(Verdict {
                agreed: true,
                method: Agreement::Embedding,
            }),
            Some(Verdict {
                agreed: false,
                method: Agreement::Exact,
            }),
        ] {
            e.shadow = Some(Shadow {
                lever: Lever::SemanticCache,
                verdict,
            });
            assert_eq!(shadow_from_codes(shadow_codes(&e)), Ok(e.shadow));
        }
        assert_eq!(shadow_from_codes([None, Some(1), Some(0)]), Ok(None));
        let bad = shadow_from_codes([Some(2), Some(3), Some(0)]).unwrap_err();
        assert!(bad.starts_with("shadow verdict"), "{bad}");
        assert!(shadow_from_codes([Some(99), None, None]).is_err());
    }
}
