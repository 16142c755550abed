//! `frugal eval-cache`'s verifier section: the paraphrase verifier behind the guard's hard
//! vetoes, at a fixed threshold chosen on the tuning halves' calibration fifth and under the
//! error budget replayed over the held-out halves, per kind beside plain cosine and the guard
//! alone; the budget's own estimate of its wrong-hit rate beside the labels'; its cost.

use std::io::Write;

use anyhow::Result;
use frugal_cost::present::pct1;
use frugal_semantic::eval::{self, Chosen, KindRate, Limits, Pair, Scored, Split, Verified};
use frugal_semantic::{Embedder, Guard, Verifier};
use serde_json::{Value, json};

use crate::table;

/// The bounds the budget is replayed at besides the one asked for.
const BOUNDS: [f64; 5] = [0.005, 0.01, 0.02, 0.05, 0.1];

pub struct Inputs<'a> {
    pub embedder: &'a Embedder,
    pub verifier: &'a Verifier,
    pub pairs: &'a [Pair],
    pub near_pairs: &'a [Pair],
    pub qqp: &'a Split<'a>,
    pub near: &'a Split<'a>,
    /// Plain cosine's and the guard's choices (plain cosine's is shown).
    pub chosen: &'a [Chosen],
    pub limits: Limits,
    pub max_error: f64,
}

/// The budget replayed at one bound: shares served, its estimate, the labels' figure.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct AtBound {
    pub max_error: f64,
    pub paraphrases: f64,
    pub near_misses: f64,
    pub qqp_duplicates: f64,
    pub qqp_others: f64,
    pub hits: u64,
    pub estimated: f64,
    pub low: f64,
    pub high: f64,
    pub actual: f64,
    pub hand_written_actual: f64,
}

/// What the section measured: its figures as JSON, the rule chosen, the budget per bound.
pub struct Measured {
    pub figures: Value,
    pub rule: Verified,
    pub bounds: Vec<AtBound>,
}

/// One rule's hits per kind of the near-miss set's held-out half, and on QQP's.
struct Column {
    name: String,
    kinds: Vec<KindRate>,
    qqp: (f64, f64),
}

fn column(
    name: String,
    near: &Split,
    qqp: &Split,
    hit: impl Fn(usize, &Scored, bool) -> bool,
) -> Column {
    let kinds = eval::with_totals(eval::kind_rates(&near.held, |i, s| hit(i, s, false)));
    let qqp_hits: Vec<bool> = qqp
        .held
        .scored
        .iter()
        .enumerate()
        .map(|(i, s)| hit(i, s, true))
        .collect();
    let rate = |label: bool| {
        let of: Vec<bool> = qqp
            .held
            .scored
            .iter()
            .zip(&qqp_hits)
            .filter(|(s, _)| s.label == label)
            .map(|(_, h)| *h)
            .collect();
        of.iter().filter(|h| **h).count() as f64 / of.len().max(1) as f64
    };
    Column {
        name,
        kinds,
        qqp: (rate(true), rate(false)),
    }
}

/// Prints the section; `None` when no pair reached the verifier.
pub fn section(out: &mut impl Write, x: &Inputs) -> Result<Option<Measured>> {
    let Some(rule) = eval::choose_verified(x.qqp, x.near, x.limits) else {
        writeln!(
            out,
            "The verifier: no pair of the calibration fifth reached it, nothing to choose"
        )?;
        return Ok(None);
    };
    let replay = eval::replay(&rule, &[x.qqp, x.near], x.max_error);
    // Plain cosine at its chosen threshold, and the guard alone as it ships.
    let plain = x.chosen.iter().find(|c| !c.guard.vetoes).map(|c| c.guard);
    let shipped = Guard::default();
    let mut columns: Vec<Column> = plain
        .map(|g| (format!("plain cosine {:.4}", g.threshold), g))
        .into_iter()
        .chain([(
            format!(
                "guard alone {:.4}/{:.4}",
                shipped.threshold, shipped.aligned_threshold
            ),
            shipped,
        )])
        .map(|(name, g)| column(name, x.near, x.qqp, |_, s, _| eval::hits(&g, s)))
        .collect();
    columns.push(column(
        format!(
            "verifier p >= {:.3} (cosine >= {:.2})",
            rule.min_probability, rule.floor
        ),
        x.near,
        x.qqp,
        |_, s, _| rule.hits(s),
    ));
    columns.push(column(
        format!("budget {} (cosine >= {:.2})", pct1(x.max_error), rule.floor),
        x.near,
        x.qqp,
        |i, _, qqp| replay.served[usize::from(!qqp)][i],
    ));
    let c = rule.calibration;
    writeln!(
        out,
        "The paraphrase verifier behind the hard vetoes: candidates at cosine >= {:.2}, \
         P(same) = 1 / (1 + exp(-({:.3} logit + {:.3} cosine + {:.3} aligned + {:.3} soft veto \
         + {:.3}))), fitted with the floor on the tuning halves' calibration fifth (never \
         trained on); a fixed threshold chosen there within the limits above, and the error \
         budget of {} replayed over both held-out halves in one stream",
        rule.floor,
        c.w[0],
        c.w[1],
        c.w[2],
        c.w[3],
        c.b,
        pct1(x.max_error)
    )?;
    let mut headers = vec!["kind".to_owned(), "pairs>".to_owned()];
    headers.extend(columns.iter().map(|c| format!("{}>", c.name)));
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut t = table::new(&headers);
    for (k, first) in columns[0].kinds.iter().enumerate() {
        let mut row = vec![
            format!(
                "{} ({})",
                first.kind,
                if first.label {
                    "paraphrase"
                } else {
                    "near miss"
                }
            ),
            first.pairs.to_string(),
        ];
        row.extend(columns.iter().map(|c| pct1(c.kinds[k].rate())));
        t.add_row(row);
    }
    let (dup, other) = eval::counts(&x.qqp.held.scored);
    for (name, n, pick) in [("QQP duplicates", dup, 0), ("QQP others (wrong)", other, 1)] {
        let mut row = vec![name.to_owned(), n.to_string()];
        row.extend(
            columns
                .iter()
                .map(|c| pct1(if pick == 0 { c.qqp.0 } else { c.qqp.1 })),
        );
        t.add_row(row);
    }
    writeln!(out, "{t}\n")?;

    let e = replay.account.estimate();
    writeln!(
        out,
        "The budget's own account over the replay: {} candidates, {} hits served; estimated \
         wrong-hit rate {} (95% interval {} to {}); by the labels {} ({} wrong); its \
         threshold at the end p >= {:.3}",
        replay.account.candidates,
        replay.account.hits,
        pct1(e.rate),
        pct1(e.low),
        pct1(e.high),
        pct1(replay.actual_rate()),
        replay.wrong,
        replay.threshold,
    )?;
    // The same replay at other bounds: what each serves, and how its estimate holds.
    let mut t = table::new(&[
        "semantic_max_error>",
        "paraphrases served>",
        "near misses served>",
        "QQP duplicates served>",
        "QQP others served>",
        "hits>",
        "estimated wrong>",
        "95% interval>",
        "wrong by the labels>",
        "hand-written wrong>",
    ]);
    let mut curve = Vec::new();
    for bound in BOUNDS {
        let r = eval::replay(&rule, &[x.qqp, x.near], bound);
        let share = |k: usize, label: bool| {
            let half = if k == 0 { &x.qqp.held } else { &x.near.held };
            let of: Vec<bool> = half
                .scored
                .iter()
                .zip(&r.served[k])
                .filter(|(s, _)| s.label == label)
                .map(|(_, h)| *h)
                .collect();
            of.iter().filter(|h| **h).count() as f64 / of.len().max(1) as f64
        };
        let hand = |label: bool| {
            x.near
                .held
                .scored
                .iter()
                .zip(&r.served[1])
                .filter(|(s, h)| **h && s.label == label)
                .count()
        };
        let (hand_right, hand_wrong) = (hand(true), hand(false));
        let hand_rate = hand_wrong as f64 / (hand_right + hand_wrong).max(1) as f64;
        let e = r.account.estimate();
        let b = AtBound {
            max_error: bound,
            paraphrases: share(1, true),
            near_misses: share(1, false),
            qqp_duplicates: share(0, true),
            qqp_others: share(0, false),
            hits: r.account.hits,
            estimated: e.rate,
            low: e.low,
            high: e.high,
            actual: r.actual_rate(),
            hand_written_actual: hand_rate,
        };
        t.add_row(vec![
            pct1(b.max_error),
            pct1(b.paraphrases),
            pct1(b.near_misses),
            pct1(b.qqp_duplicates),
            pct1(b.qqp_others),
            b.hits.to_string(),
            pct1(b.estimated),
            format!("{} to {}", pct1(b.low), pct1(b.high)),
            pct1(b.actual),
            pct1(b.hand_written_actual),
        ]);
        curve.push(b);
    }
    writeln!(
        out,
        "The budget at other bounds (the same replay; wrong: share of served hits):\n{t}\n"
    )?;
    let (p, n) = eval::verified_cost(x.embedder, x.verifier, x.pairs, rule.floor)?;
    let (np, nn) = eval::verified_cost(x.embedder, x.verifier, x.near_pairs, rule.floor)?;
    writeln!(
        out,
        "A lookup that reaches the verifier (one thread: embed, the guard, the verifier on one \
         candidate): QQP p50 {:.2} ms, p99 {:.2} ms ({n} questions); hand-written p50 {:.2} ms, \
         p99 {:.2} ms ({nn})\n",
        p.0, p.1, np.0, np.1
    )?;
    let kinds: Vec<Value> = columns
        .iter()
        .map(|c| {
            json!({
                "rule": c.name, "qqp_hit": c.qqp.0, "qqp_wrong": c.qqp.1,
                "kinds": c.kinds.iter().map(|k| json!({
                    "kind": k.kind, "paraphrase": k.label, "pairs": k.pairs, "hit": k.rate(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let figures = json!({
        "floor": rule.floor,
        "calibration": {"weights": c.w, "bias": c.b},
        "min_probability": rule.min_probability,
        "rules": kinds,
        "budget": {
            "max_error": x.max_error, "candidates": replay.account.candidates,
            "hits": replay.account.hits, "estimated_wrong_rate": e.rate,
            "estimated_low": e.low, "estimated_high": e.high,
            "actual_wrong_rate": replay.actual_rate(), "wrong": replay.wrong,
            "threshold": replay.threshold,
        },
        "bounds": curve,
        "lookup_qqp_p50_ms": p.0, "lookup_qqp_p99_ms": p.1,
        "lookup_hand_p50_ms": np.0, "lookup_hand_p99_ms": np.1,
    });
    Ok(Some(Measured {
        figures,
        rule,
        bounds: curve,
    }))
}
