//! Dense peak TFLOPS of the catalog's accelerators per precision, for model FLOPs
//! utilization and the precision lever: `data/accelerators/peak-tflops.csv` (see its
//! PROVENANCE.md), embedded at build time.

use serde::{Deserialize, Serialize};

use super::error::CatalogError;
use crate::event::Precision;

const PEAK_CSV: &str = include_str!("../../../../data/accelerators/peak-tflops.csv");
const PEAK_FILE: &str = "peak-tflops.csv";

/// What autocast may move a run to: the precisions that keep FP32 master weights.
const AUTOCAST: [Precision; 2] = [Precision::Bf16, Precision::Fp16];

/// One accelerator's dense peak TFLOPS at each precision it has a fast path for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AcceleratorPeaks {
    /// As the price rows name it ("A100").
    pub accelerator: String,
    pub fp32: Option<f64>,
    pub tf32: Option<f64>,
    pub bf16: Option<f64>,
    pub fp16: Option<f64>,
    pub fp8: Option<f64>,
    /// The datasheet printed sparse tensor figures only, and they were halved.
    pub sparse_halved: bool,
    /// The vendor datasheet the figures come from.
    pub source: String,
    pub note: Option<String>,
}

/// A faster precision than a run's, on the same accelerator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faster {
    pub from: Precision,
    pub from_tflops: f64,
    pub to: Precision,
    pub to_tflops: f64,
}

impl Faster {
    /// How many times the peak rises.
    pub fn ratio(&self) -> f64 {
        self.to_tflops / self.from_tflops
    }
}

impl AcceleratorPeaks {
    /// Peak TFLOPS of one accelerator at `precision`.
    pub fn tflops(&self, precision: Precision) -> Option<f64> {
        match precision {
            Precision::Fp32 => self.fp32,
            Precision::Tf32 => self.tf32,
            Precision::Bf16 => self.bf16,
            Precision::Fp16 => self.fp16,
            Precision::Fp8 => self.fp8,
        }
    }

    /// For a run in FP32 or TF32: the precision autocast would give it, BF16 where the
    /// accelerator has it (no loss scaling), else FP16, when its peak is higher.
    pub fn faster_than(&self, precision: Precision) -> Option<Faster> {
        if !matches!(precision, Precision::Fp32 | Precision::Tf32) {
            return None;
        }
        let from_tflops = self.tflops(precision)?;
        AUTOCAST.iter().find_map(|&to| {
            let to_tflops = self.tflops(to)?;
            (to_tflops > from_tflops).then_some(Faster {
                from: precision,
                from_tflops,
                to,
                to_tflops,
            })
        })
    }
}

#[derive(Deserialize)]
struct PeakRow {
    accelerator: String,
    fp32: Option<f64>,
    tf32: Option<f64>,
    bf16: Option<f64>,
    fp16: Option<f64>,
    fp8: Option<f64>,
    sparse_halved: String,
    source: String,
    note: String,
}

/// The embedded table.
pub(super) fn builtin() -> Result<Vec<AcceleratorPeaks>, CatalogError> {
    let mut reader = csv::Reader::from_reader(PEAK_CSV.as_bytes());
    let mut out = Vec::new();
    for (i, row) in reader.deserialize::<PeakRow>().enumerate() {
        let err = |message: String| CatalogError::Builtin {
            file: PEAK_FILE,
            row: i + 2,
            message,
        };
        let row = row.map_err(|e| err(e.to_string()))?;
        let figures = [row.fp32, row.tf32, row.bf16, row.fp16, row.fp8];
        if figures
            .iter()
            .flatten()
            .any(|t| !(t.is_finite() && *t > 0.0))
        {
            return Err(err("a peak must be a positive number of TFLOPS".into()));
        }
        if !row.source.starts_with("https://") {
            return Err(err("every row names its source datasheet".into()));
        }
        out.push(AcceleratorPeaks {
            accelerator: row.accelerator,
            fp32: row.fp32,
            tf32: row.tf32,
            bf16: row.bf16,
            fp16: row.fp16,
            fp8: row.fp8,
            sparse_halved: row.sparse_halved == "yes",
            source: row.source,
            note: Some(row.note).filter(|n| !n.is_empty()),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::Catalog;

    #[test]
    fn the_catalogs_accelerators_have_their_datasheet_peaks() {
        let c = Catalog::builtin().unwrap();
        let a100 = c.peaks("a100").unwrap();
        assert_eq!(a100.accelerator, "A100");
        assert_eq!(
            [a100.fp32, a100.tf32, a100.bf16, a100.fp16, a100.fp8],
            [Some(19.5), Some(156.0), Some(312.0), Some(312.0), None]
        );
        assert!(a100.source.contains("a100-datasheet"), "{}", a100.source);
        // The H100 datasheet prints sparse tensor figures: 1,979 BF16 is 989.5 dense.
        let h100 = c.peaks("H100").unwrap();
        assert_eq!(h100.tflops(Precision::Bf16), Some(989.5));
        assert!(h100.sparse_halved);
        assert!(c.peaks("Trainium").is_none());
        // Every NVIDIA GPU an instance of the price rows carries, bar the few left out.
        let left_out = ["B200", "RTXPRO6000", "P4", "M60"];
        for offer in c.instances() {
            let Some(a) = offer.accelerator.as_deref() else {
                continue;
            };
            let nvidia = super::super::gpu_memory_gib(a).is_some();
            if nvidia && !left_out.contains(&a) {
                assert!(c.peaks(a).is_some(), "{a} of {}", offer.instance_type);
            }
        }
    }

    #[test]
    fn autocast_goes_to_bf16_where_there_is_one_else_fp16() {
        let c = Catalog::builtin().unwrap();
        let a100 = c
            .peaks("A100")
            .unwrap()
            .faster_than(Precision::Fp32)
            .unwrap();
        assert_eq!((a100.to, a100.ratio()), (Precision::Bf16, 16.0));
        let tf32 = c
            .peaks("A100")
            .unwrap()
            .faster_than(Precision::Tf32)
            .unwrap();
        assert_eq!(tf32.ratio(), 2.0);
        let v100 = c
            .peaks("V100")
            .unwrap()
            .faster_than(Precision::Fp32)
            .unwrap();
        assert_eq!((v100.to, v100.to_tflops), (Precision::Fp16, 125.0));
        // Already fast, or nothing faster to go to.
        assert_eq!(c.peaks("A100").unwrap().faster_than(Precision::Bf16), None);
        assert_eq!(c.peaks("K80").unwrap().faster_than(Precision::Fp32), None);
        // A precision the accelerator has no figure for: nothing to compare with.
        assert_eq!(c.peaks("V100").unwrap().faster_than(Precision::Tf32), None);
    }
}
