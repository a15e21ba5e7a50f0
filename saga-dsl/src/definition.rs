//! Saga definitions: a name, a version, a typed input and an ordered list of steps.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{DefinitionError, Step, StepKind};

type InputCheck = Arc<dyn Fn(&Value) -> Result<(), String> + Send + Sync>;

/// A validated saga definition. Build one with [`SagaDefinition::builder`].
///
/// The orchestrator records the name, version and [`hash`](Self::hash) of the definition with
/// every saga it starts, and only drives a saga with a definition that matches all three.
///
/// ```
/// use saga_dsl::{SagaDefinition, Step, StepContext, StepError};
///
/// #[derive(serde::Deserialize)]
/// struct Order { order_id: String, amount: i64 }
///
/// async fn reserve(ctx: StepContext) -> Result<String, StepError> {
///     let order: Order = ctx.input()?;
///     Ok(format!("reservation for {}", order.order_id))
/// }
/// async fn release(_ctx: StepContext) -> Result<(), StepError> { Ok(()) }
/// async fn charge(ctx: StepContext) -> Result<i64, StepError> {
///     Ok(ctx.input::<Order>()?.amount)
/// }
///
/// let saga = SagaDefinition::builder("checkout", 1)
///     .input::<Order>()
///     .step(Step::compensatable("reserve", reserve, release))
///     .step(Step::pivot("charge", charge))
///     .build()
///     .expect("a valid definition");
/// assert_eq!(saga.steps().len(), 2);
/// assert!(saga.check_input(&serde_json::json!({"order_id": "o1", "amount": 5})).is_ok());
/// assert!(saga.check_input(&serde_json::json!({"order_id": 1})).is_err());
/// ```
#[derive(Clone)]
pub struct SagaDefinition {
    name: String,
    version: u32,
    steps: Vec<Step>,
    hash: String,
    input_check: InputCheck,
}

impl fmt::Debug for SagaDefinition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SagaDefinition")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("hash", &self.hash)
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

impl SagaDefinition {
    /// Starts a definition. `version` starts at 1; bump it whenever the step list changes, so that
    /// sagas started with the old list keep running on a process that still has it.
    pub fn builder(name: impl Into<String>, version: u32) -> SagaBuilder {
        SagaBuilder {
            name: name.into(),
            version,
            steps: Vec::new(),
            input_check: Arc::new(|_| Ok(())),
        }
    }

    /// The saga's name, as used in `POST /v1/sagas/{name}`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The definition's version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// A hash of the step list (names and kinds, in order), recorded with every saga.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// The steps, in order.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// The index of the point of no return: the pivot, or else the first retriable step. Once the
    /// step at this index has started, the saga can no longer be cancelled.
    pub fn point_of_no_return(&self) -> Option<usize> {
        self.steps
            .iter()
            .position(|s| s.kind != StepKind::Compensatable)
    }

    /// Checks a saga input against the definition's input type.
    pub fn check_input(&self, input: &Value) -> Result<(), String> {
        (self.input_check)(input)
    }
}

/// Builds a [`SagaDefinition`]; see there for an example.
pub struct SagaBuilder {
    name: String,
    version: u32,
    steps: Vec<Step>,
    input_check: InputCheck,
}

impl SagaBuilder {
    /// Declares the input type: a start whose input does not deserialise into `T` is refused
    /// before any saga is created.
    pub fn input<T: DeserializeOwned + 'static>(mut self) -> Self {
        self.input_check =
            Arc::new(|v: &Value| T::deserialize(v).map(|_| ()).map_err(|e| e.to_string()));
        self
    }

    /// Appends a step.
    pub fn step(mut self, step: Step) -> Self {
        self.steps.push(step);
        self
    }

    /// Validates and returns the definition.
    pub fn build(self) -> Result<SagaDefinition, DefinitionError> {
        if !valid_ident(&self.name) {
            return Err(DefinitionError::InvalidName(self.name));
        }
        if self.version == 0 {
            return Err(DefinitionError::InvalidVersion(self.name));
        }
        if self.steps.is_empty() {
            return Err(DefinitionError::NoSteps(self.name));
        }
        let mut seen = HashSet::new();
        for step in &self.steps {
            if !valid_ident(&step.name) {
                return Err(DefinitionError::InvalidStepName {
                    saga: self.name,
                    step: step.name.clone(),
                });
            }
            if !seen.insert(step.name.as_str()) {
                return Err(DefinitionError::DuplicateStep {
                    saga: self.name,
                    step: step.name.clone(),
                });
            }
        }
        // Order: compensatable*, pivot?, retriable*.
        let rank = |k: StepKind| match k {
            StepKind::Compensatable => 0,
            StepKind::Pivot => 1,
            StepKind::Retriable => 2,
        };
        for pair in self.steps.windows(2) {
            let (prev, next) = (&pair[0], &pair[1]);
            let bad = rank(next.kind) < rank(prev.kind)
                || (next.kind == StepKind::Pivot && prev.kind == StepKind::Pivot);
            if bad {
                return Err(DefinitionError::StepOrder {
                    saga: self.name,
                    step: next.name.clone(),
                    kind: next.kind.as_str(),
                    after: prev.name.clone(),
                });
            }
        }
        let hash = step_list_hash(&self.name, self.version, &self.steps);
        Ok(SagaDefinition {
            name: self.name,
            version: self.version,
            steps: self.steps,
            hash,
            input_check: self.input_check,
        })
    }
}

fn valid_ident(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn step_list_hash(name: &str, version: u32, steps: &[Step]) -> String {
    let mut h = Sha256::new();
    h.update(format!("{name}\n{version}\n"));
    for (i, s) in steps.iter().enumerate() {
        h.update(format!("{i}:{}:{}\n", s.name, s.kind));
    }
    hex::encode(&h.finalize()[..8])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{StepContext, StepError};

    async fn ok(_: StepContext) -> Result<(), StepError> {
        Ok(())
    }

    fn c(name: &str) -> Step {
        Step::compensatable(name, ok, ok)
    }

    #[test]
    fn rejects_invalid_definitions() {
        let err = SagaDefinition::builder("s", 1).build().unwrap_err();
        assert_eq!(err, DefinitionError::NoSteps("s".into()));

        let err = SagaDefinition::builder("s", 1)
            .step(c("a"))
            .step(c("a"))
            .build()
            .unwrap_err();
        assert!(
            matches!(err, DefinitionError::DuplicateStep { .. }),
            "{err}"
        );

        let err = SagaDefinition::builder("s", 1)
            .step(Step::pivot("p", ok))
            .step(c("a"))
            .build()
            .unwrap_err();
        assert!(matches!(err, DefinitionError::StepOrder { .. }), "{err}");

        let err = SagaDefinition::builder("s", 1)
            .step(Step::pivot("p", ok))
            .step(Step::pivot("q", ok))
            .build()
            .unwrap_err();
        assert!(matches!(err, DefinitionError::StepOrder { .. }), "{err}");

        let err = SagaDefinition::builder("s", 1)
            .step(Step::retriable("r", ok))
            .step(Step::pivot("p", ok))
            .build()
            .unwrap_err();
        assert!(matches!(err, DefinitionError::StepOrder { .. }), "{err}");

        assert!(matches!(
            SagaDefinition::builder("s", 0).step(c("a")).build(),
            Err(DefinitionError::InvalidVersion(_))
        ));
        assert!(matches!(
            SagaDefinition::builder("bad name", 1).step(c("a")).build(),
            Err(DefinitionError::InvalidName(_))
        ));
    }

    #[test]
    fn hash_follows_the_step_list() {
        let a = SagaDefinition::builder("s", 1)
            .step(c("a"))
            .build()
            .unwrap();
        let a2 = SagaDefinition::builder("s", 1)
            .step(c("a"))
            .build()
            .unwrap();
        let b = SagaDefinition::builder("s", 1)
            .step(c("a"))
            .step(c("b"))
            .build()
            .unwrap();
        assert_eq!(a.hash(), a2.hash());
        assert_ne!(a.hash(), b.hash());
    }

    #[test]
    fn point_of_no_return() {
        let s = SagaDefinition::builder("s", 1)
            .step(c("a"))
            .step(Step::pivot("p", ok))
            .step(Step::retriable("r", ok))
            .build()
            .unwrap();
        assert_eq!(s.point_of_no_return(), Some(1));
        let s = SagaDefinition::builder("s", 1)
            .step(c("a"))
            .step(Step::retriable("r", ok))
            .build()
            .unwrap();
        assert_eq!(s.point_of_no_return(), Some(1));
        let s = SagaDefinition::builder("s", 1)
            .step(c("a"))
            .build()
            .unwrap();
        assert_eq!(s.point_of_no_return(), None);
    }
}
