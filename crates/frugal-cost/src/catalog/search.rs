//! Finding instance offers in the catalog: filters by provider, accelerator, instance type,
//! region and price, and one order by the price that matters to the caller.

use super::{Catalog, InstanceOffer};

/// The price offers are ordered by, cheapest (or, for `Saving`, largest) first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OfferSort {
    /// On-demand price per accelerator-hour.
    #[default]
    PerGpu,
    /// On-demand price per instance-hour.
    OnDemand,
    /// Spot price per instance-hour.
    Spot,
    /// Largest spot saving first.
    Saving,
}

/// Which offers `Catalog::search` keeps; `None` keeps all.
#[derive(Debug, Clone, Default)]
pub struct OfferQuery {
    /// The provider, case aside.
    pub provider: Option<String>,
    /// Part of the accelerator's name, case aside.
    pub gpu: Option<String>,
    /// Part of the instance type, case aside.
    pub instance: Option<String>,
    /// The region, case aside.
    pub region: Option<String>,
    /// Dollars per instance-hour at most: the spot price when sorting by it, else on demand.
    pub max_price: Option<f64>,
    pub sort: OfferSort,
}

impl Catalog {
    /// The instance offers that `query` keeps, in its order (ties by instance type).
    pub fn search(&self, query: &OfferQuery) -> Vec<&InstanceOffer> {
        let contains = |hay: &str, needle: &Option<String>| {
            needle
                .as_ref()
                .is_none_or(|n| hay.to_lowercase().contains(&n.to_lowercase()))
        };
        let same = |value: &str, wanted: &Option<String>| {
            wanted
                .as_ref()
                .is_none_or(|w| value.eq_ignore_ascii_case(w))
        };
        let mut offers: Vec<&InstanceOffer> = self
            .instances()
            .iter()
            .filter(|o| same(&o.provider, &query.provider))
            .filter(|o| contains(o.accelerator.as_deref().unwrap_or(""), &query.gpu))
            .filter(|o| contains(&o.instance_type, &query.instance))
            .filter(|o| same(&o.region, &query.region))
            .filter(|o| {
                query.max_price.is_none_or(|max| {
                    let price = if query.sort == OfferSort::Spot {
                        o.spot
                    } else {
                        Some(o.on_demand)
                    };
                    price.is_some_and(|p| p.0.as_f64() <= max)
                })
            })
            .collect();
        let key = |o: &InstanceOffer| -> f64 {
            match query.sort {
                OfferSort::PerGpu => o.per_accelerator_hour().unwrap_or(f64::MAX),
                OfferSort::OnDemand => o.on_demand.0.as_f64(),
                OfferSort::Spot => o.spot.map_or(f64::MAX, |s| s.0.as_f64()),
                // The deepest cut first; spot above on demand after every saving.
                OfferSort::Saving => o.spot_change().unwrap_or(f64::MAX),
            }
        };
        offers.sort_by(|a, b| {
            key(a)
                .total_cmp(&key(b))
                .then_with(|| a.instance_type.cmp(&b.instance_type))
        });
        offers
    }

    /// [`Catalog::search`] with whole machines apart from accelerators priced without their
    /// VM (GCP's `A100:1`), so that the two are never ranked against each other.
    pub fn search_apart(&self, query: &OfferQuery) -> (Vec<&InstanceOffer>, Vec<&InstanceOffer>) {
        self.search(query)
            .into_iter()
            .partition(|o| !o.accelerator_only())
    }
}
