//! The hyperparameters: everything that changes the numbers a run computes.

use serde::Serialize;

/// Everything that changes the numbers a run computes (and so must match on resume).
/// The thread count and `--steps` are deliberately absent: neither changes any step.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct HParams {
    pub vocab: usize,
    pub context: usize,
    pub embed: usize,
    pub hidden: usize,
    pub batch: usize,
    pub seed: u64,
    pub lr: f32,
    /// FNV-1a 64 of the data file: resuming on different data is a mismatch too.
    pub data_hash: u64,
}

impl HParams {
    pub fn input(&self) -> usize {
        self.context * self.embed
    }

    pub fn n_params(&self) -> usize {
        self.vocab * self.embed
            + self.input() * self.hidden
            + self.hidden
            + self.hidden * self.vocab
            + self.vocab
    }

    /// Model FLOPs of one training step, forward and backward, at 2 FLOPs a multiply-add,
    /// counted from the two weight matrices (B batch, C context, E embed, H hidden, V vocab):
    ///
    /// * forward: `2·B·C·E·H` (hidden pre-activations, W1) + `2·B·H·V` (logits, W2);
    /// * backward: twice the forward, as each matrix takes two products of its size, one for
    ///   the weight gradient (`e ⊗ dh`, `h ⊗ dlogits`) and one for the input gradient
    ///   (`W1·dh`, `W2·dlogits`);
    ///
    /// so `6·B·(C·E·H + H·V)`. Left out, all O(B·(H + V)) or O(params), under 1% at the
    /// default shapes: the embedding gather and scatter (copies and adds), the bias adds,
    /// tanh and its derivative, the softmax and loss, the sum of the chunk gradients and
    /// the Adam update.
    pub fn step_flops(&self) -> u64 {
        let (b, c, e, h, v) = (
            self.batch,
            self.context,
            self.embed,
            self.hidden,
            self.vocab,
        );
        let forward = 2 * b as u64 * (c * e * h + h * v) as u64;
        3 * forward
    }
}
