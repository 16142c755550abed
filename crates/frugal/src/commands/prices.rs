//! `frugal prices`: the catalog's instance offers, or its model prices.

use std::io::Write;

use anyhow::{Result, bail};
use frugal_cost::Catalog;
use frugal_cost::catalog::{OfferQuery, OfferSort};
use frugal_cost::present::pct;

use crate::cli::{PriceSort, PricesArgs};
use crate::table;

pub fn run(catalog: &Catalog, args: &PricesArgs) -> Result<()> {
    if args.models {
        let models: Vec<_> = catalog.models().collect();
        if args.json {
            return table::print_json(&models);
        }
        if models.is_empty() {
            writeln!(
                std::io::stdout(),
                "no model prices: add [[model]] entries to a price file (--prices FILE)"
            )?;
            return Ok(());
        }
        let mut t = table::new(&[
            "model",
            "provider",
            "$/1M input>",
            "$/1M cached input>",
            "$/1M output>",
        ]);
        for m in models {
            t.add_row(vec![
                m.name.clone(),
                m.provider.clone().unwrap_or_default(),
                m.input.0.to_string(),
                m.cached_input.map(|c| c.0.to_string()).unwrap_or_default(),
                m.output.0.to_string(),
            ]);
        }
        writeln!(std::io::stdout(), "{t}")?;
        return Ok(());
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
    let mut offers = catalog.search(&query);
    if offers.is_empty() {
        bail!("no instance in the catalog matches these filters");
    }
    let total = offers.len();
    if args.limit > 0 {
        offers.truncate(args.limit);
    }
    if args.json {
        return table::print_json(&offers);
    }
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
    for o in &offers {
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
            o.spot_saving().map(pct).unwrap_or_else(|| "-".into()),
            o.per_accelerator_hour()
                .map(|p| format!("{p:.4}"))
                .unwrap_or_else(|| "-".into()),
            o.note.clone().unwrap_or_default(),
        ]);
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{t}")?;
    if total > offers.len() {
        writeln!(
            out,
            "{} of {} offers; --limit 0 shows all",
            offers.len(),
            total
        )?;
    }
    Ok(())
}
