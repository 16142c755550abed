//! Batch jobs in OpenAI's Batch API format: the input file read and validated whole before
//! anything runs ([`input`]), and each job's durable progress, which writes every line's
//! result to the output exactly once through crashes and restarts ([`store`]), and the
//! runner that sends the pending lines through a gateway with retries ([`run`]). On a spot
//! machine ([`spot`]) a notice or a signal stops a job in time and its state travels through
//! an object store to the next machine.
//!
//! `frugal serve` offers them as OpenAI's Files and Batches API ([`api`]): uploads and
//! batches kept in a data directory, each batch driven by a task of its own ([`service`]).

pub mod api;
pub mod error;
pub mod files;
pub mod input;
pub mod run;
pub mod service;
pub mod spot;
pub mod store;
pub mod uploads;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::admit::keys::Tenant;

/// Marks a request as a line of a batch job. Only the batch runner sets it (as a request
/// extension, in process), so no client can bill its requests to a job: the line is billed
/// to the job's tenant, recorded under the workload `batch` with the job as its run, and
/// takes the engine's lower priority.
#[derive(Debug, Clone)]
pub struct BatchLine {
    pub job: Arc<str>,
    /// Whose budget the job spends (the tenant that submitted it); `None`: an open API.
    pub tenant: Option<Arc<Tenant>>,
}

/// An id as OpenAI's look: `prefix` and 96 random bits in hex (the clock's nanoseconds
/// where the OS has no randomness to give).
pub(crate) fn random_id(prefix: &str) -> String {
    let mut bytes = [0u8; 12];
    if getrandom::fill(&mut bytes).is_err() {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes.copy_from_slice(&nanos.to_le_bytes()[..12]);
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{hex}")
}

/// Now, in seconds since the Unix epoch, as OpenAI's objects give times.
pub(crate) fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod fuzz;
