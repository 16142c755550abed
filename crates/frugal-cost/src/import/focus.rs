//! FOCUS billing exports: columns found by name in the header, costs in US dollars only.

use std::collections::HashMap;

use super::row::{parse_ts, usd_only};
use crate::event::{Capacity, Event, Kind};
use crate::money::Money;

/// Column positions of a FOCUS header. Only EffectiveCost and ChargePeriodStart are required.
pub(super) struct FocusColumns {
    index: HashMap<String, usize>,
}

impl FocusColumns {
    pub(super) fn new(headers: &csv::StringRecord) -> Result<FocusColumns, String> {
        let index: HashMap<String, usize> = headers
            .iter()
            .enumerate()
            .map(|(i, h)| (h.trim().to_owned(), i))
            .collect();
        for required in ["EffectiveCost", "ChargePeriodStart"] {
            if !index.contains_key(required) {
                return Err(format!(
                    "not a FOCUS export: the header has no `{required}` column"
                ));
            }
        }
        Ok(FocusColumns { index })
    }

    fn get<'r>(&self, rec: &'r csv::StringRecord, name: &str) -> Option<&'r str> {
        let v = rec.get(*self.index.get(name)?)?.trim();
        (!v.is_empty()).then_some(v)
    }

    /// One FOCUS row as an event; `None` for rows that carry no cost of their own.
    ///
    /// EffectiveCost is the cost basis: it amortizes prepaid commitments over the usage they
    /// cover, and FOCUS sets it to 0 on the purchase rows themselves, which are skipped. The
    /// unused part of a commitment (CommitmentDiscountStatus = Unused) is capacity paid and
    /// not used: idle. Tags (a JSON object) name frugal's kind, workload, model and run.
    pub(super) fn event(&self, rec: &csv::StringRecord) -> Result<Option<Event>, String> {
        let get = |name: &str| self.get(rec, name);
        let start = get("ChargePeriodStart").ok_or("ChargePeriodStart: missing")?;
        let ts_ms = parse_ts(start).map_err(|e| format!("ChargePeriodStart: {e}"))?;
        let end_ms = get("ChargePeriodEnd")
            .map(|t| parse_ts(t).map_err(|e| format!("ChargePeriodEnd: {e}")))
            .transpose()?
            .unwrap_or(ts_ms);
        if end_ms < ts_ms {
            return Err("ChargePeriodEnd: before ChargePeriodStart".to_owned());
        }
        // Epoch milliseconds span all of i64: the period's length may not fit in one.
        let duration_ms = end_ms
            .checked_sub(ts_ms)
            .ok_or("ChargePeriodEnd: the charge period is too long to be a duration")?;
        let money = |name: &str| {
            get(name)
                .map(|v| parse_decimal(v).map_err(|e| format!("{name}: {e}")))
                .transpose()
        };
        if let Some(currency) = get("BillingCurrency") {
            usd_only("BillingCurrency", currency)?;
        }
        let cost = money("EffectiveCost")?.ok_or("EffectiveCost: missing (FOCUS requires it)")?;
        let category = get("ChargeCategory").unwrap_or("Usage");
        if category.eq_ignore_ascii_case("Purchase") && cost == Money::ZERO {
            return Ok(None);
        }
        let tags: HashMap<String, serde_json::Value> = match get("Tags") {
            Some(t) => {
                serde_json::from_str(t).map_err(|e| format!("Tags: not a JSON object: {e}"))?
            }
            None => HashMap::new(),
        };
        let tag = |keys: &[&str]| {
            keys.iter().find_map(|k| match tags.get(*k) {
                Some(serde_json::Value::String(s)) if !s.is_empty() => Some(s.clone()),
                _ => None,
            })
        };
        let unused =
            get("CommitmentDiscountStatus").is_some_and(|s| s.eq_ignore_ascii_case("Unused"));
        let kind = if unused {
            Kind::Idle
        } else if !category.eq_ignore_ascii_case("Usage") {
            Kind::Other
        } else {
            match tag(&["frugal-kind", "frugal:kind", "kind"]) {
                Some(k) => k.parse::<Kind>().map_err(|e| format!("Tags: {e}"))?,
                None => Kind::Other,
            }
        };
        let workload = tag(&[
            "frugal-workload",
            "frugal:workload",
            "workload",
            "app",
            "service",
        ])
        .or_else(|| {
            unused
                .then(|| get("CommitmentDiscountName").or(get("CommitmentDiscountId")))
                .flatten()
                .map(str::to_owned)
        })
        .or_else(|| {
            get("ResourceName")
                .or(get("ResourceId"))
                .or(get("ServiceName"))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unattributed".to_owned());
        let mut e = Event::new(ts_ms, kind, workload, cost);
        e.duration_ms = duration_ms;
        e.model = tag(&["frugal-model", "frugal:model", "model"]);
        e.run_id = tag(&["frugal-run", "frugal:run", "run_id"]);
        e.instance_type = tag(&["frugal-instance", "instance_type"])
            .or_else(|| get("x_InstanceType").map(str::to_owned));
        e.region = get("RegionId").map(str::to_owned);
        e.capacity = get("PricingCategory").and_then(|p| match p.to_ascii_lowercase().as_str() {
            "standard" | "on-demand" => Some(Capacity::OnDemand),
            "dynamic" => Some(Capacity::Spot),
            "committed" | "commitment-based" => Some(Capacity::Reserved1y),
            _ => None,
        });
        e.list_cost = money("ListCost")?;
        if let (Some(q), Some(unit)) = (get("ConsumedQuantity"), get("ConsumedUnit")) {
            let q = q
                .parse::<f64>()
                .map_err(|_| format!("ConsumedQuantity: `{q}` is not a number"))?;
            let n = q.max(0.0).round() as u64;
            let unit = unit.to_ascii_lowercase();
            let what = get("ChargeDescription").unwrap_or("").to_ascii_lowercase();
            if unit.contains("token") {
                let scale = if unit.contains("1k") || unit.contains("1000") {
                    1000
                } else {
                    1
                };
                if what.contains("output") {
                    e.output_tokens = n * scale;
                } else {
                    e.input_tokens = n * scale;
                }
            } else if unit.contains("request") {
                e.requests = n;
            }
        }
        Ok(Some(e))
    }
}

/// FOCUS decimals may carry more places than a nano-dollar or an exponent; round them.
fn parse_decimal(v: &str) -> Result<Money, String> {
    v.parse::<Money>().or_else(|_| {
        v.parse::<f64>()
            .ok()
            .and_then(Money::from_f64_dollars)
            .ok_or_else(|| format!("`{v}` is not a number"))
    })
}
