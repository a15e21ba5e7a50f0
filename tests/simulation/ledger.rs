//! The participant every simulated step calls: a ledger that records each call it receives
//! (saga, step, phase, attempt, idempotency key, and for a compensation the action output it
//! was given) and applies each effect once per key, as a real service deduplicating on the
//! key would. It lives outside the kit's process lifetimes, so it outlives crashes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use saga_dsl::{Phase, StepContext, StepError};
use serde_json::{json, Value};
use uuid::Uuid;

/// One call the ledger received, duplicates included.
#[derive(Debug, Clone)]
pub struct Call {
    pub saga: Uuid,
    /// The step's name as the log writes it (`group/branch` for a branch).
    pub step: String,
    pub phase: Phase,
    pub attempt: u32,
    pub key: Uuid,
    /// For a compensation: the action output its context carried.
    pub seen_output: Option<Value>,
    /// For a call completed by callback: the task token it handed the participant.
    pub token: Option<String>,
}

/// An effect applied once for its key.
#[derive(Debug, Clone)]
pub struct Effect {
    pub saga: Uuid,
    pub step: String,
    pub phase: Phase,
    pub amount: i64,
}

#[derive(Debug, Default)]
struct Books {
    calls: Vec<Call>,
    effects: BTreeMap<Uuid, Effect>,
}

/// The ledger, shared by every step of a run.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    books: Arc<Mutex<Books>>,
}

impl Ledger {
    fn books(&self) -> std::sync::MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An action: books `amount` under the call's key (once), and answers with the amount and
    /// key, which its compensation must be given back.
    pub fn act(&self, ctx: &StepContext, amount: i64) -> Value {
        let key = ctx.idempotency_key();
        let mut books = self.books();
        books.calls.push(Call {
            saga: ctx.saga_id(),
            step: ctx.step_name().to_owned(),
            phase: Phase::Action,
            attempt: ctx.attempt(),
            key,
            seen_output: None,
            token: None,
        });
        books.effects.entry(key).or_insert_with(|| Effect {
            saga: ctx.saga_id(),
            step: ctx.step_name().to_owned(),
            phase: Phase::Action,
            amount,
        });
        json!({"amount": amount, "key": key.to_string()})
    }

    /// The call of a step completed by callback: the participant takes the task (recorded as
    /// a call) and books nothing until the schedule answers it ([`Ledger::settle`]).
    pub fn hand_off(&self, ctx: &StepContext) -> Value {
        self.books().calls.push(Call {
            saga: ctx.saga_id(),
            step: ctx.step_name().to_owned(),
            phase: Phase::Action,
            attempt: ctx.attempt(),
            key: ctx.idempotency_key(),
            seen_output: None,
            token: ctx.task().map(|t| t.token().to_owned()),
        });
        json!({"handed": true})
    }

    /// The task handed over for `step` of `saga` by its call of `attempt`, or by its last
    /// call: its attempt and token.
    pub fn handed(&self, saga: Uuid, step: &str, attempt: Option<u32>) -> Option<(u32, String)> {
        self.books()
            .calls
            .iter()
            .rev()
            .filter(|c| c.saga == saga && c.step == step && c.phase == Phase::Action)
            .find(|c| attempt.is_none_or(|a| c.attempt == a))
            .and_then(|c| Some((c.attempt, c.token.clone()?)))
    }

    /// The participant of a step completed by callback does the task it was handed for
    /// `step` of `saga`: books `amount` under the key it was handed (once), and answers with
    /// what its report carries; `None` if the step was compensated first, as a service that
    /// has processed the undo of a key refuses to do its action afterwards.
    pub fn settle(&self, saga: Uuid, step: &str, amount: i64) -> Option<Value> {
        let mut books = self.books();
        let key = books
            .calls
            .iter()
            .rev()
            .find(|c| c.saga == saga && c.step == step && c.phase == Phase::Action)?
            .key;
        let undone = books
            .effects
            .values()
            .any(|e| e.saga == saga && e.step == step && e.phase == Phase::Compensation);
        if undone {
            return None;
        }
        books.effects.entry(key).or_insert_with(|| Effect {
            saga,
            step: step.to_owned(),
            phase: Phase::Action,
            amount,
        });
        Some(json!({"amount": amount, "key": key.to_string()}))
    }

    /// A compensation: undoes whatever the step's action booked (nothing if it booked
    /// nothing, its outcome having been unknown without an effect), once per key.
    pub fn undo(&self, ctx: &StepContext) -> Result<(), StepError> {
        let seen: Option<Value> = ctx.action_output()?;
        let key = ctx.idempotency_key();
        let saga = ctx.saga_id();
        let step = ctx.step_name().to_owned();
        let mut books = self.books();
        books.calls.push(Call {
            saga,
            step: step.clone(),
            phase: Phase::Compensation,
            attempt: ctx.attempt(),
            key,
            seen_output: seen,
            token: None,
        });
        // A real service finds what to undo from its own records of the action's key.
        let booked = books
            .effects
            .values()
            .find(|e| e.saga == saga && e.step == step && e.phase == Phase::Action)
            .map_or(0, |e| e.amount);
        books.effects.entry(key).or_insert(Effect {
            saga,
            step,
            phase: Phase::Compensation,
            amount: -booked,
        });
        Ok(())
    }

    /// The calls received for saga `saga`, in order.
    pub fn calls_of(&self, saga: Uuid) -> Vec<Call> {
        self.books()
            .calls
            .iter()
            .filter(|c| c.saga == saga)
            .cloned()
            .collect()
    }

    /// The effects applied for saga `saga`, by key.
    pub fn effects_of(&self, saga: Uuid) -> BTreeMap<Uuid, Effect> {
        self.books()
            .effects
            .iter()
            .filter(|(_, e)| e.saga == saga)
            .map(|(k, e)| (*k, e.clone()))
            .collect()
    }
}
