//! Simulated trouble for demos and tests, and the shared body of every example action and
//! compensation: delay, injected failures, then the effect through the shop's idempotent consumer.

use std::collections::BTreeMap;
use std::time::Duration;

use saga_dsl::{JsonSchema, StepContext, StepError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::Instrument;

use crate::shop::{is_voided, Label, Shop};

/// The optional `"simulate"` object of an example saga's input.
///
/// Failures are decided from the attempt number the orchestrator passes in
/// ([`StepContext::attempt`]), which lives in its durable log: a crash in the middle of a
/// simulated outage does not reset it, exactly as a real retry budget behaves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
#[schemars(crate = "saga_dsl::schemars")]
pub struct Simulate {
    /// The step (by name) whose action fails permanently.
    pub fail_step: Option<String>,
    /// Step name → K: that action fails with a retryable error on attempts 1..=K, then succeeds.
    pub transient_failures: BTreeMap<String, u32>,
    /// Step name (or compensation name) → K: that compensation fails on attempts 1..=K.
    pub compensation_failures: BTreeMap<String, u32>,
    /// Every action and compensation takes this long: half before its effect, half after, so a
    /// crash can land on either side of it.
    pub delay_ms: u64,
}

impl Simulate {
    async fn first_half(&self) {
        tokio::time::sleep(Duration::from_millis(self.delay_ms / 2)).await;
    }

    async fn second_half(&self) {
        tokio::time::sleep(Duration::from_millis(self.delay_ms - self.delay_ms / 2)).await;
    }
}

/// A retryable error while `attempt` is within the first `k` attempts of `name`, if configured.
fn transient(
    failures: &BTreeMap<String, u32>,
    names: &[&str],
    attempt: u32,
    what: &str,
) -> Result<(), StepError> {
    let k = names.iter().find_map(|n| failures.get(*n)).copied();
    match k {
        Some(k) if attempt <= k => Err(StepError::retryable(format!(
            "{what}: simulated transient failure (attempt {attempt} of {k} failing)"
        ))),
        _ => Ok(()),
    }
}

/// What the simulation does before a call to a participant in another process (the bank over
/// HTTP): the first half of the delay, then the transient failures scripted for the step.
pub(crate) async fn before_remote_call(ctx: &StepContext, sim: &Simulate) -> Result<(), StepError> {
    sim.first_half().await;
    let step = ctx.step_name();
    transient(&sim.transient_failures, &[step], ctx.attempt(), step)
}

/// What an action does once the simulation lets it through.
pub(crate) struct Call<'a> {
    /// The business key the ledger groups by (order id, trip id).
    pub owner: &'a str,
    /// The effect.
    pub effect: Label,
    /// Money moved, in the smallest unit; 0 where meaningless.
    pub amount: i64,
    /// The message of a simulated permanent failure of this step.
    pub refusal: &'a str,
    /// The action's output if it is performed now; a retry returns the first one instead.
    pub output: Value,
}

/// Runs an action: delay, simulated failures, then the effect at most once per idempotency key.
/// Returns the output stored with the first successful call.
pub(crate) async fn act(
    shop: &Shop,
    ctx: &StepContext,
    sim: &Simulate,
    call: Call<'_>,
) -> Result<Value, StepError> {
    let step = ctx.step_name();
    sim.first_half().await;
    if sim.fail_step.as_deref() == Some(step) {
        return Err(StepError::permanent(call.refusal));
    }
    transient(&sim.transient_failures, &[step], ctx.attempt(), step)?;
    let key = ctx.idempotency_key().to_string();
    // The participant's own span: exported with the saga's trace, a child of this attempt's.
    let span = tracing::info_span!("shop.apply", effect = %call.effect, key = %key);
    let stored = shop
        .apply_once(&key, call.effect, call.owner, call.amount, call.output)
        .instrument(span)
        .await?;
    if is_voided(&stored) {
        // Only possible when the compensation already ran for an unknown outcome; the saga is
        // going backwards, so this late call must not report success.
        return Err(StepError::permanent(format!(
            "{step}: already compensated, not performed"
        )));
    }
    sim.second_half().await;
    Ok(stored)
}

/// Runs a compensation: delay, simulated failures, then the undo at most once per key.
///
/// It needs neither the action's output nor its outcome: [`Shop::undo_once`] looks the action up
/// by its own idempotency key ([`StepContext::action_key`]), so an action whose outcome is unknown
/// is undone if it happened and voided if it did not.
pub(crate) async fn compensate(
    shop: &Shop,
    ctx: &StepContext,
    sim: &Simulate,
    compensation: &str,
    owner: &str,
    action_effect: Label,
    undo: Label,
) -> Result<(), StepError> {
    sim.first_half().await;
    transient(
        &sim.compensation_failures,
        &[ctx.step_name(), compensation],
        ctx.attempt(),
        compensation,
    )?;
    let key = ctx.idempotency_key().to_string();
    let action_key = ctx.action_key().to_string();
    let span = tracing::info_span!("shop.undo", effect = %undo, key = %key);
    let undone = shop
        .undo_once(&key, &action_key, action_effect, undo, owner)
        .instrument(span)
        .await?;
    tracing::debug!(
        step = ctx.step_name(),
        compensation,
        undone,
        "compensation applied"
    );
    sim.second_half().await;
    Ok(())
}
