//! The quality gate: bounds that a run's figures must keep, each named as it was set (the
//! flag), and the ones crossed, in words. A gate crossed fails the run.

use std::fmt::Display;

/// A gate crossed: the figures, and the bounds they crossed.
#[derive(Debug, thiserror::Error)]
#[error("gate failed: {0}")]
pub struct GateFailed(String);

/// Which side of its bound a figure must keep to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    AtMost,
    AtLeast,
}

/// The bounds set and the ones crossed.
#[derive(Debug, Default)]
pub struct Gate {
    set: bool,
    failures: Vec<String>,
}

impl Gate {
    /// A gate with nothing crossed yet; `set` says whether any bound was set.
    pub fn new(set: bool) -> Gate {
        Gate {
            set,
            failures: Vec::new(),
        }
    }

    /// `value` must stay on the `keep` side of `bound` (named `flag`), when one is set;
    /// `figure` says the value in words.
    pub fn check<T: PartialOrd + Display>(
        &mut self,
        flag: &str,
        keep: Keep,
        bound: Option<T>,
        value: T,
        figure: impl FnOnce() -> String,
    ) {
        self.set |= bound.is_some();
        let Some(bound) = bound else { return };
        let (crossed, sign) = match keep {
            Keep::AtMost => (value > bound, '>'),
            Keep::AtLeast => (value < bound, '<'),
        };
        if crossed {
            self.failures
                .push(format!("{} {sign} {flag} {bound}", figure()));
        }
    }

    /// Whether any bound was set.
    pub fn is_set(&self) -> bool {
        self.set
    }

    /// The bounds crossed, in words.
    pub fn failures(&self) -> &[String] {
        &self.failures
    }

    /// Whether the figures kept every bound set.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// `{"passed", "failures"}` when a bound was set, else null.
    pub fn to_json(&self) -> serde_json::Value {
        if self.set {
            serde_json::json!({"passed": self.passed(), "failures": self.failures})
        } else {
            serde_json::Value::Null
        }
    }

    /// The run's outcome: an error naming every bound crossed, if any.
    pub fn outcome(self) -> Result<(), GateFailed> {
        if self.failures.is_empty() {
            Ok(())
        } else {
            Err(GateFailed(self.failures.join("; ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_names_each_bound_crossed() {
        let mut g = Gate::default();
        assert!(!g.is_set() && g.passed());
        g.check("--max-flips", Keep::AtMost, None, 9, || "9 flips".into());
        assert!(!g.is_set());
        g.check("--max-flips", Keep::AtMost, Some(3), 2, || "2 flips".into());
        g.check("--min-cosine", Keep::AtLeast, Some(0.99), 0.995, || {
            "mean cosine 0.995".into()
        });
        assert!(g.is_set() && g.passed());
        g.check("--max-flips", Keep::AtMost, Some(3), 4, || "4 flips".into());
        g.check("--min-cosine", Keep::AtLeast, Some(0.99), 0.5, || {
            "mean cosine 0.50000".into()
        });
        assert_eq!(
            g.failures(),
            [
                "4 flips > --max-flips 3",
                "mean cosine 0.50000 < --min-cosine 0.99"
            ]
        );
        let err = g.outcome().unwrap_err().to_string();
        assert_eq!(
            err,
            "gate failed: 4 flips > --max-flips 3; mean cosine 0.50000 < --min-cosine 0.99"
        );
    }
}
