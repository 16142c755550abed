//! Spot-safe training: `frugal train -- CMD` supervises any training command through
//! preemptions and crashes, keeps its checkpoints in an object store, and says why the
//! accelerator idles. The command's side of it is a small contract (docs/training.md).
//! The cloud's side (preemption notices, the checkpoint store, the machine's price) is
//! frugal-cloud's.

pub mod contract;
pub mod cost;
pub mod names;
pub mod orphan;
pub mod supervisor;
pub mod tune;
pub mod watchdog;
