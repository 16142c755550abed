//! The plan as one self-contained HTML page: the recommendation, demand over time with the
//! commitment and what spills above it, the backtest per window beside the vendors' rule,
//! the spot replays, the instance types per 1M tokens and scale to zero.

use std::fmt::Write;

use super::backtest::{Rule, RuleResult};
use super::commit::CommitOption;
use super::size::{Candidate, RightSizing, ZeroPlan};
use super::spot::Replay;
use super::whole::{Plan, SpotPlan};
use crate::money::Money;
use crate::present::chart::{Chart, Series};
use crate::present::page::{esc, styled};
use crate::present::{pct, pct1, usd, usd_per_1m, usd_unit, utc};

const COLOURS: [&str; 5] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];

pub fn render(plan: &Plan) -> String {
    let mut body = String::new();
    let _ = writeln!(
        body,
        "<h1>Capacity plan: {} ({})</h1>\n<p class=\"note\">Demand from {}: {} hours from {} \
         UTC, peak {:.1} and mean {:.1} instances an hour.</p>",
        esc(&plan.instance_type),
        esc(&plan.region),
        esc(&plan.source),
        plan.hourly.len(),
        utc(plan.start_ms, "%Y-%m-%d"),
        plan.peak,
        plan.mean
    );
    body.push_str(&options_table(plan));
    body.push_str(&demand_chart(plan));
    if let Some(b) = &plan.backtest {
        let rules: Vec<&RuleResult> = std::iter::once(&b.ours).chain(&b.lookbacks).collect();
        body.push_str(&backtest_table(&rules, b.test_hours));
        body.push_str(&regret_chart(&rules));
    }
    if let Some(s) = &plan.spot {
        let _ = writeln!(
            body,
            "<h2>Spot for a run of {:.0} hours of work</h2>\n<p class=\"note\">Trace {}: {} \
             preemptions in {:.0} hours, MTBF {}; checkpoints of {:.0} min every {:.2} h \
             (Young/Daly), restarts of {:.0} min.</p>",
            s.job.work_hours,
            esc(&s.trace),
            s.stats.preemptions,
            s.stats.hours,
            s.stats
                .mtbf_hours
                .map_or("none".into(), |h| format!("{h:.2} h")),
            s.job.checkpoint_hours * 60.0,
            s.job.interval_hours,
            s.job.restart_hours * 60.0
        );
        body.push_str(&replay_table(replay_head(s), &replays(s)));
    }
    if let Some(s) = &plan.sizing {
        body.push_str(&sizing_table(s));
    }
    if let Some(z) = &plan.scale_to_zero {
        body.push_str(&zero_section(z));
    }
    styled("frugal plan", &body)
}

fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::from("<table><thead><tr>");
    let numeric = |h: &str| h.ends_with('>');
    for h in head {
        let class = if numeric(h) { " class=\"n\"" } else { "" };
        let _ = write!(out, "<th{class}>{}</th>", esc(h.trim_end_matches('>')));
    }
    out.push_str("</tr></thead><tbody>\n");
    for row in rows {
        out.push_str("<tr>");
        for (cell, h) in row.iter().zip(head) {
            let class = if numeric(h) { " class=\"n\"" } else { "" };
            let _ = write!(out, "<td{class}>{}</td>", esc(cell));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table>\n");
    out
}

/// The headings of [`option_cells`]; `>` marks a number column.
pub const OPTION_HEAD: [&str; 7] = [
    "capacity",
    "committed>",
    "$/month>",
    "saved in the window>",
    "saved>",
    "commitment busy>",
    "on-demand peak>",
];

/// One way to buy the capacity, as a row of text (the terminal's and the page's).
pub fn option_cells(o: &CommitOption) -> Vec<String> {
    vec![
        o.capacity.to_string(),
        o.count.to_string(),
        usd(o.monthly_cost),
        usd(o.saving),
        o.saving_share.map_or("-".into(), pct),
        o.utilization.map_or("-".into(), pct),
        o.on_demand_peak.to_string(),
    ]
}

/// On demand, then each term the plan priced.
pub fn options(plan: &Plan) -> impl Iterator<Item = &CommitOption> {
    let c = &plan.commitments;
    [
        Some(&c.on_demand),
        c.reserved_1y.as_ref(),
        c.reserved_3y.as_ref(),
    ]
    .into_iter()
    .flatten()
}

/// The headings of [`replay_cells`].
pub const REPLAY_HEAD: [&str; 8] = [
    "policy",
    "finish (h)>",
    "cost>",
    "spot h>",
    "on-demand h>",
    "preemptions>",
    "work lost (h)>",
    "deadline met",
];

/// The replay table's columns: "deadline met" only where the plan has a deadline.
pub fn replay_head(s: &SpotPlan) -> &'static [&'static str] {
    match s.deadline {
        Some(_) => &REPLAY_HEAD,
        None => &REPLAY_HEAD[..REPLAY_HEAD.len() - 1],
    }
}

/// A replay of the run under the policy `name`, as a row of text: whether it met the
/// deadline where it was replayed against one.
pub fn replay_cells(name: &str, r: &Replay) -> Vec<String> {
    let mut cells = vec![
        name.to_owned(),
        if r.finished {
            format!("{:.1}", r.finish_hours)
        } else {
            "not finished".into()
        },
        usd(r.cost),
        format!("{:.1}", r.spot_hours),
        format!("{:.1}", r.on_demand_hours),
        r.preemptions.to_string(),
        format!("{:.2}", r.lost_work_hours),
    ];
    if let Some(met) = r.deadline_met {
        cells.push(if met { "yes" } else { "no" }.into());
    }
    cells
}

/// The replays a plan shows: spot alone, on demand, and the deadline policy.
pub fn replays(s: &SpotPlan) -> Vec<(&'static str, &Replay)> {
    let mut runs = vec![("spot only", &s.spot_only), ("on demand", &s.on_demand)];
    if let Some(d) = &s.deadline {
        runs.push(("uniform progress to the deadline", &d.uniform_progress));
    }
    runs
}

fn options_table(plan: &Plan) -> String {
    let c = &plan.commitments;
    let rows: Vec<Vec<String>> = options(plan).map(option_cells).collect();
    let mut out = format!("<h2>What to commit to</h2>\n{}", table(&OPTION_HEAD, &rows));
    for r in &c.refused {
        let _ = writeln!(
            out,
            "<p class=\"note\">No {}: {}</p>",
            r.capacity,
            esc(&r.reason)
        );
    }
    out
}

fn demand_chart(plan: &Plan) -> String {
    let days = |i: usize| i as f64 / 24.0;
    let demand: Vec<(f64, f64)> = plan
        .hourly
        .iter()
        .enumerate()
        .map(|(i, &d)| (days(i), f64::from(d)))
        .collect();
    let end = days(plan.hourly.len());
    let mut series = vec![Series {
        name: "demand (instances)".into(),
        colour: COLOURS[0],
        points: demand,
    }];
    let c = &plan.commitments;
    for (i, o) in [c.reserved_1y.as_ref(), c.reserved_3y.as_ref()]
        .into_iter()
        .flatten()
        .enumerate()
    {
        let k = f64::from(o.count);
        series.push(Series {
            name: format!("{} commitment: {}", o.capacity, o.count),
            colour: COLOURS[1 + i],
            points: vec![(0.0, k), (end, k)],
        });
    }
    let top = f64::from(plan.hourly.iter().copied().max().unwrap_or(1)).max(1.0) * 1.05;
    let chart = Chart {
        title: "Demand and the commitment".into(),
        x_label: "days".into(),
        y_label: "instances".into(),
        x_range: (0.0, end.max(1.0 / 24.0)),
        y_range: (0.0, top),
        series,
        marks: Vec::new(),
    };
    format!(
        "<figure><h2>Demand over time</h2>{}<figcaption>Each hour's demand in whole instances; \
         what rises above a commitment line runs on demand (or autoscaled).</figcaption></figure>\n",
        chart.svg()
    )
}

/// A backtest rule in words.
pub fn rule_name(r: &Rule) -> String {
    match r {
        Rule::Fit { hours, .. } => format!("ours (fit on {} days)", hours / 24),
        Rule::Lookback { days } => format!("{days}-day lookback"),
    }
}

fn backtest_table(rules: &[&RuleResult], test_hours: usize) -> String {
    let opt = |v: Option<f64>, f: fn(f64) -> String| v.map_or("-".into(), f);
    let points = |v: f64| format!("{v:.2}");
    let rows: Vec<Vec<String>> = rules
        .iter()
        .map(|r| {
            vec![
                rule_name(&r.rule),
                r.windows.len().to_string(),
                opt(r.mean_regret, points),
                opt(r.max_regret, points),
                opt(r.utilization, pct),
                usd(r.saving),
                opt(r.saving_share, pct),
            ]
        })
        .collect();
    let head = [
        "rule",
        "windows>",
        "mean regret (points)>",
        "worst>",
        "commitment busy>",
        "saved>",
        "saved share>",
    ];
    let mut out = format!(
        "<h2>Backtest on held-out windows of {} days</h2>\n<p class=\"note\">Regret: what the \
         choice cost above the window's own hindsight optimum, in points of the all-on-demand \
         cost.</p>\n{}",
        test_hours / 24,
        table(&head, &rows)
    );
    let windows: Vec<Vec<String>> = rules[0]
        .windows
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let mut row = vec![
                utc(w.test_start_ms, "%Y-%m-%d"),
                w.count.to_string(),
                w.optimum_count.to_string(),
                usd_unit(w.cost),
                usd_unit(w.optimum_cost),
            ];
            for r in rules {
                row.push(opt(r.windows.get(i).and_then(|w| w.regret), points));
            }
            row.push(opt(w.utilization, pct));
            row
        })
        .collect();
    let names: Vec<String> = rules
        .iter()
        .map(|r| format!("{} regret>", rule_name(&r.rule)))
        .collect();
    let mut head: Vec<&str> = vec!["test window", "ours>", "optimum>", "cost>", "optimum cost>"];
    head.extend(names.iter().map(String::as_str));
    head.push("ours busy>");
    out.push_str(&table(&head, &windows));
    out
}

fn regret_chart(rules: &[&RuleResult]) -> String {
    let series: Vec<Series> = rules
        .iter()
        .enumerate()
        .map(|(i, r)| Series {
            name: rule_name(&r.rule),
            colour: COLOURS[i % COLOURS.len()],
            points: r
                .windows
                .iter()
                .enumerate()
                .filter_map(|(j, w)| Some(((j + 1) as f64, w.regret?)))
                .collect(),
        })
        .collect();
    let n = rules.first().map_or(1, |r| r.windows.len()).max(1) as f64;
    let top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        * 1.1;
    let chart = Chart {
        title: "Regret per held-out window".into(),
        x_label: "test window".into(),
        y_label: "regret (points)".into(),
        x_range: (1.0, n.max(2.0)),
        y_range: (0.0, top),
        series,
        marks: Vec::new(),
    };
    format!(
        "<figure>{}<figcaption>Each rule's regret against the hindsight optimum, window by \
         window.</figcaption></figure>\n",
        chart.svg()
    )
}

fn replay_table(head: &[&str], runs: &[(&str, &Replay)]) -> String {
    let rows: Vec<Vec<String>> = runs.iter().map(|(n, r)| replay_cells(n, r)).collect();
    let saved = match runs {
        [(_, spot), (_, od), ..] if od.cost > Money::ZERO => format!(
            "<p class=\"note\">Spot alone costs {} of on demand's {}.</p>\n",
            pct(spot.cost.as_f64() / od.cost.as_f64()),
            usd(od.cost)
        ),
        _ => String::new(),
    };
    table(head, &rows) + &saved
}

/// The right-size table's columns, shared by the page and the terminal.
pub const SIZE_HEAD: [&str; 7] = [
    "instance",
    "$/hour>",
    "output tokens/s>",
    "$ per 1M output tokens>",
    "$ per 1M tokens>",
    "TTFT p99 (ms)>",
    "SLO",
];

pub fn candidate_cells(c: &Candidate) -> Vec<String> {
    let m = &c.measured;
    let per_1m = |v: Option<Money>| v.map_or("-".into(), usd_per_1m);
    vec![
        m.instance_type.clone(),
        usd_unit(m.rate.0),
        format!("{:.0}", m.output_tokens_per_s),
        per_1m(c.per_1m_output_tokens),
        per_1m(c.per_1m_tokens),
        m.ttft_p99_s
            .map_or("-".into(), |v| format!("{:.0}", v * 1000.0)),
        c.refused.clone().unwrap_or_else(|| "meets".into()),
    ]
}

/// The SLO and the pick, in words.
pub fn sizing_summary(s: &RightSizing) -> String {
    let slo = s.slo.ttft_p99_s.map_or("no latency SLO".into(), |v| {
        format!("TTFT p99 within {:.0} ms", v * 1000.0)
    });
    let pick = s
        .recommended
        .as_deref()
        .map_or("none of them meets it".to_owned(), |t| {
            format!("the cheapest that meets it is {t}")
        });
    format!("{slo}; {pick}")
}

fn sizing_table(s: &RightSizing) -> String {
    let rows: Vec<Vec<String>> = s.candidates.iter().map(candidate_cells).collect();
    format!(
        "<h2>Right size: cost per 1M tokens</h2>\n<p class=\"note\">From bench runs on each \
         type, {}.</p>\n{}",
        esc(&sizing_summary(s)),
        table(&SIZE_HEAD, &rows)
    )
}

/// The scale-to-zero table's columns, shared by the page and the terminal.
pub const ZERO_HEAD: [&str; 8] = [
    "requests>",
    "always on (h)>",
    "scaled to zero (h)>",
    "saved>",
    "always-on cost>",
    "cold starts>",
    "requests waiting>",
    "mean wait (s)>",
];

pub fn zero_cells(z: &ZeroPlan) -> Vec<String> {
    vec![
        z.requests.to_string(),
        format!("{:.1}", z.always_on_hours),
        format!("{:.1}", z.scaled_hours),
        usd(z.saved),
        usd(z.always_on_cost),
        z.cold_starts.to_string(),
        z.waiting_share.map_or("-".into(), pct1),
        z.mean_wait_s.map_or("-".into(), |s| format!("{s:.1}")),
    ]
}

/// The policy replayed and the verdict, in words.
pub fn zero_summary(z: &ZeroPlan) -> String {
    let from = if z.measured_cold_starts > 0 {
        format!(
            "the median of {} replica starts in the ledger",
            z.measured_cold_starts
        )
    } else {
        "not from the ledger".into()
    };
    format!(
        "a replica stays up {:.0} s after its last request and takes {:.0} s to start ({from}), \
         against one always on for {:.1} hours: {}",
        z.grace_s, z.cold_start_s, z.span_hours, z.verdict
    )
}

fn zero_section(z: &ZeroPlan) -> String {
    format!(
        "<h2>Scale to zero</h2>\n<p class=\"note\">{}.</p>\n{}",
        esc(&zero_summary(z)),
        table(&ZERO_HEAD, &[zero_cells(z)])
    )
}
