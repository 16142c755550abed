//! Batch jobs in OpenAI's Batch API format: the input file read and validated whole before
//! anything runs ([`input`]), and each job's durable progress, which writes every line's
//! result to the output exactly once through crashes and restarts ([`store`]).

pub mod input;
pub mod store;
