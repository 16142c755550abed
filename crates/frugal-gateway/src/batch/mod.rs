//! Batch jobs in OpenAI's Batch API format: the input file read and validated whole before
//! anything runs ([`input`]), and each job's durable progress, which writes every line's
//! result to the output exactly once through crashes and restarts ([`store`]), and the
//! runner that sends the pending lines through a gateway with retries ([`run`]).

pub mod input;
pub mod run;
pub mod store;
