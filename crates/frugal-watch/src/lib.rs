//! The core of `frugal watch`: scrape bodies in, ledger events out.
//!
//! Users already run serving engines that export Prometheus metrics. This crate reads a
//! `/metrics` body ([`expo`]), tells which engine wrote it and reads its counters into one
//! shape ([`reading`]), differences two readings into the work between them and bills
//! that interval's capacity as inference and idle events ([`interval`]). [`watch`] keeps
//! each target's last snapshot in a state file and fetches bodies; the schedule and the
//! config belong to the binary.

pub mod causes;
pub mod expo;
pub mod interval;
pub mod prom_api;
pub mod reading;
pub mod watch;

pub use expo::{ParseError, Scrape, parse};
pub use interval::{Bill, Gap, Interval, Overflow, Snapshot, TargetMeta, bill};
pub use reading::{Kind, Reading, detect};

#[cfg(test)]
mod recorded;
