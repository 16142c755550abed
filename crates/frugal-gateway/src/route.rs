//! Cascade routing: answer with the cheapest model whose answer is confident enough.
//!
//! A route lists models from cheapest to dearest. Each tier's answer is accepted when its
//! confidence clears the route's threshold, else the request goes to the next tier; the last
//! tier's answer is always accepted. Confidence is a low quantile of the answer's per-token
//! logprobs: one unsure token (a wrong digit, a wrong name) is what marks a wrong short
//! answer, and a quantile does not drift with answer length as the sequence mean does.

/// A route: `name` is what clients put in `model`.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    pub name: String,
    /// Model names, cheapest first.
    pub tiers: Vec<String>,
    /// Which quantile of the token logprobs is the confidence (0: the least likely token).
    pub quantile: f64,
    /// Accept a tier's answer at or above this confidence (a logprob, <= 0).
    pub threshold: f32,
}

/// The `quantile` (0..=1, nearest rank) of `logprobs`; an empty answer has confidence 0
/// (certain), as there is nothing to doubt.
pub fn confidence(logprobs: &[f32], quantile: f64) -> f32 {
    if logprobs.is_empty() {
        return 0.0;
    }
    let mut sorted = logprobs.to_vec();
    sorted.sort_by(f32::total_cmp);
    let q = quantile.clamp(0.0, 1.0);
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[at]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confidence_is_a_quantile_of_the_token_logprobs() {
        let lp = [-0.01, -2.5, -0.2, -0.05, -0.9];
        assert_eq!(confidence(&lp, 0.0), -2.5);
        assert_eq!(confidence(&lp, 0.25), -0.9);
        assert_eq!(confidence(&lp, 0.5), -0.2);
        assert_eq!(confidence(&lp, 1.0), -0.01);
        assert_eq!(confidence(&lp, 7.0), -0.01, "clamped");
        assert_eq!(confidence(&[], 0.0), 0.0);
    }

    #[test]
    fn length_does_not_move_the_minimum_as_it_moves_the_mean() {
        // The same one doubtful token, in a short and a long answer of sure tokens.
        let short = [-0.01, -1.5];
        let long: Vec<f32> = std::iter::repeat_n(-0.01, 30).chain([-1.5]).collect();
        assert_eq!(confidence(&short, 0.0), confidence(&long, 0.0));
        let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
        assert!(mean(&short) < 5.0 * mean(&long));
    }
}
