//! `frugal prices`: the catalog's instance offers, or its model prices, with where and
//! when they came from; `frugal prices refresh --models FILE.json` takes a newer table of
//! hosted models' prices into frugal's data folder.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use frugal_cost::Catalog;
use frugal_cost::catalog::hosted::{self, TableSource};
use frugal_cost::catalog::{InstanceOffer, OfferQuery, OfferSort};
use frugal_cost::money::TokenRate;
use frugal_cost::present::{pct, usd_per_1m};

use crate::cli::{PriceSort, PricesArgs, PricesCommand, PricesRefreshArgs};
use crate::config::Config;
use crate::table;

/// Where `frugal prices refresh` keeps the hosted models' table: frugal's data folder.
pub fn refreshed(config: &Config) -> Option<PathBuf> {
    config
        .data_home
        .as_ref()
        .map(|h| h.join("frugal").join(hosted::REFRESHED))
}

pub fn run(config: &Config, catalog: &Catalog, args: &PricesArgs) -> Result<()> {
    if let Some(PricesCommand::Refresh(r)) = &args.action {
        return refresh(config, r);
    }
    if args.models {
        return models(catalog, args);
    }
    let query = OfferQuery {
        provider: args.provider.clone(),
        gpu: args.gpu.clone(),
        instance: args.instance.clone(),
        region: args.region.clone(),
        max_price: args.max_price,
        sort: match args.sort {
            PriceSort::PerGpu => OfferSort::PerGpu,
            PriceSort::OnDemand => OfferSort::OnDemand,
            PriceSort::Spot => OfferSort::Spot,
            PriceSort::Saving => OfferSort::Saving,
        },
    };
    let (mut whole, mut apart) = catalog.search_apart(&query);
    if whole.is_empty() && apart.is_empty() {
        bail!("no instance in the catalog matches these filters");
    }
    let (total_whole, total_apart) = (whole.len(), apart.len());
    if args.limit > 0 {
        whole.truncate(args.limit);
        apart.truncate(args.limit);
    }
    if args.json {
        // Whole machines first, then the accelerators priced without their VM.
        let all: Vec<&InstanceOffer> = whole.iter().chain(&apart).copied().collect();
        return table::print_json(&all);
    }
    let mut out = std::io::stdout().lock();
    if !whole.is_empty() {
        writeln!(out, "{}", offers_table(&whole))?;
        if total_whole > whole.len() {
            writeln!(
                out,
                "{} of {} instances; --limit 0 shows all",
                whole.len(),
                total_whole
            )?;
        }
    }
    if !apart.is_empty() {
        writeln!(
            out,
            "\nGCP accelerators priced apart from their VM, not ranked with the machines above: \
             add the VM's price (e.g. a2-highgpu-1g's VM part for an A100:1)"
        )?;
        writeln!(out, "{}", offers_table(&apart))?;
        if total_apart > apart.len() {
            writeln!(
                out,
                "{} of {} accelerator rows; --limit 0 shows all",
                apart.len(),
                total_apart
            )?;
        }
    }
    writeln!(out, "\nprices from:")?;
    for line in catalog.builtin_sources() {
        writeln!(out, "  {line}")?;
    }
    Ok(())
}

fn offers_table(offers: &[&InstanceOffer]) -> table::Tab {
    let mut t = table::new(&[
        "provider",
        "instance",
        "region",
        "accelerator",
        "count>",
        "on-demand $/h>",
        "spot $/h>",
        "spot saves>",
        "$/accel-h>",
        "note",
    ]);
    for o in offers {
        t.add_row(vec![
            o.provider.clone(),
            o.instance_type.clone(),
            o.region.clone(),
            o.accelerator.clone().unwrap_or_default(),
            format!("{}", o.accelerator_count),
            o.on_demand.0.to_string_places(4),
            o.spot
                .map(|s| s.0.to_string_places(4))
                .unwrap_or_else(|| "-".into()),
            spot_saves(o),
            o.per_accelerator_hour()
                .map(|p| format!("{p:.4}"))
                .unwrap_or_else(|| "-".into()),
            o.note.clone().unwrap_or_default(),
        ]);
    }
    t
}

/// What spot saves against on demand; a spot price at or above on demand says so.
fn spot_saves(o: &InstanceOffer) -> String {
    match o.spot_change() {
        None => "-".into(),
        Some(c) if c > 0.0 => format!("none: +{} above", pct(c)),
        Some(c) if c.abs() < f64::EPSILON => "none: same".into(),
        Some(c) => pct(-c),
    }
}

fn models(catalog: &Catalog, args: &PricesArgs) -> Result<()> {
    let has = |hay: Option<&str>, needle: &Option<String>| {
        needle
            .as_ref()
            .is_none_or(|n| hay.is_some_and(|h| h.to_lowercase().contains(&n.to_lowercase())))
    };
    let mut models: Vec<_> = catalog
        .models()
        .filter(|m| has(m.provider.as_deref(), &args.provider))
        .filter(|m| has(Some(&m.name), &args.name))
        .collect();
    if let Some(name) = &args.name {
        // The name asked for before its variants (`gpt-4o-mini` before `azure/eu/gpt-4o-mini`).
        let name = name.to_lowercase();
        models.sort_by_key(|m| (m.name.to_lowercase() != name, m.name.len()));
    }
    let total = models.len();
    if args.limit > 0 {
        models.truncate(args.limit);
    }
    if args.json {
        return table::print_json(&models);
    }
    let mut out = std::io::stdout().lock();
    if models.is_empty() {
        writeln!(
            out,
            "no model prices match: add [[model]] entries to a price file (--prices FILE)"
        )?;
        return Ok(());
    }
    let rate = |r: Option<TokenRate>| r.map(|r| usd_per_1m(r.0)).unwrap_or_default();
    let mut t = table::new(&[
        "model",
        "provider",
        "$/1M input>",
        "$/1M cached input>",
        "$/1M cache write>",
        "$/1M output>",
        "$/1M reasoning>",
    ]);
    for m in &models {
        t.add_row(vec![
            m.name.clone(),
            m.provider.clone().unwrap_or_default(),
            usd_per_1m(m.input.0),
            rate(m.cached_input),
            rate(m.cache_write),
            usd_per_1m(m.output.0),
            rate(m.reasoning),
        ]);
    }
    writeln!(out, "{t}")?;
    if total > models.len() {
        writeln!(
            out,
            "{} of {} models; --limit 0 shows all, --name PART finds one",
            models.len(),
            total
        )?;
    }
    if let Some(t) = catalog.model_table() {
        writeln!(
            out,
            "hosted models' prices: {}{}, taken {}; a price file's [[model]] overrides them, \
             `frugal prices refresh --models FILE.json` takes a newer table",
            t.table,
            t.package
                .as_deref()
                .map_or(String::new(), |p| format!(" from {p}")),
            t.taken
        )?;
    }
    Ok(())
}

/// Trims a newer LiteLLM table and writes it where [`refreshed`] finds it.
fn refresh(config: &Config, args: &PricesRefreshArgs) -> Result<()> {
    let Some(dest) = refreshed(config) else {
        bail!("no data folder to keep the table in: set HOME or XDG_DATA_HOME");
    };
    let text = std::fs::read_to_string(&args.models)
        .with_context(|| format!("cannot read {}", args.models.display()))?;
    let source = TableSource {
        table: args.models.file_name().map_or_else(
            || args.models.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ),
        package: None,
        taken: chrono::Utc::now().format("%Y-%m-%d").to_string(),
    };
    let trimmed = hosted::trim(&text, &source).with_context(|| {
        format!(
            "{} is not LiteLLM's table of model prices",
            args.models.display()
        )
    })?;
    let table = hosted::parse(
        &trimmed,
        frugal_cost::catalog::PriceSource::ModelTable(dest.clone()),
    )?;
    if let Some(dir) = dest.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // Written beside and renamed, so a reader never sees half a table.
    let partial = dest.with_extension("json.partial");
    std::fs::write(&partial, trimmed)
        .and_then(|()| std::fs::rename(&partial, &dest))
        .with_context(|| format!("cannot write {}", dest.display()))?;
    writeln!(
        std::io::stdout(),
        "{} models' prices from {}, taken {}, in {}: they replace the built-in table",
        table.models.len(),
        source.table,
        source.taken,
        dest.display()
    )?;
    Ok(())
}
