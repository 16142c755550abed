//! The report's capacity lever: for each workload the gateway's machines served on demand,
//! the planner's own answer (`frugal plan --workload W --instance T`, [`Plan::build`] on
//! [`ledger_demand`]) from the same ledger and window, so the report and the plan it
//! points to say the same count; and the plan command to run, with windows the demand
//! holds.

use std::collections::HashMap;

use super::lever::Lever;
use crate::catalog::Catalog;
use crate::event::Capacity;
use crate::ledger::{Ledger, LedgerError, Names, Window};
use crate::money::{Millis, Money};
use crate::plan::{Plan, Sizing, choose_commitment, ledger_demand, suggested_windows};
use crate::present::{pct, utc};

/// On-demand machine time of requests per (workload, instance type, region) ids: which
/// workloads the lever plans, each on the instance type it ran on most.
#[derive(Default)]
pub(super) struct Served(HashMap<(u32, u32, u32), Millis>);

impl Served {
    pub(super) fn add(&mut self, workload: u32, instance: u32, region: u32, instance_ms: Millis) {
        *self.0.entry((workload, instance, region)).or_default() += instance_ms;
    }

    /// Per workload, the (instance, region) it was served on longest (by name on a tie).
    fn by_workload<'a>(&self, names: &'a Names) -> Vec<(&'a str, &'a str, Option<&'a str>)> {
        let mut best: HashMap<u32, (Millis, u32, u32)> = HashMap::new();
        for (&(w, i, r), &ms) in &self.0 {
            let e = best.entry(w).or_insert((ms, i, r));
            let key = |(ms, i, r): (Millis, u32, u32)| (ms, names.get(i), names.get(r));
            if key((ms, i, r)) > key(*e) {
                *e = (ms, i, r);
            }
        }
        let mut out: Vec<_> = best
            .into_iter()
            .map(|(w, (_, i, r))| (names.get(w), names.get(i), (r != 0).then(|| names.get(r))))
            .collect();
        out.sort();
        out
    }
}

/// `frugal plan` for `workload` on `instance` over the report's `window`, as the report
/// suggests it.
pub fn plan_command(
    workload: &str,
    instance: &str,
    region: Option<&str>,
    window: Window,
) -> String {
    let mut words: Vec<String> = vec![
        "frugal".into(),
        "plan".into(),
        "--workload".into(),
        shell_word(workload),
        "--instance".into(),
        shell_word(instance),
    ];
    if let Some(region) = region {
        words.extend(["--region".into(), shell_word(region)]);
    }
    let w = window.whole_hours();
    for (flag, ms) in [("--since", w.since_ms), ("--until", w.until_ms)] {
        if let Some(ms) = ms {
            words.extend([flag.into(), utc(ms, "%Y-%m-%dT%H:%M:%SZ")]);
        }
    }
    words.join(" ")
}

/// `hours` as a `--fit`/`--test` value: whole days where they are.
pub fn duration_flag(hours: usize) -> String {
    if hours.is_multiple_of(24) {
        format!("{}d", hours / 24)
    } else {
        format!("{hours}h")
    }
}

/// A name quoted for a shell where it holds more than letters, digits and `-_.:/`.
fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/".contains(c));
    if plain {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The lever: what the planner commits to per workload and what it saves over the window;
/// else why it commits to nothing where a baseline is there (too short a history, no
/// reserved price).
pub(super) fn lever(
    ledger: &Ledger,
    catalog: &Catalog,
    names: &Names,
    window: Window,
    served: &Served,
) -> Result<Option<Lever>, LedgerError> {
    let mut dollars = Money::ZERO;
    let (mut committed, mut commands) = (Vec::new(), Vec::new());
    let (mut waiting, mut waiting_commands, mut unpriced) = (Vec::new(), Vec::new(), Vec::new());
    for (workload, instance, region) in served.by_workload(names) {
        let Ok(offer) = catalog.instance(instance, region) else {
            continue;
        };
        let Some(demand) = ledger_demand(ledger, workload, window)?.demand else {
            continue;
        };
        let source = format!("the ledger's workload {workload}");
        let Ok(plan) = Plan::build(source, &demand, offer, None, None) else {
            continue;
        };
        let command = plan_command(workload, instance, region, window);
        let best = plan.commitments.best();
        if best.capacity != Capacity::OnDemand && best.count > 0 {
            dollars += best.saving;
            committed.push(format!(
                "workload `{workload}`: {} x {instance} on a {} term over its {} h would have been {} busy",
                best.count,
                term(best.capacity),
                plan.commitments.hours,
                best.utilization.map_or("-".into(), pct)
            ));
            commands.push(match suggested_windows(demand.len()) {
                Some((fit, test)) => format!(
                    "`{command} --fit {} --test {}`",
                    duration_flag(fit),
                    duration_flag(test)
                ),
                None => format!("`{command}`"),
            });
            continue;
        }
        // No commitment: say why where a baseline is there to commit to.
        let hourly = demand.instances();
        let (capacity, rate) = match (offer.reserved_1y, offer.reserved_3y) {
            (Some(rate), _) => (Capacity::Reserved1y, rate),
            (None, Some(rate)) => (Capacity::Reserved3y, rate),
            (None, None) => {
                unpriced.push(instance.to_owned());
                continue;
            }
        };
        if choose_commitment(&hourly, rate, offer.on_demand, Sizing::Cheapest) == 0 {
            continue;
        }
        // Priced and steady, yet refused: too short a history for the term.
        if let Some(r) = plan
            .commitments
            .refused
            .iter()
            .find(|r| r.capacity == capacity)
        {
            waiting.push(format!("workload `{workload}` on {instance}: {}", r.reason));
            waiting_commands.push(format!("`{command}`"));
        }
    }
    Ok(if dollars > Money::ZERO {
        Some(Lever {
            lever: "reserve the steady baseline",
            dollars,
            basis: format!(
                "{}; the planner's cheapest commitment at the catalog's reserved rate",
                committed.join(", ")
            ),
            action: format!(
                "commit (reserved or savings plan) for the baseline, on-demand plus autoscaling above it; {} backtests the count",
                commands.join(" and ")
            )
            .into(),
        })
    } else if !waiting.is_empty() {
        Some(Lever {
            lever: "reserve the steady baseline",
            dollars: Money::ZERO,
            basis: format!("{}: the planner commits to nothing yet", waiting.join("; ")),
            action: format!(
                "once the ledger holds the history, {} says what to commit to",
                waiting_commands.join(" and ")
            )
            .into(),
        })
    } else if !unpriced.is_empty() {
        unpriced.sort();
        unpriced.dedup();
        Some(Lever {
            lever: "reserve the steady baseline",
            dollars: Money::ZERO,
            basis: format!(
                "{} served a steady on-demand baseline, but the catalog has no reserved price for it: add `reserved_1y` to a price file",
                unpriced.join(", ")
            ),
            action: "commit (reserved or savings plan) for the baseline that never goes away"
                .into(),
        })
    } else {
        None
    })
}

fn term(capacity: Capacity) -> &'static str {
    match capacity {
        Capacity::Reserved3y => "3-year",
        _ => "1-year",
    }
}
