//! Pools of replicas that grow with demand and shrink to zero (`[[serve.pool]]`).

pub mod kube;
pub mod settings;

pub use settings::{Kind, PoolConfig};
