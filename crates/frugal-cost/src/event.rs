//! Usage events: the rows of the ledger.
//!
//! An event is a span of paid work (or paid idleness) with what it cost. Inference events
//! count requests and tokens; training events are segments of a run on one kind of
//! capacity, ending in an outcome; idle events are capacity paid for and not used.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::money::{Millis, Money};

/// What kind of work an event paid for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Inference,
    Training,
    /// Capacity paid for and unused: all of its cost is waste.
    Idle,
    /// Cost that is neither (storage, network, tax) but is on the bill.
    Other,
}

/// How capacity was bought.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capacity {
    OnDemand,
    Spot,
    Reserved1y,
    Reserved3y,
}

/// How a training segment ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Completed,
    Preempted,
    Failed,
    /// Stopped on purpose (checkpoint and exit, early stop).
    Stopped,
    /// Abandoned by its client part-way (a request whose client left mid-answer): what was
    /// produced until then is billed.
    Cancelled,
}

/// The number format a training run computes its matmuls in (`precision` in the metrics
/// contract). Ordered as stored: codes are the ledger's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    Fp32,
    /// FP32 storage with TensorFloat-32 matmuls (Ampere and later).
    Tf32,
    Bf16,
    Fp16,
    Fp8,
}

impl Precision {
    /// How a sentence names it: "FP32".
    pub fn label(self) -> &'static str {
        match self {
            Precision::Fp32 => "FP32",
            Precision::Tf32 => "TF32",
            Precision::Bf16 => "BF16",
            Precision::Fp16 => "FP16",
            Precision::Fp8 => "FP8",
        }
    }
}

/// What saved money on a request, against the call it replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lever {
    /// The exact cache answered: the model's call was not made.
    Cache,
    /// The semantic cache answered.
    SemanticCache,
    /// A cascade's cheaper tier answered: the dearest tier was not called.
    Routing,
    /// The engine served the request in a batch with others: the saving is what its
    /// decode steps would have cost alone.
    Batching,
    /// Prompt tokens whose work was reused: on the engine, the prefill the prefix cache
    /// spared; on an upstream, its cached-input discount.
    PrefixCache,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not a {what} (expected one of: {expected})")]
pub struct ParseEnumError {
    what: &'static str,
    value: String,
    expected: &'static str,
}

macro_rules! text_enum {
    ($ty:ident, $what:literal, $expected:literal, { $($name:literal $(| $alias:literal)* => $variant:ident),+ $(,)? }) => {
        impl $ty {
            pub const ALL: &[$ty] = &[$($ty::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($ty::$variant => $name),+ }
            }

            /// The stable integer stored in the ledger.
            pub fn code(self) -> i64 {
                self as i64
            }

            pub fn from_code(code: i64) -> Option<$ty> {
                Self::ALL.iter().copied().find(|v| v.code() == code)
            }
        }

        impl FromStr for $ty {
            type Err = ParseEnumError;
            fn from_str(s: &str) -> Result<$ty, ParseEnumError> {
                let norm = s.trim().to_ascii_lowercase().replace(['-', ' '], "_");
                match norm.as_str() {
                    $($name $(| $alias)* => Ok($ty::$variant),)+
                    _ => Err(ParseEnumError { what: $what, value: s.to_owned(), expected: $expected }),
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

text_enum!(Kind, "kind", "inference, training, idle, other", {
    "inference" => Inference,
    "training" | "train" => Training,
    "idle" => Idle,
    "other" => Other,
});

text_enum!(Capacity, "capacity type", "on_demand, spot, reserved_1y, reserved_3y", {
    "on_demand" | "ondemand" | "standard" => OnDemand,
    "spot" | "preemptible" | "dynamic" => Spot,
    "reserved_1y" | "reserved" | "committed" => Reserved1y,
    "reserved_3y" => Reserved3y,
});

text_enum!(Outcome, "outcome", "completed, preempted, failed, stopped, cancelled", {
    "completed" | "done" => Completed,
    "preempted" | "interrupted" => Preempted,
    "failed" | "crashed" => Failed,
    "stopped" => Stopped,
    "cancelled" | "canceled" => Cancelled,
});

text_enum!(Precision, "precision", "fp32, tf32, bf16, fp16, fp8", {
    "fp32" | "float32" | "float" => Fp32,
    "tf32" => Tf32,
    "bf16" | "bfloat16" => Bf16,
    "fp16" | "float16" | "half" => Fp16,
    "fp8" | "float8" => Fp8,
});

text_enum!(Agreement, "agreement method", "exact, embedding", {
    "exact" => Exact,
    "embedding" => Embedding,
});

text_enum!(Lever, "lever", "cache, semantic_cache, routing, batching, prefix_cache", {
    "cache" | "exact_cache" => Cache,
    "semantic_cache" | "semantic" => SemanticCache,
    "routing" | "cascade" => Routing,
    "batching" | "continuous_batching" => Batching,
    "prefix_cache" | "prefix" => PrefixCache,
});

/// One row of the ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The writer's id for the event, unique in the ledger: a write retried after a
    /// failure it cannot see through (a lost commit acknowledgement) stores it once.
    /// `None` for writers that never retry; imported rows are keyed by their content hash.
    #[serde(skip)]
    pub id: Option<[u8; 16]>,
    /// Start, milliseconds since the Unix epoch (UTC).
    pub ts_ms: Millis,
    pub duration_ms: Millis,
    pub kind: Kind,
    /// What the money was spent for: a service, a team's job, a training run's name.
    pub workload: String,
    pub model: Option<String>,
    /// Training run id; segments of one run share it.
    pub run_id: Option<String>,
    pub instance_type: Option<String>,
    pub region: Option<String>,
    pub capacity: Option<Capacity>,
    /// Instances (or accelerators, for accelerator-priced capacity) the event ran on.
    pub instances: u32,
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_input_tokens: u64,
    /// Busy share of the paid capacity in [0, 1]; the rest is waste.
    pub utilization: Option<f64>,
    /// The cost basis (amortized, as FOCUS's EffectiveCost).
    pub cost: Money,
    /// The input-token part of `cost`, where the price splits it.
    pub input_cost: Option<Money>,
    /// What the same capacity costs on demand, for savings against it.
    pub list_cost: Option<Money>,
    pub outcome: Option<Outcome>,
    /// Work redone because of this segment's end (time since the last checkpoint).
    pub lost_ms: Millis,
    /// What `lever` saved against the call it replaced (not part of `cost`).
    pub saved: Money,
    pub lever: Option<Lever>,
    /// The API key's tenant that made the request, where keys are in use.
    pub tenant: Option<String>,
    /// How long a pool's activator held the request before a replica took it (a cold
    /// start, or every replica busy); 0 elsewhere.
    pub wait_ms: Millis,
    /// A training segment's model FLOPs utilization: its FLOP/s over the peak of the
    /// accelerators it ran on at its precision, in [0, 1].
    pub mfu: Option<f64>,
    /// The precision a training segment computed in, as its trainer reported it.
    pub precision: Option<Precision>,
    /// Shares of a training segment's step time spent waiting on data and on host syncs.
    pub data_stall: Option<f64>,
    pub sync_stall: Option<f64>,
    /// For a request the semantic cache answered with a hit a paraphrase verifier judged:
    /// the chance the cached answer is wrong for the question asked, `1 - P(same)`, in
    /// [0, 1]. `None` elsewhere. The report estimates the wrong-hit rate from these.
    pub wrong_chance: Option<f64>,
    /// A shadow's row: the reference path run again on an answer a cheap lever served, to
    /// measure the quality it kept. Such rows serve no request and save nothing.
    pub shadow: Option<Shadow>,
}

/// A shadow's row (`Event::shadow`): the reference call's own (its cost, no verdict), or
/// the quality sample that compared its answer with the one served (cost 0, a verdict).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shadow {
    /// The lever whose served answer was checked.
    pub lever: Lever,
    pub verdict: Option<Verdict>,
}

/// Whether a served answer agreed with the reference path's, and how that was judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub agreed: bool,
    pub method: Agreement,
}

/// How two answers are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Agreement {
    /// The same text once case, whitespace and punctuation are set aside.
    Exact,
    /// A proxy: the cosine of the two answers' MiniLM embeddings at or above a threshold.
    Embedding,
}

/// A pool replica's state: starting (a cold start), ready (serving), draining (finishing
/// its requests before it stops).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaState {
    Starting,
    Ready,
    Draining,
}

text_enum!(ReplicaState, "replica state", "starting, ready, draining", {
    "starting" | "cold_start" => Starting,
    "ready" => Ready,
    "draining" => Draining,
});

/// A span of one pool replica's life in one state, at its price. A replica's spans cover
/// its whole life (a long ready state is cut into spans so the ledger stays current); the
/// part no request was billed for is also an `idle` event, so the report counts it as
/// waste. Replica-hours, cold starts and the fixed-pool comparison come from spans.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaSpan {
    /// The writer's id for the span, unique in the ledger, as `Event::id`: the gateway's
    /// meter gives each one, so a retried or replayed commit stores it once.
    #[serde(skip)]
    pub id: Option<[u8; 16]>,
    pub ts_ms: Millis,
    pub duration_ms: Millis,
    pub workload: String,
    /// The pool's served name: its requests' `model`.
    pub pool: String,
    /// The replica's number in its pool (from 1, per gateway start).
    pub replica: u32,
    pub state: ReplicaState,
    /// Of `duration_ms`, the time billed to requests (their processor-sharing shares).
    pub busy_ms: Millis,
    /// The whole span at the replica's price.
    pub cost: Money,
    pub instance_type: Option<String>,
    /// The pool's bounds when the span was written: the fixed pool it is compared with
    /// runs `max_replicas` for as long.
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// Memory a replica needs (weights plus KV cache at its target batch), where known,
    /// for right-sizing its instance.
    pub need_bytes: Option<u64>,
    /// A starting span that ended without a ready replica (crash, timeout).
    pub failed: bool,
    /// The server `frugal watch` measured, by its target's name; `None` for a pool's
    /// replica.
    pub server: Option<String>,
    /// What a watched server served in the span (a pool's requests are in its events only).
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Event {
    /// An event with only the required fields set; the rest empty.
    pub fn new(ts_ms: Millis, kind: Kind, workload: impl Into<String>, cost: Money) -> Event {
        Event {
            id: None,
            ts_ms,
            duration_ms: 0,
            kind,
            workload: workload.into(),
            model: None,
            run_id: None,
            instance_type: None,
            region: None,
            capacity: None,
            instances: 1,
            requests: 0,
            input_tokens: 0,
            output_tokens: 0,
            cached_input_tokens: 0,
            utilization: None,
            cost,
            input_cost: None,
            list_cost: None,
            outcome: None,
            lost_ms: 0,
            saved: Money::ZERO,
            lever: None,
            tenant: None,
            wait_ms: 0,
            mfu: None,
            precision: None,
            data_stall: None,
            sync_stall: None,
            wrong_chance: None,
            shadow: None,
        }
    }

    pub fn waste(&self) -> Money {
        waste(self.kind, self.utilization, self.cost)
    }
}

/// An id (for `Event::id`, `ReplicaSpan::id`) made of what identifies a row to its writer:
/// `what` names the kind of row, `parts` what tells one from another (a run and its
/// segment's start, a watched server and its interval's start). Writing the same row again,
/// after a crash between the ledger's commit and the writer's own bookkeeping, gives the
/// same id, and the ledger stores it once.
pub fn derived_id(what: &str, parts: &[&[u8]]) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in std::iter::once(what.as_bytes()).chain(parts.iter().copied()) {
        // Length-prefixed, so that no two lists of parts hash alike.
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    let mut id = [0u8; 16];
    id.copy_from_slice(&h.finalize()[..16]);
    id
}

/// The part of `cost` that bought nothing: all of it when idle, the unused share otherwise.
pub fn waste(kind: Kind, utilization: Option<f64>, cost: Money) -> Money {
    match (kind, utilization) {
        (Kind::Idle, _) => cost,
        (_, Some(u)) => cost.scale(1.0 - u.clamp(0.0, 1.0)),
        (_, None) => Money::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_read_aliases_and_round_trip_codes() {
        assert_eq!("On-Demand".parse::<Capacity>(), Ok(Capacity::OnDemand));
        assert_eq!("Dynamic".parse::<Capacity>(), Ok(Capacity::Spot));
        assert_eq!("preempted".parse::<Outcome>(), Ok(Outcome::Preempted));
        for k in Kind::ALL {
            assert_eq!(Kind::from_code(k.code()), Some(*k));
            assert_eq!(k.as_str().parse::<Kind>(), Ok(*k));
        }
        for p in Precision::ALL {
            assert_eq!(Precision::from_code(p.code()), Some(*p));
            assert_eq!(p.as_str().parse::<Precision>(), Ok(*p));
        }
        assert_eq!("BFloat16".parse::<Precision>(), Ok(Precision::Bf16));
        assert_eq!(Precision::Fp32.label(), "FP32");
        let err = "gpu".parse::<Kind>().unwrap_err().to_string();
        assert_eq!(
            err,
            "`gpu` is not a kind (expected one of: inference, training, idle, other)"
        );
    }

    /// The gateway's journal keeps events as JSON: a row it wrote before semantic hits
    /// carried a chance of being wrong reads back without one.
    #[test]
    fn wrong_chances_go_through_json_and_older_rows_read_without_one() {
        let mut e = Event::new(1, Kind::Inference, "w", Money::ZERO);
        e.wrong_chance = Some(0.03);
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["wrong_chance"], 0.03);
        assert_eq!(serde_json::from_value::<Event>(json.clone()).unwrap(), e);
        let mut older = json;
        older.as_object_mut().unwrap().remove("wrong_chance");
        let read = serde_json::from_value::<Event>(older).unwrap();
        assert_eq!(read.wrong_chance, None);
    }

    /// The gateway's journal keeps events as JSON: a shadow's verdict goes through it, and
    /// a row written before shadows reads back as none.
    #[test]
    fn shadows_go_through_json_and_older_rows_read_without_one() {
        let mut e = Event::new(1, Kind::Inference, "w", Money::ZERO);
        e.shadow = Some(Shadow {
            lever: Lever::SemanticCache,
            verdict: Some(Verdict {
                agreed: false,
                method: Agreement::Embedding,
            }),
        });
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["shadow"]["lever"], "semantic_cache");
        assert_eq!(json["shadow"]["verdict"]["method"], "embedding");
        assert_eq!(serde_json::from_value::<Event>(json.clone()).unwrap(), e);
        let mut older = json;
        older.as_object_mut().unwrap().remove("shadow");
        assert_eq!(serde_json::from_value::<Event>(older).unwrap().shadow, None);
        assert_eq!("Embedding".parse::<Agreement>(), Ok(Agreement::Embedding));
    }

    #[test]
    fn waste_by_hand() {
        let mut e = Event::new(0, Kind::Training, "t", Money::from_cents(10_000));
        assert_eq!(e.waste(), Money::ZERO);
        e.utilization = Some(0.35);
        assert_eq!(e.waste(), Money::from_cents(6_500));
        e.kind = Kind::Idle;
        assert_eq!(e.waste(), Money::from_cents(10_000));
    }
}
