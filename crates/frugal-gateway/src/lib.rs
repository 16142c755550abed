//! frugal-gateway: the OpenAI-compatible HTTP API over frugal's engine and upstreams.
//!
//! `POST /v1/chat/completions` and `POST /v1/completions` (both with SSE streaming and the
//! final usage chunk), `POST /v1/embeddings` ([`request::embed`]), `GET /v1/models`,
//! `/health` and Prometheus `/metrics`, and OpenAI's Files and Batches API ([`batch::api`]),
//! whose lines take the way requests take.
//!
//! Folders by concern, each layer using only those below it:
//! - [`http`]: the router and handlers, OpenAI's shapes, validation, errors, rendering;
//! - [`cascade`]: routes from the cheapest model to the dearest, run and replayed offline;
//! - [`request`]: the gateway's state and the path of one request (pipeline, bill);
//! - [`batch`]: the Batch API's files, jobs and their runner, and a job on spot capacity;
//! - [`admit`]: API keys, tenants and their budgets (shared through Redis);
//! - [`cache`]: the exact, shared (Redis) and semantic caches, in that lookup order;
//! - [`pool`]: pools of replicas that scale with demand; [`backend`]: the local engine and
//!   upstreams; [`meter`]: the usage ledger's writer;
//! - [`config`] `[serve]` as written, checked entry by entry ([`assemble`]) and built into
//!   a gateway ([`gateway`]); [`deploy`]: the same config as Kubernetes manifests.
//!
//! One request: [`http::router`] admits it (key, budgets) and validates it into a
//! [`http::validate::Job`]; [`request::state`] resolves its model to a [`backend::Backend`]
//! or a cascade route; [`request::pipeline`] consults the caches, produces on a miss and
//! carries a [`request::settle::Bill`] that, on every exit (success, error, a client gone
//! mid-stream, a timeout, a panic), writes the ledger row, charges the tenant and fills the
//! caches; [`http::render`] answers with what it cost.

/// Data files compiled in, by their path in the repository, so that the defaults and docs
/// that name them work from any folder (the binary installs them into its data folder when
/// the path is not there): the cascade questions (`frugal eval-route`, `frugal eval tasks`)
/// and the replayed workload (`frugal bench --workload`).
pub const BUNDLED: &[(&str, &[u8])] = &[
    (
        "data/cascade/questions.jsonl",
        include_bytes!("../../../data/cascade/questions.jsonl"),
    ),
    (
        "data/cascade/public-questions.jsonl",
        include_bytes!("../../../data/cascade/public-questions.jsonl"),
    ),
    (
        "data/workload/qqp-replay.jsonl",
        include_bytes!("../../../data/workload/qqp-replay.jsonl"),
    ),
];

pub mod admit;
pub mod assemble;
pub mod backend;
pub mod batch;
pub mod cache;
pub mod cascade;
pub mod config;
pub mod deploy;
pub mod gateway;
pub mod http;
pub mod jsonl;
pub mod loadgen;
pub mod meter;
pub mod metrics;
pub mod pool;
pub mod redis_conn;
pub mod request;
pub mod server;

#[cfg(test)]
mod tests;

/// The fuzz targets (`fuzz_*`) cap what a parser may allocate; other tests are unaffected.
#[cfg(test)]
#[global_allocator]
static ALLOC: frugal_testkit::fuzz::Capped = frugal_testkit::fuzz::Capped;

pub use backend::Local;
pub use http::router::{router, serve, serve_metrics};
pub use request::state::{AppState, Parts};
