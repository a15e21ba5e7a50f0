//! The `fulfil_order` saga (SPEC §7): reserve every item of the order at once, charge the
//! payment, wait for a person's approval when the order needs one, wait out a cooling-off
//! period, ship (the point of no return) and tell the customer.

use std::sync::Arc;
use std::time::Duration;

use saga_dsl::{
    Compensation, DefinitionError, JsonSchema, SagaDefinition, Stage, Step, StepContext, StepError,
    Value,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::place_order::{action_policy, charge, compensatable, short_id, Charge, ATTEMPT_TIMEOUT};
use crate::shop::{Effect, Label, Shop};
pub use crate::simulate::Simulate;
use crate::simulate::{act, compensate, Call};

/// The saga's name.
pub const NAME: &str = "fulfil_order";
/// The definition's version.
pub const VERSION: u32 = 1;
/// The signal `await_approval` waits for.
pub const APPROVAL: &str = "approval";

/// The input of `fulfil_order`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "saga_dsl::schemars")]
pub struct FulfilInput {
    /// The order; the ledger groups effects by it.
    pub order_id: String,
    /// Who ordered.
    pub user: String,
    /// The amount to charge, in the smallest currency unit.
    pub amount: i64,
    /// What to reserve: one branch of `reserve_items` per item, named by its sku.
    pub items: Vec<Item>,
    /// Whether a person must approve the order (signal `approval`) before it ships.
    #[serde(default)]
    pub needs_approval: bool,
    /// How long to wait for the approval, in seconds; past it the order is compensated.
    #[serde(default = "default_approval_timeout")]
    pub approval_timeout_s: u64,
    /// A durable pause before shipping, in milliseconds, during which a cancel still undoes
    /// everything.
    #[serde(default)]
    pub cooling_off_ms: u64,
    /// Injected trouble for demos and tests; a branch is named `reserve_items/<sku>`.
    #[serde(default)]
    pub simulate: Simulate,
}

fn default_approval_timeout() -> u64 {
    3600
}

/// One line of the order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "saga_dsl::schemars")]
pub struct Item {
    /// The stock keeping unit; names the item's branch and its ledger keys.
    pub sku: String,
    /// How many.
    pub qty: i64,
}

/// The payload of the signal `approval`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(crate = "saga_dsl::schemars")]
pub struct Approval {
    /// Whether the order may go on; `false` compensates it.
    pub approved: bool,
    /// Who decided.
    pub by: String,
}

/// The `fulfil_order` definition, its participants working against `shop`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let url = format!("sqlite://{}", dir.path().join("shop.db").display());
/// use std::sync::Arc;
/// use example_sagas::{fulfil_order::fulfil_order, shop::Shop};
/// let def = fulfil_order(Arc::new(Shop::open(&url).await?))?;
/// let stages: Vec<&str> = def.steps().iter().map(|s| s.name()).collect();
/// assert_eq!(stages, ["reserve_items", "charge_payment", "await_approval", "cooling_off", "ship", "notify_customer"]);
/// # Ok(()) }
/// ```
pub fn fulfil_order(shop: Arc<Shop>) -> Result<SagaDefinition, DefinitionError> {
    SagaDefinition::builder(NAME, VERSION)
        .input::<FulfilInput>()
        .attr("order_id", |i: &FulfilInput| i.order_id.clone())
        .attr("user", |i: &FulfilInput| i.user.clone())
        .state(shop)
        .step(
            Step::map(
                "reserve_items",
                |ctx| {
                    Ok(ctx
                        .input::<FulfilInput>()?
                        .items
                        .iter()
                        .map(|i| json!(i))
                        .collect())
                },
                |item| {
                    item["sku"]
                        .as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| StepError::permanent(format!("item {item} has no sku")))
                },
                compensatable(
                    "reserve_item",
                    reserve_item,
                    undo("release_item", Effect::Reserved, Effect::Released),
                ),
            )
            .max_concurrency(8),
        )
        .step(
            // A payment provider that is down is waited out by a person rather than refunded
            // and cancelled: at most 5 attempts within 10 s in all, then the saga pauses.
            compensatable(
                CHARGE,
                charge_payment,
                undo("refund_payment", Effect::Charged, Effect::Refunded),
            )
            .retry(action_policy().within(Duration::from_secs(10)))
            .pause_when_exhausted(),
        )
        .step(
            Step::signal("await_approval", APPROVAL)
                .when(|ctx| Ok(ctx.input::<FulfilInput>()?.needs_approval))
                .signal_timeout_from(|ctx| {
                    let timeout = ctx.input::<FulfilInput>()?.approval_timeout_s;
                    Ok(Duration::from_secs(timeout))
                })
                .accept(approve),
        )
        .step(Step::sleep_for("cooling_off", |ctx| {
            Ok(Duration::from_millis(
                ctx.input::<FulfilInput>()?.cooling_off_ms,
            ))
        }))
        .step(
            Step::pivot(SHIP, ship)
                .retry(action_policy())
                .timeout(ATTEMPT_TIMEOUT),
        )
        .step(
            Step::retriable("notify_customer", notify_customer)
                .retry(action_policy().with_unlimited_attempts())
                .timeout(ATTEMPT_TIMEOUT),
        )
        .build()
}

/// `charge_payment`, whose output [`Charge`] later stages may read.
pub const CHARGE: Stage<Charge> = Stage::named("charge_payment");
/// `ship`, whose output [`Shipment`] `notify_customer` reads.
pub const SHIP: Stage<Shipment> = Stage::named("ship");

/// The output of `ship`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shipment {
    /// The carrier's tracking number.
    pub tracking: String,
}

/// Takes the payload of `approval` as the stage's output when it approves; a refusal fails
/// the stage for good, which compensates the order.
fn approve(_: &StepContext, payload: Value) -> Result<Value, StepError> {
    let approval: Approval = serde_json::from_value(payload.clone()).map_err(|e| {
        StepError::permanent(format!(
            "the approval is not {{\"approved\": bool, \"by\": str}}: {e}"
        ))
    })?;
    if approval.approved {
        Ok(payload)
    } else {
        Err(StepError::permanent(format!(
            "not approved by {}",
            approval.by
        )))
    }
}

/// The output of a branch of `reserve_items`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemReservation {
    /// The inventory's reservation id.
    pub reservation_id: String,
    /// The sku.
    pub sku: String,
    /// How many.
    pub qty: i64,
}

async fn reserve_item(ctx: StepContext) -> Result<Value, StepError> {
    let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<FulfilInput>()?);
    let item: Item = ctx.element()?;
    let output = ItemReservation {
        reservation_id: short_id("res", &ctx),
        sku: item.sku.clone(),
        qty: item.qty,
    };
    let call = Call {
        owner: &input.order_id,
        effect: Label::item(Effect::Reserved, &item.sku),
        amount: item.qty,
        refusal: "out of stock",
        output: json!(output),
    };
    act(shop, &ctx, &input.simulate, call).await
}

async fn charge_payment(ctx: StepContext) -> Result<Value, StepError> {
    let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<FulfilInput>()?);
    charge(shop, &ctx, &input.order_id, input.amount, &input.simulate).await
}

async fn ship(ctx: StepContext) -> Result<Value, StepError> {
    let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<FulfilInput>()?);
    let output = Shipment {
        tracking: short_id("trk", &ctx),
    };
    let call = Call {
        owner: &input.order_id,
        effect: Effect::Shipped.into(),
        amount: 0,
        refusal: "the carrier refused the parcel",
        output: json!(output),
    };
    act(shop, &ctx, &input.simulate, call).await
}

async fn notify_customer(ctx: StepContext) -> Result<Value, StepError> {
    let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<FulfilInput>()?);
    let shipment = ctx.output(SHIP)?;
    let call = Call {
        owner: &input.order_id,
        effect: Effect::Notified.into(),
        amount: 0,
        refusal: "the customer cannot be reached",
        output: json!({"to": input.user, "tracking": shipment.tracking}),
    };
    act(shop, &ctx, &input.simulate, call).await
}

/// The compensation `name`, undoing `action_effect` with `undo` (for a branch of
/// `reserve_items`, of its own sku).
fn undo(name: &'static str, action_effect: Effect, undo: Effect) -> impl Compensation {
    move |ctx: StepContext| async move {
        let (shop, input) = (ctx.state::<Shop>()?, ctx.input::<FulfilInput>()?);
        // A branch of `reserve_items` is named by its sku.
        let (action, undo) = match ctx.branch() {
            Some(sku) => (Label::item(action_effect, sku), Label::item(undo, sku)),
            None => (action_effect.into(), undo.into()),
        };
        compensate(
            shop,
            &ctx,
            &input.simulate,
            name,
            &input.order_id,
            action,
            undo,
        )
        .await
    }
}
