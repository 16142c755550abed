//! frugal-cost: what a unit of ML work costs.
//!
//! Money and units (`money`), the price catalog (`catalog`), usage events (`event`), the
//! append-only SQLite ledger (`ledger`), importers for CSV, JSONL and FOCUS billing
//! exports (`import`), the unit-cost report (`report`, rendered by `html`), with how
//! figures read and charts draw wherever they are shown (`present`), and capacity planning
//! from demand and spot traces (`plan`), and URLs that carry secrets, as shown without them
//! (`secret_url`: the ledger's, and the gateway's Redis), and the semantic cache's wrong-hit
//! rate estimated from the hits served (`wrong`). It knows nothing of HTTP or models.

pub mod catalog;
pub mod causes;
pub mod durable;
pub mod event;
pub mod html;
pub mod import;
pub mod ledger;
pub mod money;
pub mod plan;
pub mod present;
pub mod report;
pub mod rollup;
pub mod secret_url;
pub mod wrong;

// The testkit's ledger row builders, compiled into this crate's unit tests so that they
// build its own types (a testkit depending on this crate would bring a second copy).
#[cfg(test)]
extern crate self as frugal_cost;
#[cfg(test)]
#[allow(dead_code)]
#[path = "../../frugal-testkit/src/events.rs"]
mod test_events;

/// The fuzz targets (`fuzz_*`) cap what a parser may allocate; other tests are unaffected.
#[cfg(test)]
#[global_allocator]
static ALLOC: frugal_testkit::fuzz::Capped = frugal_testkit::fuzz::Capped;

pub use catalog::Catalog;
pub use event::{
    Agreement, Capacity, Event, Kind, Lever, Outcome, Precision, ReplicaSpan, ReplicaState, Shadow,
    Verdict,
};
pub use ledger::{Ledger, Location, Window};
pub use money::Money;

/// Progress of long work, in bytes or items; the binary draws it, libraries only report.
pub trait Progress {
    fn start(&self, _total: u64) {}
    fn advance(&self, _delta: u64) {}
    fn finish(&self) {}
}

/// Progress that nobody watches.
pub struct NoProgress;

impl Progress for NoProgress {}
