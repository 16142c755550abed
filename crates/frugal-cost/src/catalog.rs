//! The price catalog: hourly prices of instances by capacity type, and per-token prices of
//! API models.
//!
//! The built-in catalog is the SkyPilot catalog rows shipped in `data/gpu-prices/` (see its
//! PROVENANCE.md), embedded at build time and parsed on first use. Users extend or override
//! it with TOML files: an entry with the same provider, instance type and region replaces
//! the built-in one.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::event::Capacity;
use crate::money::{HourlyRate, Money, TokenRate};

const AWS_CSV: &str = include_str!("../../../data/gpu-prices/aws_v9_us-east-1_gpu_rows.csv");
const AZURE_CSV: &str = include_str!("../../../data/gpu-prices/azure_v6_vms_gpu_rows.csv");
const GCP_CSV: &str = include_str!("../../../data/gpu-prices/gcp_v9_vms_gpu_accelerator_rows.csv");

/// The region used when an instance type is sold in several and the usage names none.
const DEFAULT_REGIONS: &[(&str, &str)] = &[
    ("aws", "us-east-1"),
    ("gcp", "us-central1"),
    ("azure", "eastus"),
];

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("built-in price data {file} row {row}: {message}")]
    Builtin {
        file: &'static str,
        row: usize,
        message: String,
    },
    #[error("cannot read price file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("price file {path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("unknown instance type `{name}`{}", suggest(.suggestions))]
    UnknownInstance {
        name: String,
        suggestions: Vec<String>,
    },
    #[error("instance type `{name}` is not priced in region `{region}` (priced in: {})", .known.join(", "))]
    UnknownRegion {
        name: String,
        region: String,
        known: Vec<String>,
    },
    #[error("instance type `{name}` is priced in several regions ({}); name one", .known.join(", "))]
    AmbiguousRegion { name: String, known: Vec<String> },
    #[error("model `{name}` has no per-token price in the catalog{}", suggest(.suggestions))]
    UnknownModel {
        name: String,
        suggestions: Vec<String>,
    },
}

fn suggest(names: &[String]) -> String {
    if names.is_empty() {
        String::new()
    } else {
        format!("; did you mean {}?", names.join(", "))
    }
}

/// Where a price came from, so a report can say which figures are the user's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PriceSource {
    /// SkyPilot catalog rows shipped with frugal.
    Builtin,
    /// A user's price file.
    File(PathBuf),
}

/// One instance type in one region, with its hourly price per capacity type.
#[derive(Debug, Clone, Serialize)]
pub struct InstanceOffer {
    pub provider: String,
    pub instance_type: String,
    pub region: String,
    pub accelerator: Option<String>,
    /// Accelerators per instance; fractional for shared GPUs (AWS g6f).
    pub accelerator_count: f64,
    pub vcpus: Option<f64>,
    pub memory_gib: Option<f64>,
    pub on_demand: HourlyRate,
    /// Median spot price over the region's zones.
    pub spot: Option<HourlyRate>,
    /// Cheapest zone's spot price.
    pub spot_min: Option<HourlyRate>,
    pub reserved_1y: Option<HourlyRate>,
    pub reserved_3y: Option<HourlyRate>,
    /// Zones the prices were gathered over.
    pub zones: u32,
    /// What the price does not include (GCP prices accelerators apart from the VM).
    pub note: Option<String>,
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
        let od = self.on_demand.0.as_f64();
        self.spot
            .filter(|_| od > 0.0)
            .map(|s| (1.0 - s.0.as_f64() / od).max(0.0))
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
}

#[derive(Debug, Clone, Default)]
pub struct Catalog {
    instances: Vec<InstanceOffer>,
    /// instance type (lowercase) -> indices into `instances`.
    by_type: HashMap<String, Vec<usize>>,
    models: BTreeMap<String, ModelPrice>,
}

impl Catalog {
    /// The built-in catalog.
    pub fn builtin() -> Result<Catalog, CatalogError> {
        let mut offers = Vec::new();
        offers.extend(parse_skypilot(Cloud::Aws, AWS_CSV)?);
        offers.extend(parse_skypilot(Cloud::Azure, AZURE_CSV)?);
        offers.extend(parse_skypilot(Cloud::Gcp, GCP_CSV)?);
        let mut catalog = Catalog::default();
        for offer in offers {
            catalog.upsert(offer);
        }
        Ok(catalog)
    }

    /// The built-in catalog with each file layered on top, in order.
    pub fn load(files: &[PathBuf]) -> Result<Catalog, CatalogError> {
        let mut catalog = Catalog::builtin()?;
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
            PriceSource::File(p) => p.clone(),
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
        // reserved price of its own, built-in ones included.
        for offer in &mut self.instances {
            let od = offer.on_demand.0;
            let at = |d: Option<f64>| d.map(|d| HourlyRate(od.scale(1.0 - d)));
            offer.reserved_1y = offer.reserved_1y.or(at(file.reserved_1y_discount));
            offer.reserved_3y = offer.reserved_3y.or(at(file.reserved_3y_discount));
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

    /// The cheapest instance on demand with at least `vcpus` vCPUs and `memory_gib` GiB of
    /// memory, in the region `instance(type, None)` picks for its type (so one provider's
    /// cheapest far region does not win); offers that do not say their size are left out.
    /// Ties go to the first name in order.
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
                (a.on_demand, &a.provider, &a.instance_type).cmp(&(
                    b.on_demand,
                    &b.provider,
                    &b.instance_type,
                ))
            })
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
            InstanceOffer {
                provider: cloud.name().to_owned(),
                instance_type: name,
                region,
                accelerator: Some(row.accelerator_name.clone()).filter(|a| !a.is_empty()),
                accelerator_count: opt(&row.accelerator_count).unwrap_or(0.0),
                vcpus: opt(&row.vcpus),
                memory_gib: opt(&row.memory_gib),
                on_demand: HourlyRate(on_demand),
                spot: spots.get(spots.len() / 2).copied().map(HourlyRate),
                spot_min: spots.first().copied().map(HourlyRate),
                reserved_1y: None,
                reserved_3y: None,
                zones,
                note: matches!(cloud, Cloud::Gcp)
                    .then(|| "accelerator only; the VM is priced apart".to_owned()),
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
/// on_demand = 1.006             # $ per hour
/// spot = 0.4
///
/// [[model]]
/// name = "gpt-4o-mini"
/// input = 0.15                  # $ per million tokens
/// output = 0.60
/// cached_input = 0.075
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
            out.push(InstanceOffer {
                provider: e.provider.to_lowercase(),
                instance_type: e.instance_type.clone(),
                region: e.region.clone(),
                accelerator: e.accelerator.clone(),
                accelerator_count: e.accelerator_count.unwrap_or(0.0),
                vcpus: e.vcpus,
                memory_gib: e.memory_gib,
                on_demand: HourlyRate(on_demand),
                spot,
                spot_min: spot,
                reserved_1y: reserved(
                    opt(&e.reserved_1y, "reserved_1y")?,
                    e.reserved_1y_discount,
                    "reserved_1y_discount",
                    default_1y,
                )?,
                reserved_3y: reserved(
                    opt(&e.reserved_3y, "reserved_3y")?,
                    e.reserved_3y_discount,
                    "reserved_3y_discount",
                    default_3y,
                )?,
                zones: 1,
                note: e.note.clone(),
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
                    source: source.clone(),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
