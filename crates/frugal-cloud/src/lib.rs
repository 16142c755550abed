//! The cloud and this machine: what a command learns from where it runs, for every command
//! alike (`frugal train`, `tune`, `batch run`, `serve`).
//!
//! * [`notice`]: preemption notices from AWS, GCP and Azure metadata services, and which
//!   cloud answers; [`watch`]: one watcher that polls them on its own task.
//! * [`machine`]: this machine's identity (its instance type from the metadata, its size);
//!   [`price`]: one resolution of a machine's price per hour (a given price, a named
//!   instance, or this machine), through the frugal-cost catalog.
//! * [`store`]: checkpoint directories kept in an object store (local, S3, GCS, Azure),
//!   complete only once their manifest is written.

pub mod machine;
pub mod notice;
pub mod price;
pub mod store;
pub mod watch;
