//! Saga definitions that the HTTP test binaries serve, each built the same way wherever it is
//! used: a test file picks the ones its server registers.

use std::time::Duration;

use saga_dsl::StepKind::{Compensatable, Pivot};
use saga_dsl::{JsonSchema, SagaDefinition, Step, StepContext, StepError};
use serde_json::{json, Value};

use crate::{scripted_saga, Journal, Outcome, ScriptedStep as S};

/// The input type of the `typed` saga: anything else is `422`.
#[derive(serde::Deserialize, JsonSchema)]
#[schemars(crate = "saga_dsl::schemars")]
#[allow(dead_code)]
pub struct Order {
    order_id: String,
    amount: i64,
}

async fn ok_action(_ctx: StepContext) -> Result<Value, StepError> {
    Ok(json!({"ok": true}))
}

async fn ok_compensation(_ctx: StepContext) -> Result<(), StepError> {
    Ok(())
}

async fn hang_action(_ctx: StepContext) -> Result<Value, StepError> {
    tokio::time::sleep(Duration::from_secs(600)).await;
    Ok(json!("late"))
}

async fn hang_compensation(_ctx: StepContext) -> Result<(), StepError> {
    tokio::time::sleep(Duration::from_secs(600)).await;
    Ok(())
}

/// An action that succeeds with `"slow"` after `delay`.
fn slow_action(delay: Duration) -> impl saga_dsl::Action {
    move |_ctx: StepContext| async move {
        tokio::time::sleep(delay).await;
        Ok::<_, StepError>(json!("slow"))
    }
}

/// `s`: two compensatable steps and a pivot, all succeed.
pub fn succeeds(journal: &Journal) -> SagaDefinition {
    scripted_saga(
        "s",
        1,
        &[
            S::new("a", Compensatable),
            S::new("b", Compensatable),
            S::new("c", Pivot),
        ],
        journal,
    )
}

/// `fails`: `b` fails permanently, so `a` is compensated (`c`, the pivot, never runs).
pub fn fails(journal: &Journal) -> SagaDefinition {
    scripted_saga(
        "fails",
        1,
        &[
            S::new("a", Compensatable),
            S::new("b", Compensatable).action(&[Outcome::Permanent]),
            S::new("c", Pivot),
        ],
        journal,
    )
}

/// `flaky`: `a` fails once (retryable), then succeeds.
pub fn flaky(journal: &Journal) -> SagaDefinition {
    scripted_saga(
        "flaky",
        1,
        &[S::new("a", Compensatable).action(&[Outcome::Retryable])],
        journal,
    )
}

/// `other`: one compensatable step that succeeds; a second definition beside `s`.
pub fn other(journal: &Journal) -> SagaDefinition {
    scripted_saga("other", 1, &[S::new("a", Compensatable)], journal)
}

/// `typed`: one step, and the [`Order`] input type.
pub fn typed() -> SagaDefinition {
    SagaDefinition::builder("typed", 1)
        .input::<Order>()
        .step(Step::compensatable("reserve", ok_action, ok_compensation))
        .build()
        .unwrap()
}

/// `slow`: a compensatable step that takes `delay`, then a pivot (to cancel while it runs).
pub fn slow(delay: Duration) -> SagaDefinition {
    SagaDefinition::builder("slow", 1)
        .step(Step::compensatable(
            "wait",
            slow_action(delay),
            ok_compensation,
        ))
        .step(Step::pivot("finish", ok_action))
        .build()
        .unwrap()
}

/// `slow_pivot`: a pivot first that takes `delay` (a cancel once it has started is refused).
pub fn slow_pivot(delay: Duration) -> SagaDefinition {
    SagaDefinition::builder("slow_pivot", 1)
        .step(Step::pivot("commit", slow_action(delay)))
        .build()
        .unwrap()
}

/// `approval`: `reserve` (compensatable), `await_approval` (waits for the signal `approval`,
/// without a timeout; a payload `{"approved": false}` fails it), `ship` (pivot).
pub fn approval() -> SagaDefinition {
    SagaDefinition::builder("approval", 1)
        .step(Step::compensatable("reserve", ok_action, ok_compensation))
        .step(
            Step::signal("await_approval", "approval").accept(|_, payload| {
                if payload["approved"] == false {
                    Err(saga_dsl::StepError::permanent("not approved"))
                } else {
                    Ok(payload)
                }
            }),
        )
        .step(Step::pivot("ship", ok_action))
        .build()
        .unwrap()
}

/// `stuck_undo`: `hold` (compensatable; its compensation takes ten minutes), then `refuse`
/// (a pivot that always fails): the saga stays `COMPENSATING`, `hold`'s compensation running,
/// until an operator marks it compensated.
pub fn stuck_undo() -> SagaDefinition {
    SagaDefinition::builder("stuck_undo", 1)
        .step(
            Step::compensatable("hold", ok_action, hang_compensation)
                .compensation_timeout(Duration::from_secs(900)),
        )
        .step(Step::pivot("refuse", |_ctx: StepContext| async {
            Err::<Value, _>(StepError::permanent("refused"))
        }))
        .build()
        .unwrap()
}

/// `stuck`: a step that takes ten minutes (its timeout is longer still).
pub fn stuck() -> SagaDefinition {
    SagaDefinition::builder("stuck", 1)
        .step(
            Step::compensatable("hang", hang_action, ok_compensation)
                .timeout(Duration::from_secs(900)),
        )
        .build()
        .unwrap()
}

/// The limits `payout` declares (SPEC §14): `payout_per_merchant` (one running per
/// `merchant`), `payout_running` (50 at once) and the rate limiter `bank` (20/s, burst 5), as
/// a server declares them in its database. Written by the tests of the operator surfaces of
/// flow control, which read and change them whatever definitions their server runs.
pub fn payout_limits() -> Vec<saga_dsl::DeclaredLimit> {
    use saga_dsl::flow::{MaxRunning, PerKey};
    use saga_dsl::{DeclaredLimit, Rate, RateLimiter};
    vec![
        DeclaredLimit::PerKey {
            saga: "payout".to_owned(),
            limit: PerKey {
                name: "payout_per_merchant".to_owned(),
                key: "merchant".to_owned(),
                limit: 1,
            },
        },
        DeclaredLimit::MaxRunning {
            saga: "payout".to_owned(),
            limit: MaxRunning {
                name: "payout_running".to_owned(),
                limit: 50,
            },
        },
        DeclaredLimit::Rate(RateLimiter {
            name: "bank".to_owned(),
            rate: Rate::per_second(20),
            burst: 5,
        }),
    ]
}

/// The task tokens the step `pay` of [`callback`] was handed, by saga, in attempt order.
pub fn task_tokens(saga: &str) -> Vec<String> {
    let tokens = TASK_TOKENS.get_or_init(Default::default).lock().unwrap();
    tokens.get(saga).cloned().unwrap_or_default()
}

static TASK_TOKENS: std::sync::OnceLock<
    std::sync::Mutex<std::collections::HashMap<String, Vec<String>>>,
> = std::sync::OnceLock::new();

/// `callback`: one step, `pay`, completed by its participant's callback within a minute; the
/// participant is the test, which reads the tokens with [`task_tokens`].
pub fn callback() -> SagaDefinition {
    async fn pay(ctx: StepContext) -> Result<Value, StepError> {
        let token = ctx.task().map(|t| t.token().to_owned()).unwrap_or_default();
        TASK_TOKENS
            .get_or_init(Default::default)
            .lock()
            .unwrap()
            .entry(ctx.saga_id().to_string())
            .or_default()
            .push(token);
        Ok(json!({"accepted": true}))
    }
    async fn refund(_: StepContext) -> Result<(), StepError> {
        Ok(())
    }
    SagaDefinition::builder("callback", 1)
        .step(
            Step::compensatable("pay", pay, refund)
                .completed_by_callback()
                .timeout(Duration::from_secs(60)),
        )
        .build()
        .unwrap()
}
