//! The `place_order` saga (SPEC §6): reserve stock, charge the payment, assign a rider — each
//! undone by its compensation when a later step fails.

use std::sync::Arc;
use std::time::Duration;

use saga_dsl::{
    Action, Compensation, DefinitionError, JsonSchema, RetryPolicy, SagaDefinition, Step,
    StepContext, StepError, Value,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::shop::{Effect, Shop};
pub use crate::simulate::Simulate;
use crate::simulate::{act, compensate, Call};

/// The saga's name.
pub const NAME: &str = "place_order";
/// The definition's version.
pub const VERSION: u32 = 1;

/// The input of `place_order`: `{"order_id": str, "user": str, "amount": int, "simulate": {…}}`.
// Its JSON Schema (from `JsonSchema`, doc comments as descriptions) is what
// `GET /v1/definitions` and the OpenAPI document show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "saga_dsl::schemars")]
pub struct OrderInput {
    /// The order; the ledger groups effects by it.
    pub order_id: String,
    /// Who ordered.
    pub user: String,
    /// The amount to charge, in the smallest currency unit.
    pub amount: i64,
    /// Injected trouble for demos and tests; absent means none.
    #[serde(default)]
    pub simulate: Simulate,
}

/// The output of `reserve_stock`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// The inventory's reservation id.
    pub reservation_id: String,
}

/// The output of `charge_payment`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// The payment provider's charge id.
    pub charge_id: String,
    /// The amount charged.
    pub amount: i64,
}

/// The output of `assign_rider`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RiderAssignment {
    /// The rider's name.
    pub rider: String,
}

const RIDERS: [&str; 5] = ["Ana", "Bongani", "Chen", "Dara", "Emeka"];

/// Retry policy of the actions: quick retries (50 ms doubling to 2 s, 5 attempts) so that demos
/// and tests with transient failures finish fast.
pub(crate) fn action_policy() -> RetryPolicy {
    RetryPolicy::new()
        .with_initial_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(2))
        .with_max_attempts(5)
}

/// Backoff of the compensations: 50 ms doubling to 2 s, without end (compensations never give
/// up; the orchestrator flags a saga that keeps failing).
pub(crate) fn compensation_policy() -> RetryPolicy {
    RetryPolicy::forever()
        .with_initial_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(2))
}

/// How long one attempt of an action or compensation may take before its outcome is unknown.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// A compensatable step with the example policies.
pub(crate) fn compensatable(
    name: impl Into<String>,
    action: impl Action,
    compensation: impl Compensation,
) -> Step<saga_dsl::Call> {
    Step::compensatable(name, action, compensation)
        .retry(action_policy())
        .compensation_retry(compensation_policy())
        .timeout(ATTEMPT_TIMEOUT)
        .compensation_timeout(ATTEMPT_TIMEOUT)
}

/// A short, stable id derived from the idempotency key, so that a retry names the same thing.
pub(crate) fn short_id(prefix: &str, ctx: &StepContext) -> String {
    let key = ctx.idempotency_key().simple().to_string();
    format!("{prefix}_{}", &key[..12])
}

/// The charge of an order of `amount` for `owner` (`place_order`'s and `fulfil_order`'s
/// `charge_payment`): its output names the charge by the call's key.
pub(crate) async fn charge(
    shop: &Shop,
    ctx: &StepContext,
    owner: &str,
    amount: i64,
    sim: &Simulate,
) -> Result<Value, StepError> {
    let output = Charge {
        charge_id: short_id("ch", ctx),
        amount,
    };
    let call = Call {
        owner,
        effect: Effect::Charged.into(),
        amount,
        refusal: "card declined",
        output: json!(output),
    };
    act(shop, ctx, sim, call).await
}

/// The `place_order` definition, its participants working against `shop`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}", dir.path().join("shop.db").display());
/// use std::sync::Arc;
/// use example_sagas::{place_order::place_order, shop::Shop};
/// let shop = Arc::new(Shop::open(&url).await?); // e.g. "sqlite://shop.db"
/// let def = place_order(shop)?;
/// assert_eq!(def.steps().len(), 3);
/// # Ok(()) }
/// ```
pub fn place_order(shop: Arc<Shop>) -> Result<SagaDefinition, DefinitionError> {
    SagaDefinition::builder(NAME, VERSION)
        .input::<OrderInput>()
        .attr("order_id", |i: &OrderInput| i.order_id.clone())
        .attr("user", |i: &OrderInput| i.user.clone())
        .state(shop)
        .step(compensatable(
            "reserve_stock",
            reserve_stock,
            undo("release_stock", Effect::Reserved, Effect::Released),
        ))
        .step(compensatable(
            "charge_payment",
            charge_payment,
            undo("refund_payment", Effect::Charged, Effect::Refunded),
        ))
        .step(compensatable(
            "assign_rider",
            assign_rider,
            undo(
                "unassign_rider",
                Effect::RiderAssigned,
                Effect::RiderUnassigned,
            ),
        ))
        .build()
}

async fn reserve_stock(ctx: StepContext) -> Result<Value, StepError> {
    let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<OrderInput>()?);
    let output = Reservation {
        reservation_id: short_id("res", &ctx),
    };
    let call = Call {
        owner: &input.order_id,
        effect: Effect::Reserved.into(),
        amount: 0,
        refusal: "out of stock",
        output: json!(output),
    };
    act(shop, &ctx, &input.simulate, call).await
}

async fn charge_payment(ctx: StepContext) -> Result<Value, StepError> {
    let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<OrderInput>()?);
    charge(shop, &ctx, &input.order_id, input.amount, &input.simulate).await
}

async fn assign_rider(ctx: StepContext) -> Result<Value, StepError> {
    let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<OrderInput>()?);
    // Deterministic per key, so a retry picks the same rider.
    let pick = usize::from(ctx.idempotency_key().as_bytes()[0]) % RIDERS.len();
    let output = RiderAssignment {
        rider: RIDERS[pick].to_owned(),
    };
    let call = Call {
        owner: &input.order_id,
        effect: Effect::RiderAssigned.into(),
        amount: 0,
        refusal: "no rider within 5 km",
        output: json!(output),
    };
    act(shop, &ctx, &input.simulate, call).await
}

/// The compensation `name`, undoing `action_effect` with `undo`. All three compensations have the
/// same shape: they find what to undo by the action's key, not by its output (see
/// [`crate::shop::Shop::undo_once`]).
fn undo(name: &'static str, action_effect: Effect, undo: Effect) -> impl Compensation {
    move |ctx: StepContext| async move {
        let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<OrderInput>()?);
        compensate(
            shop,
            &ctx,
            &input.simulate,
            name,
            &input.order_id,
            action_effect.into(),
            undo.into(),
        )
        .await
    }
}

#[cfg(test)]
// A failed unwrap is a failed test, with the error in the panic message.
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use saga_dsl::{Phase, StepError, StepKind, Value};
    use uuid::Uuid;

    use crate::shop::LedgerEntry;

    async fn setup() -> (tempfile::TempDir, Arc<Shop>, SagaDefinition) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("shop.db").display());
        let shop = Arc::new(Shop::open(&url).await.unwrap());
        let def = place_order(shop.clone()).unwrap();
        (dir, shop, def)
    }

    fn ctx(
        def: &SagaDefinition,
        saga: Uuid,
        index: usize,
        phase: Phase,
        attempt: u32,
        input: &Value,
    ) -> StepContext {
        let name = ["reserve_stock", "charge_payment", "assign_rider"][index];
        StepContext::new(
            saga,
            index,
            name,
            phase,
            attempt,
            Arc::new(input.clone()),
            Arc::new(BTreeMap::new()),
        )
        .with_state(def.state().cloned())
    }

    async fn run_action(
        def: &SagaDefinition,
        saga: Uuid,
        index: usize,
        attempt: u32,
        input: &Value,
    ) -> Result<Value, StepError> {
        let c = ctx(def, saga, index, Phase::Action, attempt, input);
        def.steps()[index]
            .call()
            .expect("place_order's steps all call")
            .action()
            .run(c)
            .await
    }

    async fn run_compensation(
        def: &SagaDefinition,
        saga: Uuid,
        index: usize,
        attempt: u32,
        input: &Value,
    ) -> Result<(), StepError> {
        let c = ctx(def, saga, index, Phase::Compensation, attempt, input);
        let comp = def.steps()[index].call().unwrap().compensation().unwrap();
        comp.run(c).await
    }

    #[tokio::test]
    async fn definition_and_input_checks() {
        let (_dir, _shop, def) = setup().await;
        assert_eq!((def.name(), def.version()), ("place_order", 1));
        let names: Vec<_> = def.steps().iter().map(|s| s.name()).collect();
        assert_eq!(names, ["reserve_stock", "charge_payment", "assign_rider"]);
        assert!(def
            .steps()
            .iter()
            .all(|s| s.kind() == StepKind::Compensatable));
        assert_eq!(
            def.steps()[0].call().unwrap().attempt_timeout(),
            Duration::from_secs(10)
        );

        let good = json!({"order_id": "o1", "user": "u", "amount": 5});
        assert!(def.check_input(&good).is_ok());
        assert!(def.check_input(&json!({"order_id": 1})).is_err());
        let sim = json!({"order_id": "o1", "user": "u", "amount": 5,
                         "simulate": {"fail_step": "assign_rider", "delay_ms": 3,
                                      "transient_failures": {"charge_payment": 2}}});
        assert!(def.check_input(&sim).is_ok());
        let typo = json!({"order_id": "o1", "user": "u", "amount": 5,
                          "simulate": {"fail_stepp": "assign_rider"}});
        assert!(def.check_input(&typo).is_err());
    }

    #[tokio::test]
    async fn actions_apply_once_per_key() {
        let (_dir, shop, def) = setup().await;
        let saga = Uuid::new_v4();
        let input = json!({"order_id": "o1", "user": "u", "amount": 990});
        for index in 0..3 {
            let first = run_action(&def, saga, index, 1, &input).await.unwrap();
            let again = run_action(&def, saga, index, 2, &input).await.unwrap();
            assert_eq!(first, again, "a retry returns the first output");
        }
        let charge: Charge =
            serde_json::from_value(run_action(&def, saga, 1, 3, &input).await.unwrap()).unwrap();
        assert_eq!(charge.amount, 990);
        let entry = shop.ledger_for("o1").await.unwrap();
        assert_eq!(
            entry,
            LedgerEntry {
                reserved: 1,
                charged: 1,
                rider_assigned: 1,
                ..LedgerEntry::default()
            }
        );

        // Compensating twice undoes once, and the books net to zero.
        for index in (0..3).rev() {
            run_compensation(&def, saga, index, 1, &input)
                .await
                .unwrap();
            run_compensation(&def, saga, index, 2, &input)
                .await
                .unwrap();
        }
        let entry = shop.ledger_for("o1").await.unwrap();
        assert_eq!((entry.reserved, entry.released), (1, 1));
        assert_eq!((entry.charged, entry.refunded), (1, 1));
        assert_eq!((entry.rider_assigned, entry.rider_unassigned), (1, 1));
    }

    #[tokio::test]
    async fn compensation_without_action_records_nothing() {
        let (_dir, shop, def) = setup().await;
        let saga = Uuid::new_v4();
        let input = json!({"order_id": "o2", "user": "u", "amount": 10});
        run_compensation(&def, saga, 1, 1, &input).await.unwrap();
        assert_eq!(shop.ledger_for("o2").await.unwrap(), LedgerEntry::default());
        // An action arriving after its compensation must not charge.
        let late = run_action(&def, saga, 1, 1, &input).await.unwrap_err();
        assert!(!late.is_retryable(), "{late}");
        assert_eq!(shop.ledger_for("o2").await.unwrap(), LedgerEntry::default());
    }

    #[tokio::test]
    async fn simulated_failures() {
        let (_dir, shop, def) = setup().await;
        let saga = Uuid::new_v4();
        let input = json!({"order_id": "o3", "user": "u", "amount": 10, "simulate": {
            "fail_step": "assign_rider",
            "transient_failures": {"charge_payment": 2},
            "compensation_failures": {"charge_payment": 1},
            "delay_ms": 2}});

        // Fails exactly K = 2 times, by attempt number, then succeeds.
        for attempt in 1..=2 {
            let err = run_action(&def, saga, 1, attempt, &input)
                .await
                .unwrap_err();
            assert!(err.is_retryable(), "{err}");
            assert!(err.message().contains("transient"), "{err}");
        }
        run_action(&def, saga, 1, 3, &input).await.unwrap();

        let err = run_action(&def, saga, 2, 1, &input).await.unwrap_err();
        assert_eq!(err, StepError::permanent("no rider within 5 km"));

        let err = run_compensation(&def, saga, 1, 1, &input)
            .await
            .unwrap_err();
        assert!(err.is_retryable(), "{err}");
        run_compensation(&def, saga, 1, 2, &input).await.unwrap();

        let entry = shop.ledger_for("o3").await.unwrap();
        assert_eq!((entry.charged, entry.refunded), (1, 1));
        assert_eq!(entry.rider_assigned, 0);
    }
}
