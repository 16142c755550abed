//! The caches a request consults before any model runs, in this order: the exact cache in
//! this process ([`exact`]), the exact cache shared by replicas in Redis ([`shared`]), then
//! the semantic cache ([`semantic`]), which answers a question asked in other words. The
//! order is kept by the request pipeline ([`crate::request::pipeline`]); a completed
//! answer fills all three when it settles.

pub mod exact;
pub mod semantic;
pub mod shared;
