//! frugal's own columns, from CSV and JSONL: timestamps, counts and seconds by name, and
//! a cost from the catalog where a row has none.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;
use std::str::FromStr;

use super::error::ImportError;
use super::row::{Accept, Parsed, content_hash, parse_ts, usd_only};
use crate::catalog::Catalog;
use crate::event::{Capacity, Event, Kind, Outcome};
use crate::money::{Millis, Money};

pub(super) fn read_jsonl(
    reader: impl BufRead,
    path: &Path,
    catalog: &Catalog,
    accept: &mut Accept<'_>,
) -> Result<(), ImportError> {
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(|source| ImportError::Read {
            path: path.to_owned(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let mut content = [0; 32];
        let event = serde_json::from_str::<HashMap<String, serde_json::Value>>(&line)
            .map_err(|e| format!("not a JSON object: {e}"))
            .and_then(|map| {
                let map: HashMap<String, serde_json::Value> = map
                    .into_iter()
                    .map(|(k, v)| (k.to_ascii_lowercase(), v))
                    .collect();
                let fields = JsonFields(&map);
                let values: Vec<(&str, Cow<'_, str>)> = map
                    .keys()
                    .filter_map(|k| Some((k.as_str(), fields.get(k)?)))
                    .collect();
                content = content_hash(values.iter().map(|(k, v)| (*k, v.as_ref())));
                native_event(&fields, catalog)
            });
        accept(Parsed {
            line: i as u64 + 1,
            content,
            event: event.map(Some),
        })?;
    }
    Ok(())
}

/// A source of named fields for one native row.
trait Fields {
    fn get(&self, name: &str) -> Option<Cow<'_, str>>;
}

struct JsonFields<'a>(&'a HashMap<String, serde_json::Value>);

impl Fields for JsonFields<'_> {
    fn get(&self, name: &str) -> Option<Cow<'_, str>> {
        match self.0.get(name)? {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) => Some(Cow::Borrowed(s.as_str())),
            other => Some(Cow::Owned(other.to_string())),
        }
    }
}

const NATIVE: &[&str] = &[
    "ts",
    "end",
    "duration_s",
    "kind",
    "workload",
    "model",
    "run_id",
    "instance_type",
    "region",
    "capacity",
    "instances",
    "requests",
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "utilization",
    "cost_usd",
    "currency",
    "outcome",
    "lost_s",
];

/// Column positions of a native CSV header.
pub(super) struct NativeColumns {
    index: HashMap<&'static str, usize>,
}

struct CsvFields<'a> {
    columns: &'a NativeColumns,
    record: &'a csv::StringRecord,
}

impl Fields for CsvFields<'_> {
    fn get(&self, name: &str) -> Option<Cow<'_, str>> {
        let v = self.record.get(*self.columns.index.get(name)?)?.trim();
        (!v.is_empty()).then_some(Cow::Borrowed(v))
    }
}

impl NativeColumns {
    pub(super) fn new(headers: &csv::StringRecord) -> Result<NativeColumns, String> {
        let mut index = HashMap::new();
        for (i, h) in headers.iter().enumerate() {
            let h = h.trim().to_ascii_lowercase();
            match NATIVE.iter().find(|n| **n == h) {
                Some(name) => {
                    index.insert(*name, i);
                }
                None => {
                    return Err(format!(
                        "unknown column `{h}` (known: {}; for a FOCUS export pass --format focus)",
                        NATIVE.join(", ")
                    ));
                }
            }
        }
        for required in ["ts", "kind", "workload"] {
            if !index.contains_key(required) {
                return Err(format!("the header has no `{required}` column"));
            }
        }
        Ok(NativeColumns { index })
    }

    pub(super) fn event(
        &self,
        record: &csv::StringRecord,
        catalog: &Catalog,
    ) -> Result<Option<Event>, String> {
        native_event(
            &CsvFields {
                columns: self,
                record,
            },
            catalog,
        )
        .map(Some)
    }
}

fn parse_field<T: FromStr>(f: &dyn Fields, name: &str) -> Result<Option<T>, String>
where
    T::Err: std::fmt::Display,
{
    f.get(name)
        .map(|v| v.parse::<T>().map_err(|e| format!("{name}: `{v}`: {e}")))
        .transpose()
}

fn count(f: &dyn Fields, name: &str) -> Result<Option<u64>, String> {
    f.get(name)
        .map(|v| {
            // JSON writers emit 12.0 for integers now and then.
            let t = v.strip_suffix(".0").unwrap_or(&v);
            t.parse::<u64>()
                .map_err(|_| format!("{name}: `{v}` is not a whole number >= 0"))
        })
        .transpose()
}

fn seconds(f: &dyn Fields, name: &str) -> Result<Option<Millis>, String> {
    match parse_field::<f64>(f, name)? {
        Some(s) if !(s.is_finite() && s >= 0.0) => Err(format!("{name}: must be >= 0, got {s}")),
        Some(s) => Ok(Some((s * 1000.0).round() as Millis)),
        None => Ok(None),
    }
}
fn native_event(f: &dyn Fields, catalog: &Catalog) -> Result<Event, String> {
    let required = |name: &str| f.get(name).ok_or_else(|| format!("{name}: missing"));
    let ts_ms = parse_ts(&required("ts")?).map_err(|e| format!("ts: {e}"))?;
    let kind: Kind = required("kind")?
        .parse()
        .map_err(|e| format!("kind: {e}"))?;
    let workload = required("workload")?.into_owned();
    if let Some(currency) = f.get("currency") {
        usd_only("currency", &currency)?;
    }
    let duration_ms = match (f.get("end"), seconds(f, "duration_s")?) {
        (Some(end), None) => {
            let end = parse_ts(&end).map_err(|e| format!("end: {e}"))?;
            if end < ts_ms {
                return Err(format!("end: before ts by {} ms", ts_ms.abs_diff(end)));
            }
            // Epoch milliseconds span all of i64: the difference may not fit in one.
            end.checked_sub(ts_ms)
                .ok_or_else(|| "end: too far after ts to be a duration".to_owned())?
        }
        (None, d) => d.unwrap_or(0),
        (Some(_), Some(_)) => return Err("give `end` or `duration_s`, not both".to_owned()),
    };
    let mut e = Event::new(ts_ms, kind, workload, Money::ZERO);
    e.duration_ms = duration_ms;
    e.model = f.get("model").map(Cow::into_owned);
    e.run_id = f.get("run_id").map(Cow::into_owned);
    e.instance_type = f.get("instance_type").map(Cow::into_owned);
    e.capacity = parse_field(f, "capacity")?;
    e.outcome = parse_field::<Outcome>(f, "outcome")?;
    e.instances = match count(f, "instances")? {
        Some(0) => return Err("instances: must be at least 1".to_owned()),
        Some(n) => u32::try_from(n).map_err(|_| format!("instances: {n} is too many"))?,
        None => 1,
    };
    e.requests = count(f, "requests")?.unwrap_or(u64::from(kind == Kind::Inference));
    e.input_tokens = count(f, "input_tokens")?.unwrap_or(0);
    e.output_tokens = count(f, "output_tokens")?.unwrap_or(0);
    e.cached_input_tokens = count(f, "cached_input_tokens")?.unwrap_or(0);
    if e.cached_input_tokens > e.input_tokens {
        return Err(format!(
            "cached_input_tokens: {} is more than input_tokens {}",
            e.cached_input_tokens, e.input_tokens
        ));
    }
    e.utilization = match parse_field::<f64>(f, "utilization")? {
        Some(u) if !(0.0..=1.0).contains(&u) => {
            return Err(format!("utilization: a share in [0, 1], got {u}"));
        }
        u => u,
    };
    e.lost_ms = seconds(f, "lost_s")?.unwrap_or(0);
    let explicit = f
        .get("cost_usd")
        .map(|v| v.parse::<Money>().map_err(|err| format!("cost_usd: {err}")))
        .transpose()?;
    if explicit.is_some_and(Money::is_negative) {
        return Err("cost_usd: a usage cost cannot be negative".to_owned());
    }
    e.region = f.get("region").map(Cow::into_owned);
    price(&mut e, explicit, catalog)?;
    Ok(e)
}

/// Sets the cost (explicit, or from the catalog) and the on-demand list cost.
fn price(e: &mut Event, explicit: Option<Money>, catalog: &Catalog) -> Result<(), String> {
    if let Some(instance) = e.instance_type.as_deref() {
        let offer = catalog.instance(instance, e.region.as_deref());
        if explicit.is_none() || offer.is_ok() {
            let offer = offer.map_err(|err| format!("instance_type: {err}"))?;
            if e.duration_ms == 0 && explicit.is_none() {
                return Err(
                    "no duration (`end` or `duration_s`) to price the instance time by".to_owned(),
                );
            }
            let capacity = *e.capacity.get_or_insert(Capacity::OnDemand);
            let overflow = || "cost overflows".to_owned();
            e.list_cost = Some(
                offer
                    .on_demand
                    .cost(e.duration_ms, e.instances)
                    .ok_or_else(overflow)?,
            );
            e.cost = match explicit {
                Some(c) => c,
                None => offer
                    .price(capacity)
                    .ok_or_else(|| {
                        format!("capacity: {instance} has no {capacity} price in the catalog")
                    })?
                    .cost(e.duration_ms, e.instances)
                    .ok_or_else(overflow)?,
            };
            return Ok(());
        }
    }
    if let Some(cost) = explicit {
        e.cost = cost;
        return Ok(());
    }
    match e.model.as_deref().map(|m| catalog.model(m)) {
        Some(Ok(price)) => {
            let (input, output) = price
                .cost(e.input_tokens, e.cached_input_tokens, e.output_tokens)
                .ok_or_else(|| "cost overflows".to_owned())?;
            e.cost = input + output;
            e.input_cost = Some(input);
            Ok(())
        }
        Some(Err(err)) => Err(format!("no cost_usd or instance_type, and {err}")),
        None => Err("nothing to price it by: give cost_usd, instance_type with a duration, or a model with per-token prices".to_owned()),
    }
}
