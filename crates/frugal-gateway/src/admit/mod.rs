//! Admission: API keys and their tenants ([`keys`]), whose budgets count by UTC day and
//! month ([`account`]) and may be shared by every replica through Redis ([`budget`]).

pub mod account;
pub mod budget;
pub mod keys;
