//! The HTML report: one self-contained file (inline CSS and SVG, no scripts, no network),
//! so it opens offline and can be attached to a ticket or an e-mail as it is.
//!
//! This module owns the page: its layout and which charts it draws; how they are drawn and
//! how numbers read on it is `present`'s. Every figure comes from `Report` as built;
//! nothing here adds money up.

use crate::event::Kind;
use crate::money::{Millis, Money};
use crate::present::page::{esc, styled};
use crate::present::svg::{
    AXIS, BarRow, END, GRID, INSIDE, MIDDLE, WIDTH, axis_label, bar, hbars, line, nice_axis, open,
    pos, rect, text,
};
use crate::present::{interval, pct, pct1, thousands, usd_f64, usd_unit, utc};
use crate::report::{
    BatchJobLine, InferenceLine, Item, Lever, PoolLine, QUALITY_HEAD, QUALITY_NOTE, Report,
    RunLine, Series, ServerLine, SpendLine, WrongHits, utilization_note,
};

/// Tableau 10 less its grey: told apart on white, and by most colour-blind readers.
const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];
/// For the figure a bar is compared against (the on-demand list price).
const MUTED: &str = "#bab0ac";
const DAY_MS: Millis = 86_400_000;
const NONE: &str = "–";

/// Renders the whole report; `source` names the ledger it was read from.
pub fn render(report: &Report, source: &str) -> String {
    let mut out = String::with_capacity(64 * 1024);
    out.push_str(&header(report, source));
    if report.events == 0 {
        out.push_str("<p class=\"empty\">No events in this window: nothing to chart.</p>\n");
    } else {
        out.push_str(&tiles(report));
        let sections = [
            cost_over_time(&report.series),
            per_1k_chart(report),
            money_goes(report),
            training_chart(report),
            savings_chart(report),
            wrong_hits_table(report),
            quality_table(report),
            levers_section(report),
            spend_table(report),
            inference_table(report),
            pools_table(report),
            servers_table(report),
            batch_table(report),
            training_table(report),
        ];
        sections.iter().flatten().for_each(|s| out.push_str(s));
    }
    out.push_str("<footer>Written by frugal. Money is summed exactly; charts are drawn from ");
    out.push_str("rounded dollars.</footer>\n");
    styled("frugal report", &out)
}

fn header(r: &Report, source: &str) -> String {
    let minute = "%Y-%m-%d %H:%M";
    let span = match (r.first_ms, r.last_ms) {
        (Some(a), Some(b)) => format!("{} – {} UTC", utc(a, minute), utc(b, minute)),
        _ => "no events in this window".to_owned(),
    };
    let (source, events) = (esc(source), thousands(r.events));
    let meta = format!("Ledger <code>{source}</code> · {span} · {events} events");
    format!("<header>\n<h1>frugal report</h1>\n<p class=\"meta\">{meta}</p>\n</header>\n")
}

fn tiles(r: &Report) -> String {
    let waste_share = match r.total > Money::ZERO {
        true => pct(r.waste.as_f64() / r.total.as_f64()),
        false => NONE.to_owned(),
    };
    let utilization = r.utilization.filter(|u| u.is_finite());
    let note = match utilization {
        Some(u) => utilization_note(u).unwrap_or("capacity fully used".to_owned()),
        None => "no capacity with a known utilization".to_owned(),
    };
    let (events, util) = (
        thousands(r.events),
        utilization.map_or(NONE.to_owned(), pct),
    );
    let tiles = [
        ("Total spent", usd_unit(r.total), format!("{events} events")),
        (
            "Waste",
            usd_unit(r.waste),
            format!("{waste_share} of spend"),
        ),
        ("Utilization", util, note),
    ];
    let mut out = String::from("<div class=\"tiles\">\n");
    for (k, v, s) in tiles {
        let inner = div("k", k) + &div("v", &v) + &div("s", &esc(&s));
        out.push_str(&(div("tile", &inner) + "\n"));
    }
    out.push_str("</div>\n");
    if let Some(d) = r.dominant.as_deref().map(quoted_as_code) {
        out.push_str(&format!("<p class=\"dominant\">{d}</p>\n"));
    }
    out
}

fn div(class: &str, html: &str) -> String {
    format!("<div class=\"{class}\">{html}</div>")
}

/// The report's sentences quote names in backticks; they read better as code.
fn quoted_as_code(text: &str) -> String {
    let parts = esc(text);
    let wrap = |(i, part): (usize, &str)| match i % 2 {
        1 => format!("<code>{part}</code>"),
        _ => part.to_owned(),
    };
    parts.split('`').enumerate().map(wrap).collect()
}

fn section(title: &str, note: &str, body: &str) -> String {
    let note = match note {
        "" => String::new(),
        _ => format!("<p class=\"note\">{}</p>\n", esc(note)),
    };
    let title = esc(title);
    format!("<section>\n<h2>{title}</h2>\n{note}{body}</section>\n")
}

/// One swatch per `(label, colour)`.
fn legend(items: &[(impl AsRef<str>, &str)]) -> String {
    let mut out = String::from("<div class=\"legend\">");
    for (label, colour) in items {
        let swatch = format!("<i style=\"background:{colour}\"></i>");
        out.push_str(&format!("<span>{swatch}{}</span>", esc(label.as_ref())));
    }
    out.push_str("</div>\n");
    out
}

fn cost_over_time(s: &Series) -> Option<String> {
    let n = s.buckets;
    let value = |v: &[f64], i: usize| pos(v.get(i).copied());
    let stacked = |i: usize| s.lines.iter().map(|(_, v)| value(v, i)).sum::<f64>();
    let max = (0..n).map(stacked).fold(0.0, f64::max);
    if max <= 0.0 {
        return None;
    }
    let (left, top, plot_w, plot_h) = (76.0, 10.0, WIDTH - 88.0, 250.0);
    let bottom = top + plot_h;
    let (axis_top, step) = nice_axis(max);
    let y = |v: f64| bottom - v / axis_top * plot_h;
    let mut svg = open(WIDTH, bottom + 30.0, "", "cost over time by workload");
    for k in 0..=(axis_top / step).round() as usize {
        let v = k as f64 * step;
        svg.push_str(&line(GRID, (left, y(v)), (left + plot_w, y(v))));
        svg.push_str(&text(left - 8.0, y(v) + 4.0, END, &axis_label(v, step)));
    }
    let slot = plot_w / n as f64;
    let bar_w = (slot * 0.72).max(1.0);
    let (bucket, fmt) = match s.bucket_ms {
        b if b >= 7 * DAY_MS => ("week", "%b %d"),
        b if b >= DAY_MS => ("day", "%a %b %d"),
        _ => ("hour", "%b %d %H:%M"),
    };
    // At most 8 tick labels, on round hours of the UTC day (or whole days) so they read.
    let steps = [1, 2, 3, 6, 12, 24, 48, 96, 168];
    let every = steps
        .into_iter()
        .find(|k| k * 8 >= n)
        .unwrap_or(n.div_ceil(8));
    let first = s
        .start_ms
        .div_euclid(s.bucket_ms.max(1))
        .rem_euclid(every as i64) as usize;
    for i in 0..n {
        let x = left + i as f64 * slot + (slot - bar_w) / 2.0;
        let when = utc(s.start_ms + i as Millis * s.bucket_ms, fmt);
        let mut acc = 0.0;
        for (j, (name, values)) in s.lines.iter().enumerate() {
            let v = value(values, i);
            if v > 0.0 {
                let title = format!("{name}, {when}: {}", usd_f64(v));
                let (y1, h) = (y(acc + v), v / axis_top * plot_h);
                svg.push_str(&rect(x, y1, bar_w, h, colour(j), &title));
            }
            acc += v;
        }
        if (first + i).is_multiple_of(every) {
            // Kept clear of the edges: a label is about 80 wide.
            let tx = (x + bar_w / 2.0).clamp(left + 20.0, WIDTH - 40.0);
            svg.push_str(&text(tx, bottom + 20.0, MIDDLE, &when));
        }
    }
    svg.push_str(&line(AXIS, (left, bottom), (left + plot_w, bottom)));
    svg.push_str("</svg>\n");
    let key = |(j, (name, _)): (usize, &(String, Vec<f64>))| (name.clone(), colour(j));
    let names: Vec<(String, &str)> = s.lines.iter().enumerate().map(key).collect();
    let note = format!("Dollars per {bucket} (UTC), stacked by workload.");
    let title = "Cost over time by workload";
    Some(section(title, &note, &(svg + &legend(&names))))
}

fn per_1k_chart(r: &Report) -> Option<String> {
    let row = |m: &InferenceLine| {
        let per_1k = m.per_1k?;
        let label = m.model.clone().unwrap_or(NONE.to_owned());
        let sub = format!("{} requests", thousands(m.requests));
        let bars = vec![bar(per_1k, PALETTE[0], usd_unit(per_1k))];
        Some(BarRow { label, sub, bars })
    };
    let mut rows = some(r.models.iter().filter_map(row).collect())?;
    // Dearest first: the chart is read for which model to move traffic off.
    rows.sort_by(|a, b| b.bars[0].value.total_cmp(&a.bars[0].value));
    let note = "Request cost plus the idle capacity paid for them, per 1,000 requests.";
    let title = "Cost per 1,000 inferences by model";
    Some(section(title, note, &hbars(&rows, title)))
}

/// Training against inference, idle capacity counted with the work it stood by for and
/// drawn apart in red, as the `dominant` sentence reads it.
fn money_goes(r: &Report) -> Option<String> {
    let sum: f64 = r.areas.iter().map(|a| pos(Some(a.cost.as_f64()))).sum();
    if sum <= 0.0 {
        return None;
    }
    let mut svg = open(WIDTH, 40.0, "", "spend by area");
    let (mut x, mut names) = (0.0, Vec::new());
    for a in &r.areas {
        let colour = area_colour(a.area);
        let idle_label = format!("{} idle capacity {}", a.area, usd_unit(a.idle));
        let label = format!("{} {} · {}", a.area, usd_unit(a.cost), pct(a.share));
        let parts = [
            (a.cost - a.idle, colour, &label),
            (a.idle, kind_colour(Kind::Idle), &idle_label),
        ];
        let start = x;
        for (value, fill, title) in parts {
            let w = pos(Some(value.as_f64())) / sum * WIDTH;
            svg.push_str(&rect(x, 4.0, w, 32.0, fill, title));
            x += w;
        }
        if x - start >= 44.0 {
            svg.push_str(&text((start + x) / 2.0, 25.0, INSIDE, &pct(a.share)));
        }
        let idle = match a.idle > Money::ZERO {
            true => format!(" · {} of it idle", usd_unit(a.idle)),
            false => String::new(),
        };
        names.push((format!("{label}{idle}"), colour));
    }
    if r.areas.iter().any(|a| a.idle > Money::ZERO) {
        names.push(("idle capacity (waste)".to_owned(), kind_colour(Kind::Idle)));
    }
    svg.push_str("</svg>\n");
    let mut body = svg + &legend(&names);
    let item = |i: &Item| {
        vec![
            i.kind.to_string(),
            esc(&i.name),
            usd_unit(i.cost),
            pct(i.share),
        ]
    };
    let items: Vec<Vec<String>> = r.top_items.iter().map(item).collect();
    if !items.is_empty() {
        body.push_str(&table("kind|largest items|cost>|share>", &items));
    }
    let note = "Inference against training; idle capacity counts with the work it stood by for.";
    Some(section("Where the money goes", note, &body))
}

fn area_colour(area: &str) -> &'static str {
    match area {
        "inference" => kind_colour(Kind::Inference),
        "training" => kind_colour(Kind::Training),
        "idle" => kind_colour(Kind::Idle),
        _ => kind_colour(Kind::Other),
    }
}

fn training_chart(r: &Report) -> Option<String> {
    let row = |t: &RunLine| {
        let saving = match t.saving {
            Some(s) => format!("saved {}", usd_unit(s)),
            None => "no on-demand price".to_owned(),
        };
        let preempted = match t.preemptions {
            0 => "no preemptions".to_owned(),
            1 => "1 preemption".to_owned(),
            n => format!("{n} preemptions"),
        };
        let mut bars = vec![bar(t.cost, PALETTE[0], usd_unit(t.cost))];
        if let Some(od) = t.on_demand_cost {
            bars.push(bar(od, MUTED, format!("{} on demand", usd_unit(od))));
        }
        let (label, sub) = (t.run.clone(), format!("{saving} · {preempted}"));
        BarRow { label, sub, bars }
    };
    let rows = some(r.training.iter().map(row).collect())?;
    let keys = [("actual", PALETTE[0]), ("on demand", MUTED)];
    let title = "Training runs: actual vs on-demand";
    let note = "What each run cost against the same capacity at the on-demand list price.";
    let body = hbars(&rows, title) + &legend(&keys);
    Some(section(title, note, &body))
}

/// What each workload and model paid beside what each lever saved it.
fn savings_chart(r: &Report) -> Option<String> {
    let levers = [
        ("exact cache", PALETTE[1]),
        ("semantic cache", PALETTE[2]),
        ("routing", PALETTE[3]),
        ("batching", PALETTE[4]),
        ("prefix cache", PALETTE[5]),
    ];
    let row = |l: &InferenceLine| {
        let s = &l.saved;
        if s.total() <= Money::ZERO {
            return None;
        }
        let paid = l.cost + l.idle_cost;
        let mut bars = vec![bar(paid, PALETTE[0], format!("{} paid", usd_unit(paid)))];
        let amounts = [
            s.cache,
            s.semantic_cache,
            s.routing,
            s.batching,
            s.prefix_cache,
        ];
        for ((name, fill), amount) in levers.iter().zip(amounts) {
            if amount > Money::ZERO {
                bars.push(bar(
                    amount,
                    fill,
                    format!("{} saved by {name}", usd_unit(amount)),
                ));
            }
        }
        let label = l.model.clone().unwrap_or(NONE.to_owned());
        let cut = s.total().as_f64() / (paid + s.total()).as_f64().max(1e-12);
        let sub = format!(
            "{} · {} cut",
            l.workload.as_deref().unwrap_or(NONE),
            pct(cut)
        );
        Some(BarRow { label, sub, bars })
    };
    let rows = some(r.inference.iter().filter_map(row).collect())?;
    let keys: Vec<(&str, &str)> = [("paid", PALETTE[0])].into_iter().chain(levers).collect();
    let title = "Saved by the levers";
    let note = "What the requests cost, beside what the calls each lever replaced would have cost.";
    Some(section(
        title,
        note,
        &(hbars(&rows, title) + &legend(&keys)),
    ))
}

/// The semantic cache's verified hits per workload and model, with the estimated share of
/// them that was wrong beside the bound they were served under.
fn wrong_hits_table(r: &Report) -> Option<String> {
    let cells = |workload: &str, model: &str, h: &WrongHits| {
        vec![
            esc(workload),
            esc(model),
            thousands(h.verified_hits),
            format!("{:.1}", h.expected_wrong),
            pct1(h.wrong_rate),
            esc(&interval(h.wrong_low, h.wrong_high)),
            h.max_error.map_or(NONE.to_owned(), pct1),
        ]
    };
    let mut rows: Vec<Vec<String>> = r
        .inference
        .iter()
        .filter_map(|l| {
            let name = |n: &Option<String>| n.clone().unwrap_or(NONE.to_owned());
            Some(cells(
                &name(&l.workload),
                &name(&l.model),
                l.semantic.as_ref()?,
            ))
        })
        .collect();
    if rows.len() > 1
        && let Some(all) = &r.semantic
    {
        rows.push(cells("total", "", all));
    }
    let rows = some(rows)?;
    let head = "workload|model|verified hits>|likely wrong>|wrong rate>|95% interval>|bound>";
    let title = "Semantic cache: wrong hits, estimated";
    let note = "Semantic hits a paraphrase verifier let through, each wrong with the chance it \
                gave (1 - p): likely wrong is their sum, the rate its share of the hits, with a \
                95% interval; bound: semantic_max_error, the share that may be wrong.";
    Some(section(title, note, &table(head, &rows)))
}

/// Quality kept beside each lever's saving, where its answers were shadowed.
fn quality_table(r: &Report) -> Option<String> {
    let rows = r
        .quality
        .iter()
        .map(|l| l.cells().iter().map(|c| esc(c)).collect())
        .collect();
    let rows = some(rows)?;
    let title = "Quality kept beside each saving, measured online";
    Some(section(
        title,
        QUALITY_NOTE,
        &table(&QUALITY_HEAD.join("|"), &rows),
    ))
}

fn levers_section(r: &Report) -> Option<String> {
    let row = |l: &Lever| BarRow {
        label: l.lever.to_owned(),
        sub: String::new(),
        bars: vec![bar(l.dollars, PALETTE[2], usd_unit(l.dollars))],
    };
    let rows = some(r.levers.iter().map(row).collect())?;
    let cell = |(i, l): (usize, &Lever)| {
        let (n, lever, basis) = ((i + 1).to_string(), esc(l.lever), esc(&l.basis));
        vec![n, lever, usd_unit(l.dollars), basis, esc(&l.action)]
    };
    let cells: Vec<Vec<String>> = r.levers.iter().enumerate().map(cell).collect();
    let title = "Levers by dollars at stake";
    let body = hbars(&rows, title) + &table("#>|lever|at stake>|basis|action", &cells);
    let note = "Dollars each lever puts at stake in this window; they overlap, so do not add them.";
    Some(section(title, note, &body))
}

fn inference_table(r: &Report) -> Option<String> {
    let opt = |m: Option<Money>| m.map_or(NONE.to_owned(), usd_unit);
    let row = |l: &InferenceLine| {
        let names = [&l.workload, &l.model].map(|n| esc(n.as_deref().unwrap_or(NONE)));
        let counts = [l.requests, l.input_tokens, l.output_tokens].map(thousands);
        let costs = [l.cost, l.idle_cost].map(usd_unit);
        let units = [l.per_1k, l.per_m_input, l.per_m_output, l.per_m_tokens].map(opt);
        let util = l.utilization.map_or(NONE.to_owned(), pct);
        [&names[..], &counts, &costs, &units, &[util]].concat()
    };
    let rows = some(r.inference.iter().map(row).collect())?;
    let head = "workload|model|requests>|in tokens>|out tokens>|cost>|idle>|$/1k req>|$/1M in>|\
                $/1M out>|$/1M tok>|util>";
    let note = "Idle capacity is charged to the workload (and model) it stood by for.";
    let title = "Inference by workload and model";
    Some(section(title, note, &table(head, &rows)))
}

fn pools_table(r: &Report) -> Option<String> {
    let opt = |m: Option<Money>| m.map_or(NONE.to_owned(), usd_unit);
    let row = |p: &PoolLine| {
        let hours = format!("{:.1}", p.replica_hours);
        let busy = p.busy_share.map_or(NONE.to_owned(), pct);
        let starts = format!("{} ({} failed)", p.cold_starts, p.failed_starts);
        let wait = p
            .wait_p99_ms
            .map_or(NONE.to_owned(), |ms| format!("{:.1} s", ms as f64 / 1000.0));
        let money = [Some(p.cost), p.per_1k, p.fixed_cost, p.saving_vs_fixed].map(opt);
        let counts = [hours, thousands(p.requests), busy, starts, wait];
        [&[esc(&p.pool)][..], &counts, &money].concat()
    };
    let rows = some(r.pools.iter().map(row).collect())?;
    let head = "pool|replica-h>|requests>|busy>|cold starts>|p99 wait>|cost>|$/1k req>|\
                fixed pool>|saved>";
    let note = "Replicas scaled to demand, against max_replicas running throughout at the same \
                hourly rate.";
    Some(section("Pools", note, &table(head, &rows)))
}

fn servers_table(r: &Report) -> Option<String> {
    let opt = |m: Option<Money>| m.map_or(NONE.to_owned(), usd_unit);
    let row = |s: &ServerLine| {
        let names = [&s.server, &s.model].map(|n| esc(n));
        let counts = [
            format!("{:.1}", s.hours),
            thousands(s.requests),
            thousands(s.input_tokens + s.output_tokens),
            s.busy_share.map_or(NONE.to_owned(), pct),
        ];
        let money = [
            Some(s.cost),
            Some(s.idle_cost),
            s.per_1k,
            s.per_m_tokens,
            s.busy_per_1k,
        ]
        .map(opt);
        [&names[..], &counts, &money].concat()
    };
    let rows = some(r.servers.iter().map(row).collect())?;
    let head = "server|model|hours>|requests>|tokens>|busy>|cost>|idle>|$/1k req>|$/1M tok>|\
                $/1k busy>";
    let note = "Servers frugal watch scraped: their hours at the instance's price, busy or idle; \
                $/1k busy is what a thousand requests would cost at full use.";
    Some(section("Watched servers", note, &table(head, &rows)))
}

/// `frugal report --by`: spend by tenant, model, workload or day, and their total.
fn spend_table(r: &Report) -> Option<String> {
    let spend = r.spend.as_ref()?;
    let row = |l: &SpendLine| {
        let name = esc(l.name.as_deref().unwrap_or(NONE));
        let counts = [l.events, l.requests, l.input_tokens + l.output_tokens].map(thousands);
        let money = [l.cost, l.waste].map(usd_unit);
        [&[name][..], &counts, &money, &[pct(l.share)]].concat()
    };
    let mut rows: Vec<Vec<String>> = spend.lines.iter().map(row).collect();
    rows.push(vec![
        "total".into(),
        String::new(),
        String::new(),
        String::new(),
        usd_unit(spend.total),
        String::new(),
        String::new(),
    ]);
    let head = format!(
        "{}|events>|requests>|tokens>|cost>|waste>|share>",
        spend.by.noun()
    );
    let title = format!("Spend by {}", spend.by.noun());
    let note = "Each event counted whole where it starts; the lines add up to the total.";
    Some(section(&title, note, &table(&head, &rows)))
}

fn batch_table(r: &Report) -> Option<String> {
    let opt = |m: Option<Money>| m.map_or(NONE.to_owned(), usd_unit);
    let row = |l: &BatchJobLine| {
        let names = [esc(&l.job), esc(l.model.as_deref().unwrap_or(NONE))];
        let counts = [l.lines, l.input_tokens + l.output_tokens].map(thousands);
        let money = [
            Some(l.cost),
            l.on_demand_cost,
            l.saving,
            l.per_1k,
            l.per_m_tokens,
        ];
        let beside = [l.interactive_per_1k, l.interactive_per_m_tokens];
        [&names[..], &counts, &money.map(opt), &beside.map(opt)].concat()
    };
    let rows = some(r.batch.iter().map(row).collect())?;
    let head = "job|model|lines>|tokens>|cost>|on demand>|saved>|$/1k lines>|$/1M tok>|\
                interactive $/1k>|interactive $/1M tok>";
    let note = "Each batch job beside its model's interactive traffic, whose idle capacity is \
                charged to it; on demand: the same machine time at the on-demand price, where \
                the job ran on spot.";
    Some(section("Batch jobs", note, &table(head, &rows)))
}

fn training_table(r: &Report) -> Option<String> {
    let opt = |m: Option<Money>| m.map_or(NONE.to_owned(), usd_unit);
    let row = |l: &RunLine| {
        let names = [&l.run, &l.workload].map(|n| esc(n));
        let counts = [l.segments, l.preemptions, l.failures].map(|n| n.to_string());
        let hours = format!("{:.1}", l.duration_ms as f64 / 3.6e6);
        let lost = format!("{:.0}", l.lost_ms as f64 / 6e4);
        let (cost, lost_cost, waste) = (Some(l.cost), Some(l.lost_cost), Some(l.waste));
        let costs = [cost, l.on_demand_cost, l.saving, lost_cost, waste];
        let util = l.utilization.map_or(NONE.to_owned(), pct);
        let mfu = match (l.mfu, l.precision) {
            (Some(m), Some(p)) => format!("{} {p}", pct1(m)),
            (Some(m), None) => pct1(m),
            (None, _) => NONE.to_owned(),
        };
        let done = if l.completed { "yes" } else { "no" }.to_owned();
        let rest = [util, mfu, done];
        [&names[..], &counts, &[hours, lost], &costs.map(opt), &rest].concat()
    };
    let rows = some(r.training.iter().map(row).collect())?;
    let head = "run|workload|segs>|preempts>|fails>|hours>|lost min>|cost>|on demand>|saved>|\
                redone>|waste>|util>|mfu>|done";
    let note = "Redone: the cost of work repeated after preemptions and failures. MFU: model \
                FLOPs utilization at the precision it computed in, where its trainer reports \
                FLOPs.";
    Some(section("Training runs", note, &table(head, &rows)))
}

/// A table of pre-escaped cells under `|`-separated headings; a heading ending in `>`
/// marks a right-aligned number column.
fn table(head: &str, rows: &[Vec<String>]) -> String {
    let numeric: Vec<bool> = head.split('|').map(|h| h.ends_with('>')).collect();
    let class = |i: usize| match numeric.get(i) {
        Some(true) => " class=\"n\"",
        _ => "",
    };
    let mut out = String::from("<div class=\"scroll\"><table>\n<thead><tr>");
    for (i, h) in head.split('|').enumerate() {
        let h = esc(h.trim_end_matches('>'));
        out.push_str(&format!("<th{}>{h}</th>", class(i)));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in rows {
        out.push_str("<tr>");
        for (i, cell) in row.iter().enumerate() {
            out.push_str(&format!("<td{}>{cell}</td>", class(i)));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table></div>\n");
    out
}

/// Charts and tables with no rows are left out.
fn some<T>(rows: Vec<T>) -> Option<Vec<T>> {
    (!rows.is_empty()).then_some(rows)
}

/// Idle in red: it is all waste, and should stand out as such.
fn kind_colour(kind: Kind) -> &'static str {
    match kind {
        Kind::Inference => PALETTE[0],
        Kind::Training => PALETTE[1],
        Kind::Idle => PALETTE[3],
        Kind::Other => PALETTE[4],
    }
}

fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;
    use crate::event::{Capacity, Event, Outcome, ReplicaSpan};
    use crate::ledger::{Ledger, Window};

    const T0: Millis = 1_793_000_000_000;
    const HOUR_MS: Millis = 3_600_000;

    fn m(s: &str) -> Money {
        s.parse().unwrap()
    }

    fn render_events(events: &[Event]) -> String {
        render_with_spans(events, &[])
    }

    fn render_with_spans(events: &[Event], spans: &[ReplicaSpan]) -> String {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = Ledger::open(dir.path().join("l.sqlite")).unwrap();
        ledger.append_with_spans("t", events, spans).unwrap();
        let catalog = Catalog::builtin().unwrap();
        let report = Report::build(&ledger, &catalog, Window::default()).unwrap();
        render(&report, "/tmp/<ledger>.sqlite")
    }

    fn event(kind: Kind, workload: &str, model: Option<&str>, requests: u64, cost: &str) -> Event {
        let mut e = Event::new(T0, kind, workload, m(cost));
        (e.model, e.requests) = (model.map(Into::into), requests);
        e
    }

    /// A workload whose name needs escaping, idle capacity, a preempted spot run, a credit.
    fn events() -> Vec<Event> {
        let mut llama = event(Kind::Inference, "<b>&co", Some("llama"), 1000, "7");
        llama.instance_type = Some("g5.xlarge".into());
        let mut idle = event(Kind::Idle, "<b>&co", None, 0, "3");
        (idle.ts_ms, idle.instance_type) = (T0 + HOUR_MS, Some("g5.xlarge".into()));
        let mut small = event(Kind::Inference, "<b>&co", Some("small"), 4, "0.0032");
        (small.saved, small.lever) = (m("0.5"), Some(crate::event::Lever::Batching));
        let mut run = event(Kind::Training, "pretrain", None, 0, "2");
        (run.run_id, run.capacity) = (Some("r1".into()), Some(Capacity::Spot));
        (run.duration_ms, run.list_cost) = (2 * HOUR_MS, Some(m("6")));
        (run.outcome, run.utilization) = (Some(Outcome::Preempted), Some(0.5));
        let credit = event(Kind::Other, "credits", None, 0, "-1.5");
        vec![llama, idle, small, run, credit]
    }

    /// Rust's float text for infinity, as opposed to "inf" inside a word like "inference".
    fn has_bare_inf(html: &str) -> bool {
        let letter = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphabetic);
        let bytes = html.as_bytes();
        let bare = |i: usize| !letter(i.checked_sub(1).and_then(|j| bytes.get(j)));
        let after = |i: usize| !letter(bytes.get(i + 3));
        html.match_indices("inf").any(|(i, _)| bare(i) && after(i))
    }

    #[test]
    fn renders_a_self_contained_page_with_every_section() {
        let html = render_events(&events());
        assert!(html.starts_with("<!doctype html>") && html.ends_with("</html>\n"));
        assert!(html.contains("<svg") && !html.contains("<script"));
        assert!(!html.contains("http://") && !html.contains("https://") && !html.contains("url("));
        assert!(html.contains("&lt;b&gt;&amp;co") && !html.contains("<b>&co"));
        assert!(html.contains("/tmp/&lt;ledger&gt;.sqlite"));
        let titles = [
            "frugal report",
            "Cost over time by workload",
            "Cost per 1,000 inferences by model",
            "Where the money goes",
            "Training runs: actual vs on-demand",
            "Saved by the levers",
            "Levers by dollars at stake",
            "Inference by workload and model",
            "<h2>Training runs</h2>",
        ];
        titles.iter().for_each(|t| assert!(html.contains(t), "{t}"));
        assert!(!html.contains("NaN") && !has_bare_inf(&html));
        assert!(!html.contains("width=\"-"), "no bar drawn backwards");
        assert!(html.contains("saved $4.00 · 1 preemption"));
        assert!(html.contains("$0.50 saved by batching"));
        // llama per 1,000 requests: ($7 + $3 idle) / 1,000 x 1,000.
        assert!(html.contains(">$10.00<"));
    }

    #[test]
    fn batch_jobs_get_a_table_beside_interactive_costs() {
        assert!(!render_events(&events()).contains("<h2>Batch jobs</h2>"));
        let mut lines = event(Kind::Inference, "batch", Some("llama"), 400, "1");
        lines.run_id = Some("batch_<1>".into());
        lines.list_cost = Some(m("3"));
        let mut all = events();
        all.push(lines);
        let html = render_events(&all);
        assert!(html.contains("<h2>Batch jobs</h2>"), "{html}");
        let row = "<td>batch_&lt;1&gt;</td><td>llama</td><td class=\"n\">400</td>";
        assert!(html.contains(row), "{html}");
        assert!(html.contains("<td class=\"n\">$3.00</td><td class=\"n\">$2.00</td>"));
    }

    #[test]
    fn verified_semantic_hits_get_a_table_with_their_wrong_rate() {
        assert!(!render_events(&events()).contains("wrong hits, estimated"));
        let mut all = events();
        all.extend((0..100).map(|_| {
            let mut hit = event(Kind::Inference, "<b>&co", Some("small"), 1, "0");
            (hit.saved, hit.lever) = (m("0.01"), Some(crate::event::Lever::SemanticCache));
            hit.wrong_chance = Some(0.02);
            hit
        }));
        let html = render_events(&all);
        assert!(
            html.contains("<h2>Semantic cache: wrong hits, estimated</h2>"),
            "{html}"
        );
        // 100 hits at 2%: 2 likely wrong, 2.0% within 0.0% .. 4.7%; no bound given.
        let row = "<td>&lt;b&gt;&amp;co</td><td>small</td><td class=\"n\">100</td>\
                   <td class=\"n\">2.0</td><td class=\"n\">2.0%</td>\
                   <td class=\"n\">0.0% .. 4.7%</td><td class=\"n\">–</td>";
        assert!(html.contains(row), "{html}");
    }

    #[test]
    fn shadowed_levers_get_a_quality_table() {
        assert!(!render_events(&events()).contains("Quality kept"));
        let verdict = crate::event::Verdict {
            agreed: true,
            method: crate::event::Agreement::Embedding,
        };
        let mut all = events();
        all.extend(crate::ledger::testing::shadow_rows(
            T0,
            2_000_000,
            Some(verdict),
        ));
        let html = render_events(&all);
        assert!(
            html.contains("<h2>Quality kept beside each saving, measured online</h2>"),
            "{html}"
        );
        // One sample that agreed: 100%, its Wilson interval 20.7% .. 100%, $0.002 to ask.
        let row = "<td>routing</td><td>chat</td><td>route</td><td class=\"n\">$0.00</td>\
                   <td class=\"n\">100.0%</td><td class=\"n\">20.7% .. 100.0%</td>\
                   <td class=\"n\">1</td><td>embedding</td><td class=\"n\">$0.002000</td>";
        assert!(html.contains(row), "{html}");
    }

    #[test]
    fn pools_get_a_table() {
        assert!(!render_events(&events()).contains("<h2>Pools</h2>"));
        let span = ReplicaSpan {
            duration_ms: HOUR_MS,
            workload: "<b>&co".into(),
            pool: "llama".into(),
            busy_ms: HOUR_MS / 2,
            max_replicas: 3,
            ..crate::test_events::span(T0, m("2"))
        };
        let html = render_with_spans(&events(), &[span]);
        assert!(html.contains("<h2>Pools</h2>"));
        // 3 replicas for the span's hour at its $2 an hour; 1,000 requests for $2.
        let row = "<td>llama</td><td class=\"n\">1.0</td><td class=\"n\">1,000</td>\
                   <td class=\"n\">50%</td><td class=\"n\">0 (0 failed)</td>\
                   <td class=\"n\">0.0 s</td><td class=\"n\">$2.00</td><td class=\"n\">$2.00</td>\
                   <td class=\"n\">$6.00</td><td class=\"n\">$4.00</td>";
        assert!(html.contains(row), "{html}");
    }

    #[test]
    fn an_empty_ledger_says_so() {
        let html = render_events(&[]);
        assert!(html.starts_with("<!doctype html>"));
        assert!(html.contains("No events in this window"));
        assert!(!html.contains("NaN") && !has_bare_inf(&html) && !html.contains("<svg"));
    }

    #[test]
    fn credits_alone_draw_no_chart() {
        let html = render_events(&[event(Kind::Other, "credits", None, 0, "-4")]);
        assert!(html.contains("-$4.00") && !html.contains("<svg"));
        assert!(!html.contains("NaN") && !has_bare_inf(&html));
    }
}
