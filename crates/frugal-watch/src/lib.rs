//! The core of `frugal watch`: scrape bodies in, ledger events out.
//!
//! Users already run serving engines that export Prometheus metrics. This crate reads a
//! `/metrics` body ([`expo`]), tells which engine wrote it and reads its counters into one
//! shape ([`reading`]), differences two readings into the work between them and bills
//! that interval's capacity as inference and idle events ([`interval`]). [`watch`] keeps
//! each target's last snapshot in a state file and fetches bodies (bounded: [`body`]); [`fleet`] reads
//! `[watch]` into priced targets and turns one pass's answers into ledger rows and a line
//! per server. The schedule and the printing belong to the binary.

pub mod body;
pub mod expo;
pub mod fleet;
pub mod interval;
pub mod prom_api;
pub mod reading;
pub mod watch;

pub use expo::{ParseError, Scrape, parse};
pub use interval::{Bill, Gap, Interval, Overflow, Snapshot, TargetMeta, bill};
pub use reading::{Kind, Reading, detect};

#[cfg(test)]
mod recorded;
