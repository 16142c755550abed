//! What a quantized embedder keeps of the exact one: its embeddings' cosine to the exact
//! ones, and how well each ranks the labelled pairs (ROC AUC).

use rayon::prelude::*;

use super::pairs::{EvalError, Pair};
use crate::embed::{Embedder, cosine};

/// The area under the ROC curve of `scores` for `labels`: the chance that a random duplicate
/// pair scores above a random other pair (ties count half), by the rank-sum formula.
pub fn roc_auc(scores: &[f32], labels: &[bool]) -> f64 {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let (mut rank_sum, mut i) = (0.0f64, 0);
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && scores[order[j + 1]] == scores[order[i]] {
            j += 1;
        }
        // Tied scores share the mean of their ranks (1-based).
        let mean_rank = (i + j) as f64 / 2.0 + 1.0;
        rank_sum += order[i..=j].iter().filter(|&&k| labels[k]).count() as f64 * mean_rank;
        i = j + 1;
    }
    let pos = labels.iter().filter(|&&l| l).count() as f64;
    let neg = labels.len() as f64 - pos;
    if pos == 0.0 || neg == 0.0 {
        return f64::NAN;
    }
    (rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg)
}

/// What a quantized embedder keeps of the exact (F32) one.
#[derive(Debug, Clone)]
pub struct QuantKept {
    pub texts: usize,
    /// Cosine of each text's quantized embedding to its exact one: mean, 1st percentile, least.
    pub cosine_mean: f64,
    pub cosine_p1: f64,
    pub cosine_min: f64,
    /// ROC AUC of the pairs' cosine for their labels, with each embedder.
    pub auc_exact: f64,
    pub auc_quant: f64,
    /// Mean milliseconds per embedding, on one thread each.
    pub ms_exact: f64,
    pub ms_quant: f64,
}

/// Embeds both texts of every pair with both embedders (in parallel over pairs) and compares.
pub fn quant_kept(
    exact: &Embedder,
    quant: &Embedder,
    pairs: &[Pair],
    tick: &(dyn Fn() + Sync),
) -> Result<QuantKept, EvalError> {
    type Timed = (Vec<f32>, f64);
    let embed = |e: &Embedder, text: &str| -> Result<Timed, EvalError> {
        let t = std::time::Instant::now();
        let v = e.embed(text)?;
        Ok((v, t.elapsed().as_secs_f64() * 1e3))
    };
    // Per pair: (cosine of a and of b to exact, pair cosine exact, pair cosine quant, ms).
    let rows: Vec<([f32; 2], f32, f32, f64, f64)> = pairs
        .par_iter()
        .map(|p| {
            let (ea, ta) = embed(exact, &p.text_a)?;
            let (eb, tb) = embed(exact, &p.text_b)?;
            let (qa, ua) = embed(quant, &p.text_a)?;
            let (qb, ub) = embed(quant, &p.text_b)?;
            tick();
            Ok((
                [cosine(&qa, &ea), cosine(&qb, &eb)],
                cosine(&ea, &eb),
                cosine(&qa, &qb),
                ta + tb,
                ua + ub,
            ))
        })
        .collect::<Result<_, EvalError>>()?;
    let mut kept: Vec<f64> = rows.iter().flat_map(|r| r.0.map(f64::from)).collect();
    kept.sort_by(f64::total_cmp);
    let labels: Vec<bool> = pairs.iter().map(|p| p.label).collect();
    let n = kept.len().max(1) as f64;
    let exact_scores: Vec<f32> = rows.iter().map(|r| r.1).collect();
    let quant_scores: Vec<f32> = rows.iter().map(|r| r.2).collect();
    Ok(QuantKept {
        texts: kept.len(),
        cosine_mean: kept.iter().sum::<f64>() / n,
        cosine_p1: kept.get(kept.len() / 100).copied().unwrap_or(f64::NAN),
        cosine_min: kept.first().copied().unwrap_or(f64::NAN),
        auc_exact: roc_auc(&exact_scores, &labels),
        auc_quant: roc_auc(&quant_scores, &labels),
        ms_exact: rows.iter().map(|r| r.3).sum::<f64>() / n,
        ms_quant: rows.iter().map(|r| r.4).sum::<f64>() / n,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn roc_auc_by_hand() {
        // Perfect, reversed, and with a tie across the classes (counted half).
        assert_eq!(
            roc_auc(&[0.1, 0.2, 0.8, 0.9], &[false, false, true, true]),
            1.0
        );
        assert_eq!(
            roc_auc(&[0.9, 0.8, 0.2, 0.1], &[false, false, true, true]),
            0.0
        );
        assert_eq!(roc_auc(&[0.5, 0.5], &[false, true]), 0.5);
        // 2 positives x 2 negatives: (0.3 > 0.2) (0.3 < 0.4) (0.9 > both) = 3 of 4.
        assert_eq!(
            roc_auc(&[0.2, 0.3, 0.4, 0.9], &[false, true, false, true]),
            0.75
        );
        assert!(roc_auc(&[0.1], &[true]).is_nan());
    }
}
