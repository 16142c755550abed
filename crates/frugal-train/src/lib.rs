//! Spot-safe training: `frugal train -- CMD` supervises any training command through
//! preemptions and crashes, keeps its checkpoints in an object store, and says why the
//! accelerator idles. The command's side of it is a small contract (docs/training.md).

pub mod contract;
pub mod machine;
pub mod notice;
pub mod orphan;
pub mod pricing;
pub mod store;
pub mod supervisor;
pub mod tune;
pub mod watchdog;
