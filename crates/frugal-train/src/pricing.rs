//! What a training run costs: the hourly rate of its capacity (given, or from the catalog),
//! what the same hours would cost on demand, each segment as a ledger event, and the run's
//! totals.

use std::time::{Duration, UNIX_EPOCH};

use frugal_cost::catalog::CatalogError;
use frugal_cost::event::{Capacity, Event, Kind, Outcome};
use frugal_cost::money::HourlyRate;
use frugal_cost::{Catalog, Money};

use crate::supervisor::Segment;
use crate::watchdog::Peak;

#[derive(Debug, thiserror::Error)]
pub enum PricingError {
    #[error("a price cannot be negative")]
    NegativePrice,
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
}

/// How the run's machine is to be priced, as the user gave it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub capacity: Capacity,
    /// The machine's own price per hour, over the catalog's.
    pub price_per_hour: Option<Money>,
    /// A catalog instance type: its price, and (for spot with a given price) its on-demand one.
    pub instance: Option<&'a str>,
    pub region: Option<&'a str>,
}

/// What the run's capacity costs an hour, and what it would cost on demand.
#[derive(Debug, Clone, PartialEq)]
pub struct Pricing {
    pub capacity: Capacity,
    pub rate: HourlyRate,
    /// `None` when unknown (a given spot price with no instance type to compare with).
    pub on_demand: Option<HourlyRate>,
    pub instance_type: Option<String>,
    pub region: Option<String>,
}

/// A run's totals over its segments.
#[derive(Debug, Clone, PartialEq)]
pub struct RunCost {
    pub cost: Money,
    /// What the same hours cost on demand; `None` when any segment's is unknown.
    pub on_demand: Option<Money>,
    pub lost: Duration,
    pub preemptions: usize,
}

impl Pricing {
    /// Prices the run: a given price wins (its on-demand equivalent is itself on demand, else
    /// the instance's catalog price when one is named); else the instance's catalog price for
    /// the capacity; with neither, $0 an hour.
    pub fn new(catalog: &Catalog, req: &Request<'_>) -> Result<Pricing, PricingError> {
        let capacity = req.capacity;
        if let Some(price) = req.price_per_hour {
            if price.is_negative() {
                return Err(PricingError::NegativePrice);
            }
            let on_demand = match (req.instance, capacity) {
                (_, Capacity::OnDemand) => Some(HourlyRate(price)),
                (Some(i), _) => Some(catalog.instance(i, req.region)?.on_demand),
                (None, _) => None,
            };
            return Ok(Pricing {
                capacity,
                rate: HourlyRate(price),
                on_demand,
                instance_type: req.instance.map(str::to_owned),
                region: req.region.map(str::to_owned),
            });
        }
        let Some(instance) = req.instance else {
            return Ok(Pricing {
                capacity,
                rate: HourlyRate(Money::ZERO),
                on_demand: None,
                instance_type: None,
                region: req.region.map(str::to_owned),
            });
        };
        let offer = catalog.instance(instance, req.region)?;
        let rate = offer.price(capacity).ok_or_else(|| PricingError::NoPrice {
            capacity,
            instance_type: offer.instance_type.clone(),
            region: offer.region.clone(),
        })?;
        Ok(Pricing {
            capacity,
            rate,
            on_demand: Some(offer.on_demand),
            instance_type: Some(offer.instance_type.clone()),
            region: Some(offer.region.clone()),
        })
    }

    /// What the run's model FLOPs are measured against: `given_tflops` (the whole
    /// machine's, `--peak-tflops`) when given, and the catalog's accelerators of the
    /// instance type, whose faster precisions the watchdog points out.
    pub fn peak(&self, catalog: &Catalog, given_tflops: Option<f64>) -> Peak {
        let accelerators = self
            .instance_type
            .as_deref()
            .and_then(|i| catalog.instance(i, self.region.as_deref()).ok())
            .and_then(|offer| {
                let peaks = catalog.peaks(offer.accelerator.as_deref()?)?;
                Some((peaks.clone(), offer.accelerator_count))
            })
            .filter(|(_, count)| *count > 0.0);
        Peak {
            accelerators,
            given_tflops,
        }
    }

    /// The segment as the ledger's training event of run `run_id`.
    pub fn event(&self, run_id: &str, s: &Segment) -> Event {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let duration_ms = ms(s.duration());
        let ts_ms = ms(s.started.duration_since(UNIX_EPOCH).unwrap_or_default());
        let cost = self.rate.cost(duration_ms, 1).unwrap_or(Money::ZERO);
        let mut e = Event::new(ts_ms, Kind::Training, run_id, cost);
        e.duration_ms = duration_ms;
        e.run_id = Some(run_id.to_owned());
        e.instance_type.clone_from(&self.instance_type);
        e.region.clone_from(&self.region);
        e.capacity = Some(self.capacity);
        e.list_cost = self.on_demand.and_then(|r| r.cost(duration_ms, 1));
        e.outcome = Some(s.outcome);
        e.lost_ms = ms(s.lost);
        e.utilization = s.utilization;
        e.mfu = s.mfu;
        e.precision = s.precision;
        e.data_stall = s.data_stall;
        e.sync_stall = s.sync_stall;
        e
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

    /// The run's totals over `segments`.
    pub fn run_cost(&self, run_id: &str, segments: &[Segment]) -> RunCost {
        let mut total = RunCost {
            cost: Money::ZERO,
            on_demand: Some(Money::ZERO),
            lost: Duration::ZERO,
            preemptions: 0,
        };
        for s in segments {
            let e = self.event(run_id, s);
            total.cost += e.cost;
            total.on_demand = total.on_demand.zip(e.list_cost).map(|(a, b)| a + b);
            total.lost += s.lost;
            total.preemptions += usize::from(s.outcome == Outcome::Preempted);
        }
        total
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn m(s: &str) -> Money {
        s.parse().unwrap()
    }

    fn req(
        capacity: Capacity,
        price: Option<&str>,
        instance: Option<&'static str>,
    ) -> Request<'static> {
        Request {
            capacity,
            price_per_hour: price.map(m),
            instance,
            region: None,
        }
    }

    fn segment(minutes: u64, outcome: Outcome, lost_s: u64) -> Segment {
        let started = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        Segment {
            attempt: 1,
            started,
            ended: started + Duration::from_secs(minutes * 60),
            outcome,
            cause: "exit 0".into(),
            resumed_from: None,
            last_checkpoint: None,
            first_step: None,
            last_step: None,
            lost: Duration::from_secs(lost_s),
            utilization: Some(0.5),
            diagnoses: Vec::new(),
            mfu: Some(0.031),
            precision: Some(frugal_cost::Precision::Fp32),
            data_stall: Some(0.4),
            sync_stall: None,
        }
    }

    #[test]
    fn a_given_price_wins_and_is_its_own_on_demand() {
        let c = Catalog::builtin().unwrap();
        let p = Pricing::new(&c, &req(Capacity::OnDemand, Some("2"), Some("g5.xlarge"))).unwrap();
        assert_eq!(p.rate, HourlyRate(m("2")));
        assert_eq!(p.on_demand, Some(HourlyRate(m("2"))));
        assert_eq!(p.instance_type.as_deref(), Some("g5.xlarge"));
    }

    #[test]
    fn a_given_spot_price_compares_with_the_instances_on_demand() {
        let c = Catalog::builtin().unwrap();
        let g5 = c.instance("g5.xlarge", None).unwrap().on_demand;
        let p = Pricing::new(&c, &req(Capacity::Spot, Some("0.5"), Some("g5.xlarge"))).unwrap();
        assert_eq!((p.rate, p.on_demand), (HourlyRate(m("0.5")), Some(g5)));
        let p = Pricing::new(&c, &req(Capacity::Spot, Some("0.5"), None)).unwrap();
        assert_eq!(p.on_demand, None, "nothing to compare with");
    }

    #[test]
    fn the_catalog_prices_an_instance_for_its_capacity() {
        let c = Catalog::builtin().unwrap();
        let offer = c.instance("g5.xlarge", None).unwrap();
        let p = Pricing::new(&c, &req(Capacity::Spot, None, Some("g5.xlarge"))).unwrap();
        assert_eq!(p.rate, offer.spot.unwrap());
        assert_eq!(p.on_demand, Some(offer.on_demand));
        assert_eq!(p.region.as_deref(), Some(offer.region.as_str()));
        let p = Pricing::new(&c, &req(Capacity::OnDemand, None, Some("g5.xlarge"))).unwrap();
        assert_eq!(p.rate, offer.on_demand);
    }

    #[test]
    fn nothing_given_is_free() {
        let c = Catalog::builtin().unwrap();
        let p = Pricing::new(&c, &req(Capacity::Spot, None, None)).unwrap();
        assert_eq!((p.rate, p.on_demand), (HourlyRate(Money::ZERO), None));
    }

    #[test]
    fn bad_requests_are_errors() {
        let c = Catalog::builtin().unwrap();
        let err = Pricing::new(&c, &req(Capacity::OnDemand, Some("-1"), None)).unwrap_err();
        assert!(matches!(err, PricingError::NegativePrice), "{err}");
        let err = Pricing::new(&c, &req(Capacity::OnDemand, None, Some("g5.nope"))).unwrap_err();
        assert!(err.to_string().contains("g5.nope"), "{err}");
        // A reserved price the built-in catalog does not have.
        let err = Pricing::new(&c, &req(Capacity::Reserved3y, None, Some("g5.xlarge")));
        let msg = err.unwrap_err().to_string();
        assert!(msg.contains("no reserved"), "{msg}");
        assert!(msg.contains("give --price-per-hour"), "{msg}");
    }

    #[test]
    fn the_peak_is_the_instances_accelerators_or_the_given_one() {
        let c = Catalog::builtin().unwrap();
        let p = Pricing::new(&c, &req(Capacity::OnDemand, None, Some("p4d.24xlarge"))).unwrap();
        let peak = p.peak(&c, None);
        let (a100, count) = peak.accelerators.clone().unwrap();
        assert_eq!((a100.accelerator.as_str(), count), ("A100", 8.0));
        assert_eq!(
            peak.flops_per_s(Some(frugal_cost::Precision::Bf16)),
            Some(8.0 * 312e12)
        );
        let given = p.peak(&c, Some(100.0));
        assert_eq!(given.flops_per_s(None), Some(100e12));
        // A CPU-only price: no accelerator, only what is given.
        let cpu = Pricing::new(&c, &req(Capacity::OnDemand, Some("0.5"), None)).unwrap();
        assert_eq!(cpu.peak(&c, None), Peak::default());
    }

    #[test]
    fn segments_become_events_and_totals() {
        let p = Pricing {
            capacity: Capacity::Spot,
            rate: HourlyRate(m("1.20")),
            on_demand: Some(HourlyRate(m("3.00"))),
            instance_type: Some("g5.xlarge".into()),
            region: Some("us-east-1".into()),
        };
        let a = segment(30, Outcome::Preempted, 90);
        let e = p.event("r1", &a);
        assert_eq!(e.cost, m("0.60"));
        assert_eq!(e.list_cost, Some(m("1.50")));
        assert_eq!(e.duration_ms, 1_800_000);
        assert_eq!(e.lost_ms, 90_000);
        assert_eq!(e.run_id.as_deref(), Some("r1"));
        assert_eq!(e.capacity, Some(Capacity::Spot));
        assert_eq!(e.outcome, Some(Outcome::Preempted));
        assert_eq!(e.utilization, Some(0.5));
        assert_eq!(e.mfu, Some(0.031));
        assert_eq!(e.precision, Some(frugal_cost::Precision::Fp32));
        assert_eq!((e.data_stall, e.sync_stall), (Some(0.4), None));
        assert_eq!(e.instance_type.as_deref(), Some("g5.xlarge"));

        let total = p.run_cost("r1", &[a, segment(60, Outcome::Completed, 0)]);
        assert_eq!(
            total,
            RunCost {
                cost: m("1.80"),
                on_demand: Some(m("4.50")),
                lost: Duration::from_secs(90),
                preemptions: 1,
            }
        );
        let unknown = Pricing {
            on_demand: None,
            ..p
        };
        let total = unknown.run_cost("r1", &[segment(1, Outcome::Completed, 0)]);
        assert_eq!(total.on_demand, None);
    }
}
