//! The core of `frugal tune`: a search space read from TOML ([`space`]), asynchronous
//! successive halving over trials ([`asha`]) and the tuner's durable state ([`state`]).
//! [`run`] runs the trials under the supervisor.

pub mod asha;
pub mod replay;
pub mod run;
pub mod space;
pub mod state;

pub use asha::{Asha, AshaConfig, AshaError, Job, Mode, TrialId};
pub use space::{Limit, Param, Params, Space, SpaceError, Value, param_env, render_args};
pub use state::{StateError, TrialRecord, TrialStatus, TuneState};
