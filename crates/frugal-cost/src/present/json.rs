//! JSON as commands print it: each amount of money twice, the integer nano-dollars under its
//! field's name (deprecated, kept one release) and the exact dollars as a decimal string
//! under the same name with `_usd` (`"total": 3802071, "total_usd": "0.003802071"`). A list
//! or a map of amounts gets a `_usd` twin of strings. Strings, not floats: no rounding.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::money::{self, Money};

/// `value` as JSON, with a `_usd` field beside every amount of money.
pub fn to_value(value: &impl Serialize) -> serde_json::Result<Value> {
    let mut v = money::tagged(|| serde_json::to_value(value))?;
    if untag(&mut v).is_none() {
        dollars(&mut v);
    }
    Ok(v)
}

/// The field name of an amount in dollars: `cost` -> `cost_usd`.
fn usd_key(key: &str) -> String {
    format!("{key}_usd")
}

fn is_tag(v: &Value) -> bool {
    matches!(v, Value::Object(m) if m.len() == 1 && m.get(money::TAG).is_some_and(Value::is_i64))
}

/// A tagged amount back to its integer nano-dollars; the amount.
fn untag(v: &mut Value) -> Option<Money> {
    if !is_tag(v) {
        return None;
    }
    let nanos = v.get(money::TAG).and_then(Value::as_i64)?;
    *v = Value::from(nanos);
    Some(Money::from_nanos(nanos))
}

fn decimal(v: &mut Value) -> Value {
    untag(v).map_or(Value::Null, |m| Value::String(m.to_decimal()))
}

/// Untags every amount under `v`, adding the `_usd` twins.
fn dollars(v: &mut Value) {
    match v {
        Value::Array(items) => {
            for item in items {
                if untag(item).is_none() {
                    dollars(item);
                }
            }
        }
        Value::Object(map) => {
            let mut twins = Vec::new();
            for (key, field) in map.iter_mut() {
                match usd_of(field) {
                    Some(usd) => twins.push((usd_key(key), usd)),
                    None => dollars(field),
                }
            }
            for (key, usd) in twins {
                map.entry(key).or_insert(usd);
            }
        }
        _ => {}
    }
}

/// The dollars of a field that holds money (an amount, or a list or map of amounts, `null`
/// for none), turning the amounts back into nano-dollars; `None` for any other field.
fn usd_of(field: &mut Value) -> Option<Value> {
    let money_or_null = |v: &Value| is_tag(v) || v.is_null();
    match field {
        v if is_tag(v) => Some(decimal(v)),
        Value::Array(items) if items.iter().any(is_tag) && items.iter().all(money_or_null) => {
            Some(Value::Array(items.iter_mut().map(decimal).collect()))
        }
        Value::Object(map) if map.values().any(is_tag) && map.values().all(money_or_null) => {
            let usd: Map<String, Value> = map
                .iter_mut()
                .map(|(k, v)| (k.clone(), decimal(v)))
                .collect();
            Some(Value::Object(usd))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Serialize)]
    struct Line {
        name: &'static str,
        cost: Money,
        per_1k: Option<Money>,
        none: Option<Money>,
        by_day: Vec<Money>,
        by_model: BTreeMap<&'static str, Money>,
        nested: Vec<Inner>,
        count: u64,
    }

    #[derive(Serialize)]
    struct Inner {
        waste: Money,
    }

    #[test]
    fn every_amount_has_its_dollars_beside_it() {
        let line = Line {
            name: "chat",
            cost: Money::from_nanos(3_802_071),
            per_1k: Some("12.5".parse().unwrap()),
            none: None,
            by_day: vec![Money::from_nanos(1), Money::from_cents(-300)],
            by_model: BTreeMap::from([("a", Money::from_nanos(20))]),
            nested: vec![Inner { waste: Money::ZERO }],
            count: 7,
        };
        let v = to_value(&line).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "name": "chat",
                "cost": 3802071, "cost_usd": "0.003802071",
                "per_1k": 12500000000_i64, "per_1k_usd": "12.50",
                "none": null,
                "by_day": [1, -3000000000_i64], "by_day_usd": ["0.000000001", "-3.00"],
                "by_model": {"a": 20}, "by_model_usd": {"a": "0.00000002"},
                "nested": [{"waste": 0, "waste_usd": "0.00"}],
                "count": 7,
            })
        );
        // Outside `to_value`, an amount is the integer it always was.
        assert_eq!(serde_json::to_string(&Money::from_nanos(5)).unwrap(), "5");
        assert_eq!(to_value(&Money::from_nanos(5)).unwrap(), Value::from(5));
    }
}
