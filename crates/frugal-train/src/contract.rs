//! The environment a supervised command finds (docs/training.md).

/// The run's id, the same on every segment and machine.
pub const RUN_ID: &str = "FRUGAL_RUN_ID";
/// 1 for the first segment on this machine, counting up with each restart.
pub const ATTEMPT: &str = "FRUGAL_ATTEMPT";
/// Where the command publishes checkpoints (`<dir>/<step>`, renamed into place).
pub const CHECKPOINT_DIR: &str = "FRUGAL_CHECKPOINT_DIR";
/// A complete checkpoint to resume from; unset on a fresh start.
pub const RESUME_FROM: &str = "FRUGAL_RESUME_FROM";
/// The JSON Lines file the command appends its step metrics to.
pub const METRICS: &str = "FRUGAL_METRICS";
/// The signal that asks for a checkpoint now.
pub const CHECKPOINT_SIGNAL: &str = "FRUGAL_CHECKPOINT_SIGNAL";
