//! Batch jobs in OpenAI's Batch API format: the input file read and validated whole before
//! anything runs ([`input`]), and each job's durable progress, which writes every line's
//! result to the output exactly once through crashes and restarts ([`store`]), and the
//! runner that sends the pending lines through a gateway with retries ([`run`]).

pub mod input;
pub mod run;
pub mod store;

use std::sync::Arc;

use crate::keys::Tenant;

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
