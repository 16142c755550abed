//! What a machine costs an hour, resolved one way for every command (`train`, `tune`,
//! `batch run`, `serve`, `watch`, the gateway's upstreams and pools): a price given (a
//! config's `price_per_hour`, `--price-per-hour`) wins; else a named instance's catalog price
//! for the capacity; else this machine's ([`ThisMachine`]), from its instance type in the
//! cloud's metadata ([`crate::machine`]) or the nearest catalog CPU instance as big as it;
//! else $0. Always with how it was found ([`Resolved::said`], one line each command prints
//! at start), so a price is never a silent guess.

use std::time::Duration;

use frugal_cost::catalog::{CatalogError, InstanceOffer};
use frugal_cost::event::Capacity;
use frugal_cost::money::{HourlyRate, ParseMoneyError};
use frugal_cost::{Catalog, Money};

use crate::machine::{Detected, Size, instance_type};
use crate::notice::{Bases, DETECT_TIMEOUT};

/// A machine's price that cannot be had. A price's errors name where it was written.
#[derive(Debug, thiserror::Error)]
pub enum PriceError {
    #[error("{field}: {error}")]
    Parse {
        field: &'static str,
        error: ParseMoneyError,
    },
    #[error("{field}: a price cannot be negative")]
    Negative { field: &'static str },
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(
        "the catalog has no {capacity} price for {instance_type} in {region}: give --price-per-hour"
    )]
    NoPrice {
        capacity: Capacity,
        instance_type: String,
        region: String,
    },
    #[error("cannot start the runtime that asks the cloud's metadata")]
    Runtime(#[source] std::io::Error),
}

/// A price per hour as written (USD), called `field` where it was written
/// (`price_per_hour`, `--price-per-hour`): never negative.
pub fn parse_price(field: &'static str, text: &str) -> Result<Money, PriceError> {
    let price: Money = text
        .parse()
        .map_err(|error| PriceError::Parse { field, error })?;
    if price.is_negative() {
        return Err(PriceError::Negative { field });
    }
    Ok(price)
}

/// How a machine is to be priced, as the user gave it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub capacity: Capacity,
    /// The machine's own price per hour as written (USD), over the catalog's.
    pub price_per_hour: Option<&'a str>,
    /// What that price is called where it was written, for its errors.
    pub price_field: &'static str,
    /// A catalog instance type: its price, and (for spot with a given price) its on-demand one.
    pub instance: Option<&'a str>,
    pub region: Option<&'a str>,
}

impl<'a> Request<'a> {
    /// A machine on demand priced by a `price_per_hour` or an `instance` of a config entry.
    pub fn on_demand(price_per_hour: Option<&'a str>, instance: Option<&'a str>) -> Request<'a> {
        Request {
            capacity: Capacity::OnDemand,
            price_per_hour,
            price_field: "price_per_hour",
            instance,
            region: None,
        }
    }
}

/// What a machine's capacity costs an hour, and what it would cost on demand.
#[derive(Debug, Clone, PartialEq)]
pub struct Pricing {
    pub capacity: Capacity,
    pub rate: HourlyRate,
    /// `None` when unknown (a given spot price with no instance type to compare with).
    pub on_demand: Option<HourlyRate>,
    pub instance_type: Option<String>,
    pub region: Option<String>,
}

/// How [`resolve`] found a price.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// From a given price or a named instance.
    Given,
    /// From this machine: why this price (e.g. "aws g5.xlarge from the instance metadata").
    ThisMachine { reason: String },
    /// Nothing said what the machine costs: $0 an hour.
    Nothing,
}

/// A machine's pricing, and how it was found.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub pricing: Pricing,
    pub found: Found,
    /// One line saying it: "priced as aws r5.xlarge $0.252/h (catalog as of 2026-09-06, on
    /// demand; no cloud metadata: ...)".
    pub said: String,
}

/// What to price when nothing is given.
#[derive(Debug, Clone, Copy)]
pub enum ThisMachine<'a> {
    /// Nothing runs here to price (a gateway of upstreams only): $0 an hour.
    Nothing,
    /// This machine by its size alone, asking no cloud (`--notice none`).
    BySize,
    /// This machine, its instance type asked of these metadata services first.
    Ask(&'a Bases),
}

/// "aws r5.xlarge": an instance's provider (when the catalog has it) and type.
fn named(catalog: &Catalog, instance_type: &str, region: Option<&str>) -> (String, Option<String>) {
    match catalog.instance(instance_type, region) {
        Ok(o) => (
            format!("{} {}", o.provider, o.instance_type),
            o.as_of.clone(),
        ),
        Err(_) => (instance_type.to_owned(), None),
    }
}

/// The line [`Resolved::said`] holds.
fn say(catalog: &Catalog, pricing: &Pricing, found: &Found, given_price: bool) -> String {
    let rate = per_hour(pricing.rate);
    let capacity = pricing.capacity.to_string().replace('_', " ");
    let (what, as_of) = match &pricing.instance_type {
        Some(t) => named(catalog, t, pricing.region.as_deref()),
        None => ("this machine".to_owned(), None),
    };
    let basis = match (given_price, as_of) {
        (true, _) => "as given".to_owned(),
        (false, Some(d)) => format!("catalog as of {d}"),
        (false, None) => "catalog".to_owned(),
    };
    match found {
        Found::Given => format!("priced as {what} {rate}/h ({basis}, {capacity})"),
        Found::ThisMachine { reason } => {
            format!(
                "priced as {what} {rate}/h ({basis}, {capacity}; {reason}); --price-per-hour or --instance overrides it"
            )
        }
        Found::Nothing => format!(
            "priced at $0/h: nothing runs here to price ({capacity}); --price-per-hour or --instance prices it"
        ),
    }
}

impl Pricing {
    /// The price `req` gives: a given price wins (its on-demand equivalent is itself on
    /// demand, else the instance's catalog price when one is named); else the instance's
    /// catalog price for the capacity; `None` when it gives neither.
    pub fn given(catalog: &Catalog, req: &Request<'_>) -> Result<Option<Pricing>, PriceError> {
        let capacity = req.capacity;
        if let Some(text) = req.price_per_hour {
            let price = parse_price(req.price_field, text)?;
            let on_demand = match (req.instance, capacity) {
                (_, Capacity::OnDemand) => Some(HourlyRate(price)),
                (Some(i), _) => Some(catalog.instance(i, req.region)?.on_demand),
                (None, _) => None,
            };
            return Ok(Some(Pricing {
                capacity,
                rate: HourlyRate(price),
                on_demand,
                instance_type: req.instance.map(str::to_owned),
                region: req.region.map(str::to_owned),
            }));
        }
        let Some(instance) = req.instance else {
            return Ok(None);
        };
        let offer = catalog.instance(instance, req.region)?;
        let rate = offer.price(capacity).ok_or_else(|| PriceError::NoPrice {
            capacity,
            instance_type: offer.instance_type.clone(),
            region: offer.region.clone(),
        })?;
        Ok(Some(Pricing {
            capacity,
            rate,
            on_demand: Some(offer.on_demand),
            instance_type: Some(offer.instance_type.clone()),
            region: Some(offer.region.clone()),
        }))
    }

    /// What the same hours cost on demand where that is not the rate (spot): what a saving
    /// is counted against.
    pub fn on_demand_apart(&self) -> Option<HourlyRate> {
        self.on_demand.filter(|od| *od != self.rate)
    }

    /// One of `slots` equal shares of the machine (a tuner's slot): each pays its part.
    pub fn share(&self, slots: u32) -> Pricing {
        let part =
            |r: HourlyRate| HourlyRate(r.0.mul_div(1, i128::from(slots.max(1))).unwrap_or(r.0));
        Pricing {
            rate: part(self.rate),
            on_demand: self.on_demand.map(part),
            ..self.clone()
        }
    }
}

/// The machine's pricing: what `req` gives ([`Pricing::given`]); else, with `this_machine`
/// (the metadata services to ask), this machine's on-demand price ([`this_machine_rate`]),
/// which blocks for at most [`DETECT_TIMEOUT`] and so is called outside an async runtime;
/// else $0 an hour.
pub fn resolve(
    catalog: &Catalog,
    req: &Request<'_>,
    this_machine: ThisMachine<'_>,
) -> Result<Resolved, PriceError> {
    if let Some(pricing) = Pricing::given(catalog, req)? {
        let said = say(
            catalog,
            &pricing,
            &Found::Given,
            req.price_per_hour.is_some(),
        );
        return Ok(Resolved {
            pricing,
            found: Found::Given,
            said,
        });
    }
    let found = match this_machine {
        ThisMachine::Nothing => {
            let pricing = Pricing {
                capacity: req.capacity,
                rate: HourlyRate(Money::ZERO),
                on_demand: None,
                instance_type: None,
                region: req.region.map(str::to_owned),
            };
            let said = say(catalog, &pricing, &Found::Nothing, false);
            return Ok(Resolved {
                pricing,
                found: Found::Nothing,
                said,
            });
        }
        ThisMachine::BySize => {
            let mut found = rate_for(catalog, None, Size::this_machine());
            found.reason = found
                .reason
                .replacen("no cloud metadata", "no cloud asked", 1);
            found
        }
        ThisMachine::Ask(bases) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(PriceError::Runtime)?;
            let found = runtime.block_on(this_machine_rate(catalog, bases, DETECT_TIMEOUT));
            // A name lookup of a metadata host may still be running: don't wait for it.
            runtime.shutdown_background();
            found
        }
    };
    // Spot where the catalog has this machine's spot price; else on demand, said so.
    let spot = found
        .offer
        .as_ref()
        .and_then(|o| o.price(req.capacity))
        .filter(|_| req.capacity == Capacity::Spot);
    let pricing = Pricing {
        capacity: if spot.is_some() {
            Capacity::Spot
        } else {
            Capacity::OnDemand
        },
        rate: spot.unwrap_or(found.rate),
        on_demand: Some(found.rate),
        instance_type: found.instance_type,
        region: found.offer.map(|o| o.region),
    };
    let found = Found::ThisMachine {
        reason: found.reason,
    };
    let said = say(catalog, &pricing, &found, false);
    Ok(Resolved {
        pricing,
        found,
        said,
    })
}

/// This machine's hourly price on demand, its instance type when known, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineRate {
    pub rate: HourlyRate,
    pub instance_type: Option<String>,
    /// E.g. "aws g5.xlarge from the instance metadata".
    pub reason: String,
    /// The catalog's offer it was priced as (its other capacities' prices), if any.
    pub offer: Option<InstanceOffer>,
}

/// Prices this machine: the catalog's on-demand price of the instance type the metadata
/// services name (asked within `timeout`), else of the cheapest catalog instance at least
/// as big as this machine.
pub async fn this_machine_rate(catalog: &Catalog, bases: &Bases, timeout: Duration) -> MachineRate {
    let detected = instance_type(bases, timeout).await;
    rate_for(catalog, detected.as_ref(), Size::this_machine())
}

/// The price of a machine the metadata called `detected` (`None`: no metadata answered),
/// `size` big.
pub fn rate_for(catalog: &Catalog, detected: Option<&Detected>, size: Size) -> MachineRate {
    let mut why = match detected {
        Some(d) => match catalog.instance(&d.instance_type, None) {
            Ok(offer) => {
                return MachineRate {
                    rate: offer.on_demand,
                    instance_type: Some(offer.instance_type.clone()),
                    reason: format!(
                        "{} {} from the instance metadata",
                        d.cloud, offer.instance_type
                    ),
                    offer: Some(offer.clone()),
                };
            }
            Err(e) => format!(
                "{} {} from the instance metadata is not priced in the catalog ({e})",
                d.cloud, d.instance_type
            ),
        },
        None => "no cloud metadata".to_string(),
    };
    let ask = format!(">= {} vCPUs and {} GiB", size.vcpus, size.memory_gib);
    match catalog.cheapest_with(f64::from(size.vcpus), f64::from(size.memory_gib)) {
        Some(offer) => {
            let kind = if offer.accelerator.is_some() {
                "instance"
            } else {
                "CPU instance"
            };
            why.push_str(&format!(
                ": the cheapest catalog {kind} with {ask}, {} {} at {}/h",
                offer.provider,
                offer.instance_type,
                per_hour(offer.on_demand)
            ));
            MachineRate {
                rate: offer.on_demand,
                instance_type: Some(offer.instance_type.clone()),
                reason: why,
                offer: Some(offer.clone()),
            }
        }
        None => {
            why.push_str(&format!(", and no catalog instance has {ask}: $0/h"));
            MachineRate {
                rate: HourlyRate(Money::ZERO),
                instance_type: None,
                reason: why,
                offer: None,
            }
        }
    }
}

/// An hourly price to a tenth of a cent: "$1.204".
pub fn per_hour(rate: HourlyRate) -> String {
    format!("${}", rate.0.to_string_places(3))
}

#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[cfg(test)]
mod tests {
    use super::*;

    use crate::machine::tests::mock;
    use crate::notice::Cloud;
    use frugal_testkit::loopback::closed_port;

    fn m(s: &str) -> Money {
        s.parse().unwrap()
    }

    fn req(
        capacity: Capacity,
        price: Option<&'static str>,
        instance: Option<&'static str>,
    ) -> Request<'static> {
        Request {
            capacity,
            price_per_hour: price,
            price_field: "--price-per-hour",
            instance,
            region: None,
        }
    }

    fn priced(c: &Catalog, r: &Request<'_>) -> Pricing {
        Pricing::given(c, r).unwrap().unwrap()
    }

    #[test]
    fn a_given_price_wins_and_is_its_own_on_demand() {
        let c = Catalog::builtin().unwrap();
        let p = priced(&c, &req(Capacity::OnDemand, Some("2"), Some("g5.xlarge")));
        assert_eq!(p.rate, HourlyRate(m("2")));
        assert_eq!(p.on_demand, Some(HourlyRate(m("2"))));
        assert_eq!(p.on_demand_apart(), None);
        assert_eq!(p.instance_type.as_deref(), Some("g5.xlarge"));
    }

    #[test]
    fn a_given_spot_price_compares_with_the_instances_on_demand() {
        let c = Catalog::builtin().unwrap();
        let g5 = c.instance("g5.xlarge", None).unwrap().on_demand;
        let p = priced(&c, &req(Capacity::Spot, Some("0.5"), Some("g5.xlarge")));
        assert_eq!((p.rate, p.on_demand), (HourlyRate(m("0.5")), Some(g5)));
        assert_eq!(p.on_demand_apart(), Some(g5));
        let p = priced(&c, &req(Capacity::Spot, Some("0.5"), None));
        assert_eq!(p.on_demand, None, "nothing to compare with");
    }

    #[test]
    fn the_catalog_prices_an_instance_for_its_capacity() {
        let c = Catalog::builtin().unwrap();
        let offer = c.instance("g5.xlarge", None).unwrap();
        let p = priced(&c, &req(Capacity::Spot, None, Some("g5.xlarge")));
        assert_eq!(p.rate, offer.spot.unwrap());
        assert_eq!(p.on_demand, Some(offer.on_demand));
        assert_eq!(p.region.as_deref(), Some(offer.region.as_str()));
        let p = priced(&c, &req(Capacity::OnDemand, None, Some("g5.xlarge")));
        assert_eq!(p.rate, offer.on_demand);
        let on_demand = Request::on_demand(None, Some("g5.xlarge"));
        assert_eq!(priced(&c, &on_demand), p);
    }

    #[test]
    fn nothing_given_is_free() {
        let c = Catalog::builtin().unwrap();
        assert_eq!(
            Pricing::given(&c, &req(Capacity::Spot, None, None)).unwrap(),
            None
        );
        let r = resolve(&c, &req(Capacity::Spot, None, None), ThisMachine::Nothing).unwrap();
        assert!(
            r.said.starts_with("priced at $0/h: nothing runs here"),
            "{}",
            r.said
        );
        assert_eq!(r.found, Found::Nothing);
        let p = r.pricing;
        assert_eq!((p.rate, p.on_demand), (HourlyRate(Money::ZERO), None));
        assert_eq!(p.capacity, Capacity::Spot);
    }

    #[test]
    fn bad_requests_are_errors() {
        let c = Catalog::builtin().unwrap();
        let err = Pricing::given(&c, &req(Capacity::OnDemand, Some("-1"), None)).unwrap_err();
        assert!(matches!(err, PriceError::Negative { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            "--price-per-hour: a price cannot be negative"
        );
        let err = Pricing::given(&c, &Request::on_demand(Some("two"), None)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "price_per_hour: `two` is not a decimal number"
        );
        let err = Pricing::given(&c, &req(Capacity::OnDemand, None, Some("g5.nope"))).unwrap_err();
        assert!(err.to_string().contains("g5.nope"), "{err}");
        // A reserved price the built-in catalog does not have: an accelerator alone.
        let err = Pricing::given(&c, &req(Capacity::Reserved3y, None, Some("A100:1")));
        let msg = err.unwrap_err().to_string();
        assert!(msg.contains("no reserved"), "{msg}");
        assert!(msg.contains("give --price-per-hour"), "{msg}");
        assert_eq!(parse_price("f", "0").unwrap(), Money::ZERO);
    }

    #[test]
    fn a_share_pays_its_part() {
        let c = Catalog::builtin().unwrap();
        let p = priced(&c, &req(Capacity::Spot, Some("0.8"), Some("g5.xlarge")));
        let quarter = p.share(4);
        assert_eq!(quarter.rate, HourlyRate(m("0.2")));
        assert_eq!(
            quarter.on_demand.unwrap().0,
            p.on_demand.unwrap().0.mul_div(1, 4).unwrap()
        );
        assert_eq!(p.share(0), p, "no slots is one");
    }

    #[tokio::test]
    async fn this_machine_is_priced_from_its_metadata() {
        let catalog = Catalog::builtin().unwrap();
        let closed = closed_port().await;
        let bases = Bases {
            aws: mock(Cloud::Aws, "g5.xlarge").await,
            gcp: closed.clone(),
            azure: closed,
        };
        let got = this_machine_rate(&catalog, &bases, Duration::from_secs(2)).await;
        let g5 = catalog.instance("g5.xlarge", None).unwrap();
        assert_eq!(got.rate, g5.on_demand);
        assert_eq!(got.instance_type.as_deref(), Some("g5.xlarge"));
        assert_eq!(got.reason, "aws g5.xlarge from the instance metadata");
    }

    #[test]
    fn resolving_this_machine_asks_only_when_nothing_is_given() {
        let catalog = Catalog::builtin().unwrap();
        // Nothing listens: a machine off the clouds, priced by its size.
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", listener.local_addr().unwrap())
        };
        let bases = Bases::at(Some(&closed));
        let r = resolve(
            &catalog,
            &Request::on_demand(None, None),
            ThisMachine::Ask(&bases),
        )
        .unwrap();
        let Found::ThisMachine { reason } = &r.found else {
            panic!("{r:?}")
        };
        assert!(reason.starts_with("no cloud metadata"), "{reason}");
        assert_eq!(r.pricing.capacity, Capacity::OnDemand);
        assert_eq!(r.pricing.on_demand_apart(), None);
        let given = Request::on_demand(Some("1.5"), None);
        let r = resolve(&catalog, &given, ThisMachine::Ask(&bases)).unwrap();
        assert_eq!(
            r.said,
            "priced as this machine $1.500/h (as given, on demand)"
        );
        assert_eq!(
            (r.found, r.pricing.rate),
            (Found::Given, HourlyRate(m("1.5")))
        );
    }

    #[test]
    fn without_metadata_the_cheapest_instance_as_big_as_this_one() {
        let catalog = Catalog::builtin().unwrap();
        let size = Size {
            vcpus: 16,
            memory_gib: 64,
        };
        let cheapest = catalog.cheapest_with(16.0, 64.0).unwrap();
        let got = rate_for(&catalog, None, size);
        assert_eq!(got.rate, cheapest.on_demand);
        assert_eq!(
            got.instance_type.as_deref(),
            Some(cheapest.instance_type.as_str())
        );
        assert_eq!(
            got.reason,
            format!(
                "no cloud metadata: the cheapest catalog CPU instance with >= 16 vCPUs and 64 GiB, \
                 {} {} at {}/h",
                cheapest.provider,
                cheapest.instance_type,
                per_hour(cheapest.on_demand)
            )
        );

        // A type the catalog does not price falls back the same way, and says so.
        let odd = Detected {
            cloud: Cloud::Gcp,
            instance_type: "n4-standard-2".into(),
        };
        let got = rate_for(&catalog, Some(&odd), size);
        assert_eq!(got.rate, cheapest.on_demand);
        assert!(
            got.reason
                .starts_with("gcp n4-standard-2 from the instance metadata is not priced"),
            "{}",
            got.reason
        );
        assert!(
            got.reason.contains("the cheapest catalog CPU instance"),
            "{}",
            got.reason
        );

        // Bigger than anything in the catalog: $0, said out loud.
        let huge = Size {
            vcpus: 100_000,
            memory_gib: 1,
        };
        let got = rate_for(&catalog, None, huge);
        assert_eq!(got.rate, HourlyRate(Money::ZERO));
        assert_eq!(
            got.reason,
            "no cloud metadata, and no catalog instance has >= 100000 vCPUs and 1 GiB: $0/h"
        );
        assert_eq!(per_hour(HourlyRate(m("1.204"))), "$1.204");
    }

    /// Issue 32: a CPU host off the clouds was priced as `azure Standard_NV6_Promo`, a
    /// retired GPU instance, because the catalog had only accelerator instances.
    #[test]
    fn a_cpu_host_off_the_clouds_is_priced_as_the_nearest_cpu_instance() {
        let catalog = Catalog::builtin().unwrap();
        let small = Size {
            vcpus: 2,
            memory_gib: 8,
        };
        let got = rate_for(&catalog, None, small);
        let offer = got.offer.unwrap();
        assert!(offer.accelerator.is_none(), "{offer:?}");
        assert_eq!(
            (offer.vcpus, offer.memory_gib),
            (Some(2.0), Some(8.0)),
            "the same size"
        );
        // Of the 2 vCPU / 8 GiB instances, GCP's e2-standard-2 is the cheapest on demand.
        assert_eq!(offer.instance_type, "e2-standard-2");
        assert_eq!(got.rate, HourlyRate(m("0.067")));
        // Between sizes, the next one up: 3 vCPUs and 10 GiB is a 4 vCPU, 16 GiB machine.
        let between = rate_for(
            &catalog,
            None,
            Size {
                vcpus: 3,
                memory_gib: 10,
            },
        );
        let offer = between.offer.unwrap();
        assert_eq!((offer.vcpus, offer.memory_gib), (Some(4.0), Some(16.0)));
        assert!(offer.accelerator.is_none());
    }

    #[test]
    fn the_price_is_said_in_one_line() {
        let c = Catalog::builtin().unwrap();
        let r = resolve(
            &c,
            &Request::on_demand(None, Some("m5.large")),
            ThisMachine::Nothing,
        )
        .unwrap();
        assert_eq!(
            r.said,
            "priced as aws m5.large $0.096/h (catalog as of 2026-09-06, on demand)"
        );
        // By size, asking no cloud: spot where the catalog has its spot price.
        let r = resolve(&c, &req(Capacity::Spot, None, None), ThisMachine::BySize).unwrap();
        assert!(r.pricing.rate.0 > Money::ZERO, "{r:?}");
        assert!(r.said.starts_with("priced as "), "{}", r.said);
        assert!(r.said.contains("no cloud asked"), "{}", r.said);
        assert!(r.said.contains("catalog as of 2026-09-06"), "{}", r.said);
    }
}
