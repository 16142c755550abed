//! Hosted models' per-token prices out of the box: LiteLLM's table of model prices (MIT),
//! trimmed to chat, completion, embedding and responses models with token prices and
//! embedded (see `data/model-prices/PROVENANCE.md`). A newer copy of the table, trimmed the
//! same way ([`trim`]), replaces it; a price file's `[[model]]` wins over both.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::offer::{ModelPrice, PriceSource};
use crate::money::{Money, TokenRate};

/// The embedded table.
pub const BUILTIN: &str = include_str!("../../../../data/model-prices/litellm_model_prices.json");

/// The modes kept: what a gateway bills per token.
const MODES: &[&str] = &["chat", "completion", "embedding", "responses"];
/// The fields kept of each entry: its provider, its mode and its per-token prices.
const FIELDS: &[&str] = &[
    "litellm_provider",
    "mode",
    "input_cost_per_token",
    "output_cost_per_token",
    "cache_read_input_token_cost",
    "cache_creation_input_token_cost",
    "output_cost_per_reasoning_token",
];
/// A refreshed table's file name in frugal's data folder (`<data>/frugal/`).
pub const REFRESHED: &str = "model-prices.json";

/// The key that says where a trimmed table came from.
const SOURCE_KEY: &str = "frugal_source";

/// Where a table came from and when it was taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableSource {
    /// The file it was trimmed from.
    pub table: String,
    /// The package (and version) that shipped it, when known.
    #[serde(default)]
    pub package: Option<String>,
    /// The day it was taken (YYYY-MM-DD).
    pub taken: String,
}

/// A table of model prices and where it came from.
#[derive(Debug, Clone)]
pub struct ModelTable {
    pub source: TableSource,
    pub models: Vec<ModelPrice>,
}

/// Why a table of model prices cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("not a JSON object of models: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Shape(String),
}

fn number(entry: &Map<String, Value>, key: &str) -> Option<f64> {
    entry
        .get(key)
        .and_then(Value::as_f64)
        .filter(|v| v.is_finite() && *v >= 0.0)
}

/// A price per token as a price per million tokens, to the nano-dollar.
fn per_million(per_token: f64) -> Option<TokenRate> {
    format!("{:.9}", per_token * 1e6)
        .parse::<Money>()
        .ok()
        .map(TokenRate)
}

/// LiteLLM's full table (or a trimmed one) cut to what frugal reads, with `source` saying
/// where it came from: the entries in [`MODES`] with a numeric input price, each with the
/// [`FIELDS`] that are there.
pub fn trim(text: &str, source: &TableSource) -> Result<String, TableError> {
    let all: Map<String, Value> = serde_json::from_str(text)?;
    let mut lines = vec![format!(
        "{}:{}",
        serde_json::to_string(SOURCE_KEY)?,
        serde_json::to_string(source)?
    )];
    for (name, entry) in &all {
        let Some(entry) = entry.as_object() else {
            continue;
        };
        let mode = entry.get("mode").and_then(Value::as_str);
        if !mode.is_some_and(|m| MODES.contains(&m))
            || number(entry, "input_cost_per_token").is_none()
        {
            continue;
        }
        let kept: Map<String, Value> = FIELDS
            .iter()
            .filter_map(|&f| {
                let v = entry.get(f)?;
                (v.is_string() || number(entry, f).is_some()).then(|| (f.to_owned(), v.clone()))
            })
            .collect();
        lines.push(format!(
            "{}:{}",
            serde_json::to_string(name)?,
            serde_json::to_string(&kept)?
        ));
    }
    if lines.len() == 1 {
        return Err(TableError::Shape(
            "no chat, completion or embedding model with a per-token price".into(),
        ));
    }
    Ok(format!("{{\n{}\n}}\n", lines.join(",\n")))
}

/// A trimmed table's prices.
pub fn parse(text: &str, origin: PriceSource) -> Result<ModelTable, TableError> {
    let mut all: BTreeMap<String, Value> = serde_json::from_str(text)?;
    let source = all.remove(SOURCE_KEY).ok_or_else(|| {
        TableError::Shape(format!("no `{SOURCE_KEY}`: not a table frugal trimmed"))
    })?;
    let source: TableSource = serde_json::from_value(source)?;
    let mut models = Vec::new();
    for (name, entry) in all {
        let Some(entry) = entry.as_object() else {
            continue;
        };
        let rate = |key: &str| number(entry, key).and_then(per_million);
        let Some(input) = rate("input_cost_per_token") else {
            continue;
        };
        models.push(ModelPrice {
            name,
            provider: entry
                .get("litellm_provider")
                .and_then(Value::as_str)
                .map(str::to_owned),
            input,
            // An embedding has no output tokens to bill.
            output: rate("output_cost_per_token").unwrap_or(TokenRate(Money::ZERO)),
            cached_input: rate("cache_read_input_token_cost"),
            cache_write: rate("cache_creation_input_token_cost"),
            reasoning: rate("output_cost_per_reasoning_token"),
            source: origin.clone(),
        });
    }
    Ok(ModelTable { source, models })
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_table_prices_gpt_4o_mini_as_litellm_does() {
        let t = parse(BUILTIN, PriceSource::Builtin).unwrap();
        assert_eq!(t.source.taken, "2026-12-06");
        let mini = t.models.iter().find(|m| m.name == "gpt-4o-mini").unwrap();
        let m = |s: &str| TokenRate(s.parse().unwrap());
        // 1.5e-07, 6e-07 and 7.5e-08 dollars a token.
        assert_eq!(
            (mini.input, mini.output, mini.cached_input),
            (m("0.15"), m("0.6"), Some(m("0.075")))
        );
        assert_eq!(mini.provider.as_deref(), Some("openai"));
        let sonnet = t
            .models
            .iter()
            .find(|m| m.name == "claude-sonnet-4-5")
            .unwrap();
        assert_eq!(sonnet.cache_write, Some(m("3.75")));
    }

    #[test]
    fn trimming_keeps_token_priced_models_and_says_where_they_came_from() {
        let full = r#"{
            "sample_spec": {"mode": "one of: chat, embedding", "input_cost_per_token": 0.0},
            "m-chat": {"mode": "chat", "litellm_provider": "p", "input_cost_per_token": 1e-06,
                       "output_cost_per_token": 2e-06, "max_tokens": 10, "supports_vision": true},
            "m-image": {"mode": "image_generation", "input_cost_per_token": 1e-06},
            "m-free-form": {"mode": "chat", "input_cost_per_token": "n/a"},
            "m-embed": {"mode": "embedding", "input_cost_per_token": 2e-08}
        }"#;
        let source = TableSource {
            table: "new.json".into(),
            package: None,
            taken: "2027-01-02".into(),
        };
        let trimmed = trim(full, &source).unwrap();
        let t = parse(&trimmed, PriceSource::File("new.json".into())).unwrap();
        assert_eq!(t.source, source);
        let names: Vec<&str> = t.models.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["m-chat", "m-embed"]);
        assert!(!trimmed.contains("max_tokens") && !trimmed.contains("supports_vision"));
        assert_eq!(t.models[1].output, TokenRate(Money::ZERO));
        // A trimmed table trims to itself.
        assert_eq!(trim(&trimmed, &source).unwrap(), trimmed);
        assert!(trim("{}", &source).is_err());
        assert!(parse(full, PriceSource::Builtin).is_err(), "not trimmed");
    }
}
