//! What every call of a saga shares instead of capturing it in each closure: the application's
//! state, given to the definition once ([`SagaBuilder::state`](crate::SagaBuilder::state)); the
//! saga's input, deserialised once per run ([`StepContext::input`](crate::StepContext::input));
//! and [`Stage`], a stage's name typed with its output.

use std::any::{Any, TypeId};
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};

use serde::de::DeserializeOwned;
use serde_json::Value;

/// An application's state shared by every call of a saga's definition (clients, pools,
/// configuration), read back typed with [`StepContext::state`](crate::StepContext::state).
pub type SharedState = Arc<dyn Any + Send + Sync>;

/// One value per type.
type Parsed = Vec<(TypeId, Arc<dyn Any + Send + Sync>)>;

/// The saga's input deserialised, once per type asked for, for every call of one run of a
/// saga: the orchestrator makes one per run and gives it to each call's context.
#[derive(Clone, Default)]
pub struct InputCache(Arc<Mutex<Parsed>>);

impl InputCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// `raw` as a `T`: deserialised on the first call for `T`, shared afterwards.
    pub(crate) fn get_or_parse<T>(&self, raw: &Value) -> Result<Arc<T>, serde_json::Error>
    where
        T: DeserializeOwned + Send + Sync + 'static,
    {
        if let Some(hit) = self.find::<T>() {
            return Ok(hit);
        }
        // Deserialised outside the lock: two calls racing both parse, the first to store wins.
        let parsed: Arc<dyn Any + Send + Sync> = Arc::new(T::deserialize(raw)?);
        let mut slots = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let id = TypeId::of::<T>();
        let stored = match slots.iter().find(|(t, _)| *t == id) {
            Some((_, v)) => v.clone(),
            None => {
                slots.push((id, parsed.clone()));
                parsed
            }
        };
        drop(slots);
        // Slots are keyed by their value's type, so the downcast holds; a fresh parse is the
        // harmless answer if it ever did not.
        match stored.downcast::<T>() {
            Ok(v) => Ok(v),
            Err(_) => Ok(Arc::new(T::deserialize(raw)?)),
        }
    }

    fn find<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        let slots = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let id = TypeId::of::<T>();
        let (_, v) = slots.iter().find(|(t, _)| *t == id)?;
        v.clone().downcast::<T>().ok()
    }
}

impl fmt::Debug for InputCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.lock().map(|s| s.len()).unwrap_or_default();
        f.debug_struct("InputCache").field("types", &n).finish()
    }
}

/// A stage's name with the type of its output. Declare one constant per stage whose output
/// later stages read, name the stage with it, and read the output with
/// [`StepContext::output`](crate::StepContext::output): the name is written once and the type
/// is checked wherever it is read.
///
/// ```
/// use saga_dsl::{Stage, Step, StepContext, StepError};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Charge { charge_id: String }
///
/// const CHARGE: Stage<Charge> = Stage::named("charge_payment");
///
/// async fn charge(_: StepContext) -> Result<Charge, StepError> {
///     Ok(Charge { charge_id: "ch_1".into() })
/// }
/// async fn refund(_: StepContext) -> Result<(), StepError> { Ok(()) }
/// async fn ship(ctx: StepContext) -> Result<(), StepError> {
///     let charge = ctx.output(CHARGE)?; // a `Charge`
///     assert_eq!(charge.charge_id, "ch_1");
///     Ok(())
/// }
///
/// let step = Step::compensatable(CHARGE, charge, refund);
/// assert_eq!(step.name(), "charge_payment");
/// # let _ = Step::pivot("ship", ship);
/// ```
pub struct Stage<T> {
    name: &'static str,
    output: PhantomData<fn() -> T>,
}

impl<T> Stage<T> {
    /// The stage named `name`, whose output is a `T`.
    pub const fn named(name: &'static str) -> Self {
        Self {
            name,
            output: PhantomData,
        }
    }

    /// The stage's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl<T> Clone for Stage<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Stage<T> {}

impl<T> fmt::Debug for Stage<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Stage").field(&self.name).finish()
    }
}

impl<T> From<Stage<T>> for String {
    fn from(stage: Stage<T>) -> Self {
        stage.name.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Order {
        id: String,
    }

    #[derive(serde::Deserialize)]
    struct JustAmount {
        amount: i64,
    }

    #[test]
    fn each_type_is_parsed_once_and_shared() {
        let cache = InputCache::new();
        let raw = serde_json::json!({"id": "o-1", "amount": 5});
        let a = cache.get_or_parse::<Order>(&raw).unwrap();
        let b = cache.get_or_parse::<Order>(&raw).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "the second read shares the first");
        assert_eq!(cache.get_or_parse::<JustAmount>(&raw).unwrap().amount, 5);
        assert_eq!(a.id, "o-1");
    }

    #[test]
    fn a_mismatch_is_an_error_and_not_cached() {
        let cache = InputCache::new();
        let raw = serde_json::json!({"amount": 5});
        assert!(cache.get_or_parse::<Order>(&raw).is_err());
        assert!(cache.find::<Order>().is_none());
    }
}
