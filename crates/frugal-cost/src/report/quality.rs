//! Quality beside every saving, measured online: per lever and per workload and served name
//! (a route, or a model), what the lever saved, the share of its shadowed answers that
//! agreed with the reference path's (quality kept) with a 95% Wilson interval and its n,
//! and what the shadows themselves cost.

use serde::Serialize;

use crate::event::{Agreement, Lever};
use crate::ledger::QualityRow;
use crate::money::Money;
use crate::present::{interval, pct1, thousands, usd_unit};

use super::unit::InferenceLine;

/// The z-score of a two-sided 95% interval.
const Z95: f64 = 1.96;

/// One lever's quality on one workload and served name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QualityLine {
    pub lever: Lever,
    pub workload: String,
    /// The route (a cascade's) or the served name (a cache's) the answers went out under.
    pub model: Option<String>,
    /// What the lever saved there over the window.
    pub saved: Money,
    /// Quality samples (answers compared), and of them those that agreed.
    pub samples: u64,
    pub agreed: u64,
    /// `agreed / samples`, and its 95% Wilson interval; `None` with no samples (every
    /// shadow's call failed).
    pub kept: Option<f64>,
    pub kept_low: Option<f64>,
    pub kept_high: Option<f64>,
    /// How the answers were compared: `exact` (after normalising case, whitespace and
    /// punctuation) or `embedding` (cosine of MiniLM embeddings at or above 0.9, a proxy).
    pub methods: Vec<Agreement>,
    /// What the shadows' calls to the reference path cost.
    pub shadow_cost: Money,
}

/// The quality table's columns (`>`: right-aligned), as the terminal and the page show it.
pub const QUALITY_HEAD: [&str; 9] = [
    "lever",
    "workload",
    "route or model",
    "saved>",
    "quality kept>",
    "95% interval>",
    "n>",
    "compared by",
    "shadow cost>",
];

/// What the quality table's figures are, under it.
pub const QUALITY_NOTE: &str = "A sampled share of each lever's answers (shadow_rate) asked \
    again of the reference path (a route's last tier, the model without its caches) and \
    compared: exact, after case, whitespace and punctuation; embedding, a proxy, when the \
    local embedder is loaded: MiniLM cosine >= 0.9. Quality kept: the share that agreed, with \
    its 95% Wilson interval over n samples; shadow cost: what asking again cost.";

impl QualityLine {
    /// Its row of the quality table (`QUALITY_HEAD`), as text.
    pub fn cells(&self) -> Vec<String> {
        let kept = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), pct1);
        let methods: Vec<&str> = self.methods.iter().map(|m| m.as_str()).collect();
        vec![
            self.lever.as_str().to_owned(),
            self.workload.clone(),
            self.model.clone().unwrap_or_else(|| "-".into()),
            usd_unit(self.saved),
            kept(self.kept),
            match (self.kept_low, self.kept_high) {
                (Some(low), Some(high)) => interval(low, high),
                _ => "-".into(),
            },
            thousands(self.samples),
            methods.join(", "),
            usd_unit(self.shadow_cost),
        ]
    }
}

/// The lines of `rows` (as `Ledger::quality` reads them), each beside what its lever saved
/// on the same workload and model in `inference`.
pub(super) fn lines(rows: Vec<QualityRow>, inference: &[InferenceLine]) -> Vec<QualityLine> {
    rows.into_iter()
        .map(|r| {
            let saved = inference
                .iter()
                .filter(|l| l.workload.as_deref() == Some(&r.workload) && l.model == r.model)
                .map(|l| saved_by(r.lever, l))
                .sum();
            let interval = wilson(r.agreed, r.samples);
            QualityLine {
                lever: r.lever,
                saved,
                kept: interval.map(|i| i.0),
                kept_low: interval.map(|i| i.1),
                kept_high: interval.map(|i| i.2),
                workload: r.workload,
                model: r.model,
                samples: r.samples,
                agreed: r.agreed,
                methods: r.methods,
                shadow_cost: r.cost,
            }
        })
        .collect()
}

fn saved_by(lever: Lever, l: &InferenceLine) -> Money {
    let s = &l.saved;
    match lever {
        Lever::Cache => s.cache,
        Lever::SemanticCache => s.semantic_cache,
        Lever::Routing => s.routing,
        Lever::Batching => s.batching,
        Lever::PrefixCache => s.prefix_cache,
    }
}

/// The share `k / n` with its 95% Wilson score interval (good at small n and at shares
/// near 0 or 1, where the normal one is not); `None` for n = 0.
pub fn wilson(k: u64, n: u64) -> Option<(f64, f64, f64)> {
    if n == 0 {
        return None;
    }
    let (k, n) = (k.min(n) as f64, n as f64);
    let p = k / n;
    let z2 = Z95 * Z95;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = Z95 * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / (1.0 + z2 / n);
    Some((p, (centre - half).max(0.0), (centre + half).min(1.0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, Kind, Verdict};
    use crate::ledger::testing::shadow_rows;
    use crate::ledger::{Ledger, Window};
    use crate::report::Report;

    /// A route's saving and its shadows, through the ledger into the report: the saving
    /// beside the quality kept, its interval and n, and the shadows' cost; the shadows'
    /// rows are no requests.
    #[test]
    fn the_report_puts_quality_kept_beside_the_routings_saving() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(dir.path().join("l.sqlite")).unwrap();
        let mut saving = Event::new(1, Kind::Inference, "chat", Money::ZERO);
        saving.model = Some("route".into());
        (saving.saved, saving.lever) = (Money::from_cents(300), Some(Lever::Routing));
        let mut rows = vec![saving];
        for i in 0..10 {
            let verdict = Verdict {
                agreed: i < 8,
                method: Agreement::Exact,
            };
            rows.extend(shadow_rows(2 + i, 1_000, Some(verdict)));
        }
        ledger.append("meter", &rows).unwrap();
        let report = Report::build(
            &ledger,
            &crate::Catalog::builtin().unwrap(),
            Window::default(),
        )
        .unwrap();
        let [line] = &report.quality[..] else {
            panic!("{:?}", report.quality);
        };
        assert_eq!(
            (line.lever, line.workload.as_str(), line.model.as_deref()),
            (Lever::Routing, "chat", Some("route"))
        );
        assert_eq!(
            (line.saved, line.samples, line.agreed),
            (Money::from_cents(300), 10, 8)
        );
        assert_eq!(line.shadow_cost, Money::from_nanos(10_000));
        assert_eq!(line.kept, Some(0.8));
        assert_eq!((line.kept_low, line.kept_high), {
            let (_, low, high) = wilson(8, 10).unwrap();
            (Some(low), Some(high))
        });
        assert_eq!(line.methods, [Agreement::Exact]);
        let cells = line.cells();
        assert_eq!(cells.len(), QUALITY_HEAD.len());
        assert_eq!(
            cells[3..],
            [
                "$3.00",
                "80.0%",
                "49.0% .. 94.3%",
                "10",
                "exact",
                "$0.000010"
            ]
            .map(String::from),
            "{cells:?}"
        );
        let route = report
            .inference
            .iter()
            .find(|l| l.model.as_deref() == Some("route"));
        assert_eq!(
            route.map(|l| l.requests),
            Some(0),
            "shadows are no user's requests"
        );
    }

    /// Wilson's interval by hand (z = 1.96): 8 of 10 gives [0.490, 0.943]; none of 10
    /// still leaves room above 0; all of 10 below 1.
    #[test]
    fn wilson_intervals_by_hand() {
        let (p, low, high) = wilson(8, 10).unwrap();
        assert_eq!(p, 0.8);
        assert!(
            (low - 0.4902).abs() < 1e-4 && (high - 0.9433).abs() < 1e-4,
            "{low} {high}"
        );
        let (_, low, high) = wilson(0, 10).unwrap();
        assert!(low == 0.0 && (high - 0.2775).abs() < 1e-4, "{high}");
        let (_, low, high) = wilson(10, 10).unwrap();
        assert!((low - 0.7225).abs() < 1e-4 && high == 1.0, "{low}");
        assert_eq!(wilson(0, 0), None);
    }
}
